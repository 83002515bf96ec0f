-- params: id text
-- A queued task is canceled at once; a running one is asked to stop (its worker
-- sees cancel_requested_at_ms and settles it as canceled). Terminal: no row.
with clock as (
    select (extract(epoch from now()) * 1000)::bigint as now_ms
)
update cairnq_tasks as t
   set status = case when t.status = 'queued' then 'canceled' else t.status end,
       cancel_requested_at_ms = case
           when t.status = 'running' then coalesce(t.cancel_requested_at_ms, clock.now_ms)
           else t.cancel_requested_at_ms
       end,
       completed_at_ms = case when t.status = 'queued' then clock.now_ms else t.completed_at_ms end,
       updated_at_ms = clock.now_ms
  from clock
 where t.id = :id
   and t.status in ('queued', 'running')
returning t.id, t.name, t.queue, t.status, t.payload, t.result, t.error, t.metadata,
          t.progress, t.message, t.attempt, t.max_attempts, t.priority, t.worker_id,
          t.lease_until_ms, t.run_at_ms, t.cancel_requested_at_ms, t.parent_id,
          t.root_id, t.correlation_id, t.created_at_ms, t.updated_at_ms,
          t.completed_at_ms
