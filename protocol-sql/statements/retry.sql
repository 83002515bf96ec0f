-- params: reset_attempt bool, id text
-- A failed or canceled task goes back to the queue, due now, with every trace of
-- its last run cleared. Any other status: no row.
with clock as (
    select (extract(epoch from now()) * 1000)::bigint as now_ms
)
update cairnq_tasks as t
   set status = 'queued',
       attempt = case when :reset_attempt then 0 else t.attempt end,
       run_at_ms = clock.now_ms,
       error = null,
       worker_id = null,
       lease_until_ms = null,
       cancel_requested_at_ms = null,
       completed_at_ms = null,
       progress = null,
       message = null,
       updated_at_ms = clock.now_ms
  from clock
 where t.id = :id
   and t.status in ('failed', 'canceled')
returning t.id, t.name, t.queue, t.status, t.payload, t.result, t.error, t.metadata,
          t.progress, t.message, t.attempt, t.max_attempts, t.priority, t.worker_id,
          t.lease_until_ms, t.run_at_ms, t.cancel_requested_at_ms, t.parent_id,
          t.root_id, t.correlation_id, t.created_at_ms, t.updated_at_ms,
          t.completed_at_ms
