-- params: delay_ms int8, id text, worker_id text
-- waymark addition. Owned write. Gives a running task back without
-- spending its attempt: queued again and due after delay_ms (0 at shutdown,
-- the handler's wait for a snooze), the claim's attempt increment undone,
-- worker, lease, progress and message cleared; error left as it was.
-- A requested cancel wins, as in every settlement: canceled, worker kept.
-- The status change to queued fires cairnq_queued (migration 0003), so
-- another worker can take it at once.
-- Because the attempt is given back, a later claim of the task can carry
-- the same attempt number; only the worker_id tells two claims apart, which
-- is why waymark's worker claims under an id of its own per claim
-- (protocol-sql/README.md, "One claim, one owner").
with clock as (
    select (extract(epoch from now()) * 1000)::bigint as now_ms
)
update cairnq_tasks as t
   set status = case when t.cancel_requested_at_ms is not null then 'canceled' else 'queued' end,
       attempt = case
           when t.cancel_requested_at_ms is not null then t.attempt else greatest(t.attempt - 1, 0)
       end,
       run_at_ms = case
           when t.cancel_requested_at_ms is not null then t.run_at_ms else clock.now_ms + :delay_ms
       end,
       worker_id = case when t.cancel_requested_at_ms is not null then t.worker_id else null end,
       progress = case when t.cancel_requested_at_ms is not null then t.progress else null end,
       message = case when t.cancel_requested_at_ms is not null then t.message else null end,
       lease_until_ms = null,
       completed_at_ms = case when t.cancel_requested_at_ms is not null then clock.now_ms else null end,
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
