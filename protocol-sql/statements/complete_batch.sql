-- params: results jsonb, ids text[], worker_id text, attempts jsonb
-- waymark addition: `complete` for many tasks of one worker in one
-- statement. results is a JSON object from task id to that task's result.
-- Each row is ownership-checked exactly as `complete` checks it, and takes
-- the same branch (a requested cancel wins); an id missing from the rows
-- returned lost its lease. Only id and status come back: the worker needs
-- no more, and a batch of whole rows costs both sides.
-- The owned rows are locked in id order first, as heartbeat_batch locks
-- them, so the two cannot deadlock on tasks they share; the update then
-- finds them through the primary key (see claim.sql), and a row we hold
-- cannot change, so it needs no second ownership check.
-- waymark's optional fence: attempts is a JSON object from task id to the
-- attempt of the claim being settled; a row whose id it names settles only
-- on that claim (see fail.sql). An id it does not name, or a NULL, is
-- checked as `complete` checks it.
with clock as (
    select (extract(epoch from now()) * 1000)::bigint as now_ms
)
update cairnq_tasks as t
   set status = case when t.cancel_requested_at_ms is null then 'succeeded' else 'canceled' end,
       result = case when t.cancel_requested_at_ms is null then :results -> t.id else t.result end,
       progress = case when t.cancel_requested_at_ms is null then 1.0 else t.progress end,
       lease_until_ms = null,
       completed_at_ms = clock.now_ms,
       updated_at_ms = clock.now_ms
  from clock
 where t.id = any(array(
           select id
             from cairnq_tasks
            where id = any(:ids)
              and status = 'running'
              and worker_id = :worker_id
              and lease_until_ms > (select now_ms from clock)
              and ((:attempts::jsonb -> id) is null or attempt = (:attempts::jsonb ->> id)::int4)
            order by id
              for update
       ))
returning t.id, t.status
