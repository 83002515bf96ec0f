-- Establish the lease invariant on old rows: a lease exists exactly while a task
-- is running.
update cairnq_tasks
   set lease_until_ms = null
 where status <> 'running'
   and lease_until_ms is not null;

update cairnq_meta set value = '5' where key = 'schema_version';
