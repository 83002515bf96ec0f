-- Taken by a hub with a leader key before it listens: only the session that
-- holds this session-level lock listens; the others stand by.
-- $1 int8: the leader key.
select pg_try_advisory_lock($1)
