-- params: results jsonb, ids text[], worker_ids text[]
-- waymark addition: `complete` for many tasks in one statement, each held
-- by its own owner: worker_ids runs beside ids, worker_ids[i] the owner
-- (the claim's worker_id) of ids[i] (a NULL owner owns nothing). Each row
-- is ownership-checked exactly as `complete` checks it, and takes the same
-- branch (a requested cancel wins). One row comes back,
-- naming only the exceptions: `lost`, the ids that settled nothing (their
-- lease was lost), and `canceled`, those a requested cancel settled; every
-- other id of `ids` (a NULL one names no task) succeeded. A row per task
-- would cost both sides a row's output and decode, and the usual answer is
-- two empty arrays.
-- results is a JSON object from task id to that task's result, naming only
-- the results that are not JSON null: a task it does not name succeeds with
-- a JSON null result, as `complete` with a null result would (a batch of
-- handlers that return nothing sends an empty object).
-- The ids reach the update as an array built by a sub-select, whose length
-- the planner cannot see: it finds each row through the primary key
-- whatever the statistics say (protocol-sql/README.md), as it would not a
-- bound array of known length, which a long batch could have planned as a
-- bitmap scan, in the table's physical order. The update checks ownership,
-- the lease and the owner on each row as it takes it (a row another
-- transaction changed meanwhile is checked again on its new version). A
-- first pass that picked the owned rows, when the statistics said none
-- ran, read every running row for it and cost a sixth of the statement's
-- time on the server. It takes no
-- lock pass first either, whose lock records were WAL of their own for every
-- task: the primary key's scan takes the array's ids in index order, so the
-- update locks its rows in id order, as heartbeat_batch does, and the two
-- cannot deadlock (`tests/tests/plans.rs` holds the update to that scan).
-- On a table of a page or two the planner reads the table whole instead,
-- in its physical order; a deadlock with a heartbeat is possible there,
-- and PostgreSQL ends one of the two: the heartbeat is retried, and the
-- worker settles that batch again one task at a time.
-- The owners are hashed once per statement, not searched per row.
with clock as (
    select (extract(epoch from now()) * 1000)::bigint as now_ms
),
owners as (
    select o.id, o.worker_id
      from unnest(:ids, :worker_ids) as o(id, worker_id)
),
settled as (
    update cairnq_tasks as t
       set status = case when t.cancel_requested_at_ms is null then 'succeeded' else 'canceled' end,
           result = case
                        when t.cancel_requested_at_ms is null then coalesce(:results -> t.id, 'null'::jsonb)
                        else t.result
                    end,
           progress = case when t.cancel_requested_at_ms is null then 1.0 else t.progress end,
           lease_until_ms = null,
           completed_at_ms = clock.now_ms,
           updated_at_ms = clock.now_ms
      from clock
     where t.id = any(array(select unnest(:ids)))
       -- `is true`: no index on status serves this test, so the planner
       -- keeps to the primary key however stale its statistics.
       and (t.status = 'running') is true
       and t.lease_until_ms > clock.now_ms
       -- `is true` again: a filter on each row (hashed once), never a join
       -- of the rows with the owners, which would take them in the owners'
       -- order rather than the primary key's.
       and ((t.id, t.worker_id) in (select owners.id, owners.worker_id from owners)) is true
    returning t.id, t.status
)
select array(
           select o.id
             from owners o
            where o.id is not null
              and not exists (select 1 from settled s where s.id = o.id)
       ) as lost,
       array(select s.id from settled s where s.status = 'canceled') as canceled
