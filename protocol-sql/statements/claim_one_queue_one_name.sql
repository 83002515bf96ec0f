-- params: worker_id text, lease_ms int8, queue text, name text, limit int8
-- claim for one queue and one name: the claim-by-name index serves the order.
-- Rows come back in no particular order.
-- The picked ids reach the update as one array, so the update finds each row
-- through the primary key whatever the table's statistics say (a join on
-- the picked rows could be planned as a hash over the whole table).
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
           select id
             from cairnq_tasks
            where queue = :queue
              and status = 'queued'
              and name = :name
              and run_at_ms <= (select now_ms from clock)
            order by priority desc, run_at_ms, id
            limit :limit
              for update skip locked
       ))
-- Every column but status and worker_id, which the update sets to 'running'
-- and :worker_id: the caller knows them.
returning t.id, t.name, t.queue, t.payload, t.result, t.error, t.metadata,
          t.progress, t.message, t.attempt, t.max_attempts, t.priority,
          t.lease_until_ms, t.run_at_ms, t.cancel_requested_at_ms, t.parent_id,
          t.root_id, t.correlation_id, t.created_at_ms, t.updated_at_ms,
          t.completed_at_ms
