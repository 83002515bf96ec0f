-- Serves purge (and list) filtered to one status, in completion order.
create index if not exists cairnq_tasks_status_completed_idx
    on cairnq_tasks (status, completed_at_ms);

update cairnq_meta set value = '7' where key = 'schema_version';
