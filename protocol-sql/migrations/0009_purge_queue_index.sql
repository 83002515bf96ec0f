-- Serves purge filtered to one queue. Partial on the terminal statuses, so live
-- rows (the claim path) never maintain it.
create index if not exists cairnq_tasks_queue_completed_idx
    on cairnq_tasks (queue, completed_at_ms)
    where status in ('succeeded', 'failed', 'canceled');

update cairnq_meta set value = '9' where key = 'schema_version';
