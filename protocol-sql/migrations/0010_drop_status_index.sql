-- The (status) index from 0001 is a prefix of 0007's (status, completed_at_ms)
-- and costs a write on every status change; drop it.
drop index if exists cairnq_tasks_status_idx;

update cairnq_meta set value = '10' where key = 'schema_version';
