-- params: max_depth int8, queue text
-- Room left under max_depth queued rows (delayed ones count), never negative.
-- The inner limit stops counting once the queue is known to be full.
select greatest(:max_depth - count(*), 0)::bigint as headroom
  from (
        select 1
          from cairnq_tasks
         where queue = :queue
           and status = 'queued'
         limit greatest(:max_depth, 0)
       ) as queued
