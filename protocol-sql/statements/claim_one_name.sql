-- params: worker_id text, lease_ms int8, queues text[], name text, limit int8
-- claim for a single handler name over several queues.
-- Rows come back in no particular order.
-- Each queue gives its best rows in the claim index's order (locking them,
-- skipping locked ones), and the best `limit` of those are claimed: an
-- index serves every queue's order even when stale statistics say most
-- rows are queued (`queue = any(...)` with one sort over all queues was
-- then planned as a sequential scan of the table). Rows picked in one
-- queue but not claimed stay locked only until this statement's
-- transaction ends. The ids reach the update as one array, so the update
-- finds each row through the primary key (see claim_one_queue.sql).
with clock as (
    select (extract(epoch from clock_timestamp()) * 1000)::bigint as now_ms
)
update cairnq_tasks as t
   set status = 'running',
       worker_id = :worker_id,
       lease_until_ms = clock.now_ms + :lease_ms,
       -- attempt + 1, kept between 1 and the int4 maximum for a row written
       -- out of range by plain SQL (negative, or at the top), which would fail
       -- the whole claim or every later write to it (see README.md)
       attempt = least(greatest(t.attempt, 0), 2147483646) + 1,
       updated_at_ms = clock.now_ms
  from clock
 where t.id = any(array(
           select best.id
             from unnest(:queues) as q(queue)
            cross join lateral (
                  select c.id, c.priority, c.run_at_ms
                    from cairnq_tasks as c
                   where c.queue = q.queue
                     and c.status = 'queued'
                     and c.name = :name
                     and c.run_at_ms <= (select now_ms from clock)
                   order by c.priority desc, c.run_at_ms, c.id
                   limit :limit
                     for update skip locked
            ) as best
            order by best.priority desc, best.run_at_ms, best.id
            limit :limit
       ))
-- Every column but status and worker_id, which the update sets to 'running'
-- and :worker_id: the caller knows them.
returning t.id, t.name, t.queue, t.payload, t.result, t.error, t.metadata,
          t.progress, t.message, t.attempt, t.max_attempts, t.priority,
          t.lease_until_ms, t.run_at_ms, t.cancel_requested_at_ms, t.parent_id,
          t.root_id, t.correlation_id, t.created_at_ms, t.updated_at_ms,
          t.completed_at_ms
