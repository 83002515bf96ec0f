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
returning t.*
