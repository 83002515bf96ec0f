-- params: lease_ms int8, ids text[], worker_id text
-- One beat for every lease a worker holds. An id missing from the result has
-- lost its lease; cancel_requested_at_ms tells the worker to stop.
-- The owned rows are locked in id order before the update, the order in
-- which complete_batch's update locks them, so two multi-row writes on the
-- same tasks cannot deadlock; a row we hold cannot change, so the update
-- needs no second ownership check.
-- The pick seeks the ids in the primary key: its tests of status and lease
-- are written `is true`, which no index serves, so the planner cannot read
-- the rows through the status or lease index instead. That index holds
-- every running row of every worker, and a pick through it read them all
-- for each beat, the fleet's running rows for one worker's leases.
with clock as (
    select (extract(epoch from now()) * 1000)::bigint as now_ms
)
update cairnq_tasks as t
   set lease_until_ms = clock.now_ms + :lease_ms,
       updated_at_ms = clock.now_ms
  from clock
 where t.id = any(array(
           select id
             from cairnq_tasks
            where id = any(:ids)
              and (status = 'running') is true
              and worker_id = :worker_id
              and (lease_until_ms > (select now_ms from clock)) is true
            order by id
              for update
       ))
returning t.id, t.cancel_requested_at_ms
