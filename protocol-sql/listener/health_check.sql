-- Sent now and then on a listening session: a session that cannot answer
-- it in time is treated as lost.
select 1
