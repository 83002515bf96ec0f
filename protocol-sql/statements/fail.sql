-- params: retryable bool, error jsonb, delay_ms int8, id text, worker_id text
-- Owned write. The error is kept on every branch. A requested cancel wins;
-- a retryable failure with attempts left goes back to the queue, due after
-- delay_ms; anything else is failed for good. The branch is decided on the
-- locked row itself (not a snapshot read beside it), so a cancel that commits
-- while this statement waits for the row is still honoured.
with clock as (
    select (extract(epoch from now()) * 1000)::bigint as now_ms
)
update cairnq_tasks as t
   set status = case
           when t.cancel_requested_at_ms is not null then 'canceled'
           when :retryable and t.attempt < t.max_attempts then 'queued'
           else 'failed'
       end,
       error = :error,
       run_at_ms = case
           when t.cancel_requested_at_ms is null and :retryable and t.attempt < t.max_attempts
           then clock.now_ms + :delay_ms else t.run_at_ms
       end,
       worker_id = case
           when t.cancel_requested_at_ms is null and :retryable and t.attempt < t.max_attempts
           then null else t.worker_id
       end,
       progress = case
           when t.cancel_requested_at_ms is null and :retryable and t.attempt < t.max_attempts
           then null else t.progress
       end,
       message = case
           when t.cancel_requested_at_ms is null and :retryable and t.attempt < t.max_attempts
           then null else t.message
       end,
       lease_until_ms = null,
       completed_at_ms = case
           when t.cancel_requested_at_ms is null and :retryable and t.attempt < t.max_attempts
           then null else clock.now_ms
       end,
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
