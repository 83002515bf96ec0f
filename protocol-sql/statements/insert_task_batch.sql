-- params: tasks jsonb
-- waymark addition: insert_task for many tasks in one statement. tasks is a
-- JSON array of objects with the keys of insert_task's parameters (id,
-- name, queue, payload, metadata, max_attempts, priority, delay_ms,
-- parent_id, root_id, correlation_id). Every row is queued and due
-- delay_ms after the one database clock reading; rows come back in no
-- particular order. A JSON null payload stays JSON null, as with insert_task.
with clock as (
    select (extract(epoch from clock_timestamp()) * 1000)::bigint as now_ms
)
insert into cairnq_tasks (
    id, name, queue, status, payload, metadata, attempt, max_attempts, priority,
    run_at_ms, parent_id, root_id, correlation_id, created_at_ms, updated_at_ms
)
select r.id, r.name, r.queue, 'queued', coalesce(r.payload, 'null'::jsonb),
       coalesce(r.metadata, 'null'::jsonb), 0, r.max_attempts, r.priority,
       clock.now_ms + r.delay_ms, r.parent_id, r.root_id, r.correlation_id,
       clock.now_ms, clock.now_ms
  from clock,
       jsonb_to_recordset(:tasks) as r(
           id text, name text, queue text, payload jsonb, metadata jsonb, max_attempts int4,
           priority int4, delay_ms int8, parent_id text, root_id text, correlation_id text
       )
returning *
