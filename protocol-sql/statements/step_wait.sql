-- params: task_id text, worker_id text, seq int4, event text, timeout_ms int8
-- Begins (or reads again) a run's wait for an event at its place seq,
-- fenced to the lease: a new wait is done at once when the event is kept
-- (emitted within its retention), its payload recorded; else it waits
-- until timeout_ms from now. Run after lock_key on 'waymark_event:' and
-- the event's name, in the transaction that snoozes the task if it waits,
-- so an emit cannot fall between the two. No row back: the lease is lost.
with kept as (
    select e.payload
      from waymark_events e
     where e.name = :event
       and e.expires_at_ms > (extract(epoch from clock_timestamp()) * 1000)::bigint
     order by e.seq desc
     limit 1
), owned as (
    select t.id, t.attempt
      from cairnq_tasks t
     where t.id = :task_id
       and t.status = 'running'
       and t.worker_id = :worker_id
       and t.lease_until_ms > (extract(epoch from clock_timestamp()) * 1000)::bigint
       for share of t
)
insert into waymark_steps as s
       (task_id, seq, name, kind, result, wake_at_ms, event, done, attempt, recorded_at_ms)
select owned.id, :seq, :event, 'wait', (select payload from kept),
       (extract(epoch from clock_timestamp()) * 1000)::bigint + :timeout_ms,
       :event, exists (select 1 from kept), owned.attempt,
       (extract(epoch from clock_timestamp()) * 1000)::bigint
  from owned
on conflict (task_id, seq) do update set recorded_at_ms = s.recorded_at_ms
returning s.seq, s.name, s.kind, s.result, s.wake_at_ms, s.recorded_at_ms, s.done, s.timed_out,
          (extract(epoch from clock_timestamp()) * 1000)::bigint as now_ms
