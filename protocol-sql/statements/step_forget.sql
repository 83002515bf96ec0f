-- params: ids text[]
-- Forgets the recorded steps of tasks purged from cairnq_tasks.
delete from waymark_steps where task_id = any(:ids)
