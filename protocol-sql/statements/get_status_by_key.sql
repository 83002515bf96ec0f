-- params: key text
select t.id, t.status
  from cairnq_task_keys k
  join cairnq_tasks t on t.id = k.task_id
 where k.key = :key
