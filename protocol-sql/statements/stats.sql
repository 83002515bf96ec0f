-- params: queue text
-- Counts per (queue, status); the caller fills in the statuses with no rows.
select queue, status, count(*)::bigint as count
  from cairnq_tasks
 where (:queue::text is null or queue = :queue)
 group by queue, status
