-- params: key text, task_id text
-- Points the key at task_id, creating the key row if it is new.
insert into cairnq_task_keys as k (key, task_id, created_at_ms, updated_at_ms)
select :key, :task_id, clock.now_ms, clock.now_ms
  from (select (extract(epoch from now()) * 1000)::bigint as now_ms) as clock
on conflict (key) do update
   set task_id = excluded.task_id,
       updated_at_ms = excluded.updated_at_ms
returning k.key, k.task_id, k.created_at_ms, k.updated_at_ms
