-- params: queue text, status text, name text, older_than_ms int8, limit int8
-- Deletes up to limit terminal rows completed more than older_than_ms ago,
-- oldest first; keys go with them (on delete cascade). Returns the ids.
-- The literal status list matches the partial index of 0009.
delete from cairnq_tasks
 where id in (
        select id
          from cairnq_tasks
         where status in ('succeeded', 'failed', 'canceled')
           and (:status::text is null or status = :status)
           and (:queue::text is null or queue = :queue)
           and (:name::text is null or name = :name)
           and completed_at_ms < (extract(epoch from now()) * 1000)::bigint - :older_than_ms
         order by completed_at_ms
         limit :limit
           for update skip locked
       )
returning id
