-- params: id text
-- One held task with the ids it depends on and whether each has passed.
select h.id, h.flow_id, h.watched, h.name, h.queue, h.state, h.outcome, h.order_key,
       h.order_seq, h.turn, h.deps_left, h.waits_event, h.event_name,
       h.event_deadline_ms, h.on_deadline, h.created_at_ms, h.released_at_ms,
       h.done_at_ms,
       coalesce(array(select d.dep_id from waymark_held_deps d
                       where d.task_id = h.id order by d.dep_id), '{}') as after,
       coalesce(array(select d.dep_id from waymark_held_deps d
                       where d.task_id = h.id and not d.satisfied order by d.dep_id), '{}') as waiting_on
  from waymark_held h
 where h.id = :id
