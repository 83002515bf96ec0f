-- params: status text, queue text, name text, root_id text, correlation_id text, limit int8, offset int8
-- Each filter is off when its parameter is null; newest first.
select id, name, queue, status, payload, result, error, metadata, progress, message,
       attempt, max_attempts, priority, worker_id, lease_until_ms, run_at_ms,
       cancel_requested_at_ms, parent_id, root_id, correlation_id, created_at_ms,
       updated_at_ms, completed_at_ms
  from cairnq_tasks
 where (:status::text is null or status = :status)
   and (:queue::text is null or queue = :queue)
   and (:name::text is null or name = :name)
   and (:root_id::text is null or root_id = :root_id)
   and (:correlation_id::text is null or correlation_id = :correlation_id)
 order by created_at_ms desc, id desc
 limit :limit offset :offset
