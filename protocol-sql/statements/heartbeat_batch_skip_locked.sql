-- params: lease_ms int8, ids text[], worker_id text, worker_ids text[]
-- waymark's per-claim owners: worker_ids, when bound, runs beside ids and
-- names the owner (the claim's worker_id) of each id, worker_id standing in
-- for a NULL element; NULL (what the protocol's callers send) makes
-- worker_id the owner of every id, the protocol's statement exactly. The
-- owner test is written `(...) is true`, so it stays a filter on each row
-- (its set hashed once) and never becomes a join that would take the rows
-- in another order than the primary key's.
-- waymark addition: heartbeat_batch that never waits for a row lock. A row
-- another transaction holds (a settlement or a progress write in flight, a
-- handler's own transaction, an operator's update) is skipped, so one held
-- row cannot hold back the renewal of every other lease in the batch.
-- Answers a row per lease renewed (`renewed` true), and a row per id the
-- worker owned as of the statement's snapshot (`renewed` false), so an id
-- with only the second was not renewed: its row was locked, or changed
-- since the snapshot (settled, its lease run out). The caller renews those
-- again with heartbeat_batch, which waits (under a lock_timeout) and tells
-- which are still owned. An id with no row has lost its lease.
-- cancel_requested_at_ms is each row's own: the renewed version's, or the
-- snapshot's. The two sets are answered one after the other, not joined: a
-- join of the two without an index could compare every pair of rows.
-- The rows renewed are locked in id order, as heartbeat_batch locks them.
-- `for no key update` is the lock the update itself takes (it changes no key
-- column), so a row held only under a key-share lock is renewed, not skipped.
-- Both reads seek the ids in the primary key: their tests of status and
-- lease are written `is true`, which no index serves, so neither reads the
-- status or lease index, which holds every worker's running rows (see
-- heartbeat_batch.sql).
with clock as (
    select (extract(epoch from now()) * 1000)::bigint as now_ms
),
owners as (
    select w.id, coalesce(w.worker_id, :worker_id) as worker_id
      from unnest(:ids, :worker_ids) as w(id, worker_id)
),
owned as materialized (
    select o.id, o.cancel_requested_at_ms
      from cairnq_tasks as o
     where o.id = any(:ids)
       and (o.status = 'running') is true
       and ((o.id, o.worker_id) in (select owners.id, owners.worker_id from owners)) is true
       and (o.lease_until_ms > (select now_ms from clock)) is true
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
                  and (l.status = 'running') is true
                  and ((l.id, l.worker_id) in (select owners.id, owners.worker_id from owners)) is true
                  and (l.lease_until_ms > (select now_ms from clock)) is true
                order by l.id
                  for no key update skip locked
           ))
    returning t.id, t.cancel_requested_at_ms
)
select r.id, r.cancel_requested_at_ms, true as renewed
  from renewed as r
union all
select o.id, o.cancel_requested_at_ms, false as renewed
  from owned as o
