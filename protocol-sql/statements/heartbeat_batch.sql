-- params: lease_ms int8, ids text[], worker_id text
-- One beat for every lease a worker holds. An id missing from the result has
-- lost its lease; cancel_requested_at_ms tells the worker to stop.
-- A row another transaction holds locked (this worker's settlement under
-- way, or a handler's own transaction settling it with complete_in) is not
-- waited for: it comes back as still held, as the statement's snapshot
-- shows it, its lease not extended by this beat (the next beat extends it
-- if it is still running). So a heartbeat never waits on a row lock, no
-- write of the worker's can deadlock with it, and one slow settlement
-- cannot hold back the renewal of every other lease.
-- The rows it extends are picked into an array, so the update reaches each
-- through the primary key (see claim.sql).
with clock as (
    select (extract(epoch from now()) * 1000)::bigint as now_ms
),
extended as (
    update cairnq_tasks as t
       set lease_until_ms = clock.now_ms + :lease_ms,
           updated_at_ms = clock.now_ms
      from clock
     where t.id = any(array(
               select id
                 from cairnq_tasks
                where id = any(:ids)
                  and status = 'running'
                  and worker_id = :worker_id
                  and lease_until_ms > (select now_ms from clock)
                  for update skip locked
           ))
    returning t.id, t.cancel_requested_at_ms
)
select e.id, e.cancel_requested_at_ms
  from extended as e
union all
select h.id, h.cancel_requested_at_ms
  from cairnq_tasks as h
 where h.id = any(:ids)
   and h.status = 'running'
   and h.worker_id = :worker_id
   and h.lease_until_ms > (select now_ms from clock)
   -- `not in`, hashed once (ids are never null); `not exists` was planned
   -- as a loop comparing every pair
   and h.id not in (select e.id from extended as e)
