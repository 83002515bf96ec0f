-- params: key text
select t.id, t.name, t.queue, t.status, t.payload, t.result, t.error, t.metadata,
       t.progress, t.message, t.attempt, t.max_attempts, t.priority, t.worker_id,
       t.lease_until_ms, t.run_at_ms, t.cancel_requested_at_ms, t.parent_id,
       t.root_id, t.correlation_id, t.created_at_ms, t.updated_at_ms,
       t.completed_at_ms
  from cairnq_task_keys k
  join cairnq_tasks t on t.id = k.task_id
 where k.key = :key
