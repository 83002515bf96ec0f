-- params: key text
select key, task_id, created_at_ms, updated_at_ms
  from cairnq_task_keys
 where key = :key
