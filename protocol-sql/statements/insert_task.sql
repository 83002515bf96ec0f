-- params: id text, name text, queue text, payload jsonb, metadata jsonb, max_attempts int4, priority int4, delay_ms int8, parent_id text, root_id text, correlation_id text
-- A new queued task, due delay_ms from now by the database clock.
with clock as (
    select (extract(epoch from clock_timestamp()) * 1000)::bigint as now_ms
)
insert into cairnq_tasks (
    id, name, queue, status, payload, metadata, attempt, max_attempts, priority,
    run_at_ms, parent_id, root_id, correlation_id, created_at_ms, updated_at_ms
)
select :id, :name, :queue, 'queued', :payload, :metadata, 0, :max_attempts, :priority,
       clock.now_ms + :delay_ms, :parent_id, :root_id, :correlation_id,
       clock.now_ms, clock.now_ms
  from clock
returning id, name, queue, status, payload, result, error, metadata, progress,
          message, attempt, max_attempts, priority, worker_id, lease_until_ms,
          run_at_ms, cancel_requested_at_ms, parent_id, root_id, correlation_id,
          created_at_ms, updated_at_ms, completed_at_ms
