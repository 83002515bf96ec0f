-- params: queue text, status text, name text, older_than_ms int8
-- Counts the terminal rows purge would delete with the same filter, all of
-- them (no limit): what `waymark purge` shows before it is told --yes.
select count(*)::bigint as count
  from cairnq_tasks
 where status in ('succeeded', 'failed', 'canceled')
   and (:status::text is null or status = :status)
   and (:queue::text is null or queue = :queue)
   and (:name::text is null or name = :name)
   and completed_at_ms < (extract(epoch from now()) * 1000)::bigint - :older_than_ms
