-- params: id text
-- The cheap probe behind waiting: two columns, no jsonb.
select id, status from cairnq_tasks where id = :id
