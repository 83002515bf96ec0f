-- params: task_id text
-- A task's recorded steps and sleeps, in run order, with the database's
-- clock (epoch ms) to tell a sleep's wake time against.
select s.seq, s.name, s.kind, s.result, s.wake_at_ms, s.recorded_at_ms, s.done, s.timed_out,
       (extract(epoch from clock_timestamp()) * 1000)::bigint as now_ms
  from waymark_steps s
 where s.task_id = :task_id
 order by s.seq
