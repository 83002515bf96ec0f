-- params: lease_ms int8, ids text[], worker_id text, worker_ids text[]
-- waymark's per-claim owners: worker_ids, when bound, runs beside ids and
-- names the owner (the claim's worker_id) of each id, worker_id standing in
-- for a NULL element; NULL (what the protocol's callers send) makes
-- worker_id the owner of every id, the protocol's statement exactly. The
-- owner test is written `(...) is true`, so it stays a filter on each row
-- (its set hashed once) and never becomes a join that would take the rows
-- in another order than the primary key's.
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
),
owners as (
    select w.id, coalesce(w.worker_id, :worker_id) as worker_id
      from unnest(:ids, :worker_ids) as w(id, worker_id)
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
              and ((id, worker_id) in (select owners.id, owners.worker_id from owners)) is true
              and (lease_until_ms > (select now_ms from clock)) is true
            order by id
              for update
       ))
returning t.id, t.cancel_requested_at_ms
