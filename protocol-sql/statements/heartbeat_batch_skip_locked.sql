-- params: lease_ms int8, ids text[], worker_id text
-- waymark addition: heartbeat_batch that never waits for a row lock. A row
-- another transaction holds (a settlement or a progress write in flight, a
-- handler's own transaction, an operator's update) is skipped, so one held
-- row cannot hold back the renewal of every other lease in the batch.
-- One row comes back per id the worker still owns as of the statement's
-- snapshot: `renewed` says whether its lease was extended here; false means
-- its row was locked, and the caller renews it again with heartbeat_batch,
-- which waits (under a lock_timeout). An id with no row has lost its lease.
-- `for no key update` is the lock the update itself takes (it changes no key
-- column), so a row held only under a key-share lock is renewed, not skipped.
-- cancel_requested_at_ms is the renewed row's, else the snapshot's.
-- The rows renewed are locked in id order, as heartbeat_batch locks them.
with clock as (
    select (extract(epoch from now()) * 1000)::bigint as now_ms
),
owned as materialized (
    select o.id, o.cancel_requested_at_ms
      from cairnq_tasks as o
     where o.id = any(:ids)
       and o.status = 'running'
       and o.worker_id = :worker_id
       and o.lease_until_ms > (select now_ms from clock)
),
renewed as (
    update cairnq_tasks as t
       set lease_until_ms = clock.now_ms + :lease_ms,
           updated_at_ms = clock.now_ms
      from clock
     where t.id = any(array(
               select l.id
                 from cairnq_tasks as l
                where l.id = any(array(select id from owned))
                  and l.status = 'running'
                  and l.worker_id = :worker_id
                  and l.lease_until_ms > (select now_ms from clock)
                order by l.id
                  for no key update skip locked
           ))
    returning t.id, t.cancel_requested_at_ms
)
select o.id,
       case when r.id is null then o.cancel_requested_at_ms else r.cancel_requested_at_ms end
           as cancel_requested_at_ms,
       r.id is not null as renewed
  from owned as o
  left join renewed as r on r.id = o.id
