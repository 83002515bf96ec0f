-- params: lease_expired_error jsonb
-- Settles every running row whose lease has run out: a requested cancel wins;
-- attempts left -> queued and due now; none left -> failed with the envelope.
-- Rows another transaction holds are skipped; the next pass gets them.
-- The expired ids reach the update as one array (see claim.sql).
with clock as (
    select (extract(epoch from clock_timestamp()) * 1000)::bigint as now_ms
)
update cairnq_tasks as t
   set status = case
           when t.cancel_requested_at_ms is not null then 'canceled'
           when t.attempt < t.max_attempts then 'queued'
           else 'failed'
       end,
       error = case
           when t.cancel_requested_at_ms is null and t.attempt >= t.max_attempts
           then :lease_expired_error else t.error
       end,
       run_at_ms = case
           when t.cancel_requested_at_ms is null and t.attempt < t.max_attempts
           then clock.now_ms else t.run_at_ms
       end,
       worker_id = case
           when t.cancel_requested_at_ms is null and t.attempt < t.max_attempts
           then null else t.worker_id
       end,
       progress = case
           when t.cancel_requested_at_ms is null and t.attempt < t.max_attempts
           then null else t.progress
       end,
       message = case
           when t.cancel_requested_at_ms is null and t.attempt < t.max_attempts
           then null else t.message
       end,
       lease_until_ms = null,
       completed_at_ms = case
           when t.cancel_requested_at_ms is null and t.attempt < t.max_attempts
           then null else clock.now_ms
       end,
       updated_at_ms = clock.now_ms
  from clock
 where t.id = any(array(
           select id
             from cairnq_tasks
            where status = 'running'
              and lease_until_ms is not null
              and lease_until_ms <= (select now_ms from clock)
              for update skip locked
       ))
returning t.id, t.status
