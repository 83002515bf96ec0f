-- Lets the retention sweep walk terminal rows in completion order.
create index if not exists cairnq_tasks_completed_idx on cairnq_tasks (completed_at_ms);

update cairnq_meta set value = '2' where key = 'schema_version';
