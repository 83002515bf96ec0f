-- params: task_id text, worker_id text, seq int4, name text, kind text, result jsonb, sleep_ms int8
-- Records one step (or a sleep, waking sleep_ms from now) of a running task,
-- fenced like every owned write: only while the claim named by worker_id
-- holds the task, whose row it holds shared until it commits (a lease
-- recovery cannot fall between the check and the commit). No row back: the
-- lease is lost.
insert into waymark_steps (task_id, seq, name, kind, result, wake_at_ms, attempt, recorded_at_ms)
select t.id, :seq, :name, :kind, :result,
       case when :kind = 'sleep'
            then (extract(epoch from clock_timestamp()) * 1000)::bigint + :sleep_ms end,
       t.attempt, (extract(epoch from clock_timestamp()) * 1000)::bigint
  from cairnq_tasks t
 where t.id = :task_id
   and t.status = 'running'
   and t.worker_id = :worker_id
   and t.lease_until_ms > (extract(epoch from clock_timestamp()) * 1000)::bigint
   for share of t
on conflict (task_id, seq) do nothing
returning seq, name, kind, result, wake_at_ms, recorded_at_ms, done, timed_out,
          (extract(epoch from clock_timestamp()) * 1000)::bigint as now_ms
