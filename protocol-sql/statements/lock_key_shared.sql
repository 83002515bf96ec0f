-- params: key text
-- The shared form of lock_key: holders of it do not wait for each other,
-- only for a holder of lock_key on the same key (a run's wait for an event
-- takes it; emit takes the exclusive lock). Released at commit or rollback.
-- The void result carries nothing and is not decoded.
select pg_advisory_xact_lock_shared(hashtextextended(:key, 0))
