-- params: lease_ms int8, ids text[], worker_id text
-- One beat for every lease a worker holds. Rows are locked in id order so that
-- two multi-row writes on the same tasks cannot deadlock. An id missing from the
-- result has lost its lease; cancel_requested_at_ms tells the worker to stop.
with clock as (
    select (extract(epoch from now()) * 1000)::bigint as now_ms
),
owned as (
    select id
      from cairnq_tasks
     where id = any(:ids)
       and status = 'running'
       and worker_id = :worker_id
       and lease_until_ms > (select now_ms from clock)
     order by id
       for update
)
update cairnq_tasks as t
   set lease_until_ms = clock.now_ms + :lease_ms,
       updated_at_ms = clock.now_ms
  from owned, clock
 where t.id = owned.id
returning t.id, t.cancel_requested_at_ms
