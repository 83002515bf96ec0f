-- params: progress float8, message text, id text, worker_id text
-- Owned write; a null leaves that field as it is.
with clock as (
    select (extract(epoch from now()) * 1000)::bigint as now_ms
)
update cairnq_tasks as t
   set progress = coalesce(:progress, t.progress),
       message = coalesce(:message, t.message),
       updated_at_ms = clock.now_ms
  from clock
 where t.id = :id
   and t.status = 'running'
   and t.worker_id = :worker_id
   and t.lease_until_ms > clock.now_ms
returning t.id, t.name, t.queue, t.status, t.payload, t.result, t.error, t.metadata,
          t.progress, t.message, t.attempt, t.max_attempts, t.priority, t.worker_id,
          t.lease_until_ms, t.run_at_ms, t.cancel_requested_at_ms, t.parent_id,
          t.root_id, t.correlation_id, t.created_at_ms, t.updated_at_ms,
          t.completed_at_ms
