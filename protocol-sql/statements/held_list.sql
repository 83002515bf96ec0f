-- params: id text, state text, order_key text, flow_id text, limit int8
-- Held-ledger rows, newest first, filtered by id, state, key and flow (each
-- optional), with the ids each depends on and those it still waits for.
select h.id, h.flow_id, h.watched, h.name, h.queue, h.state, h.outcome, h.order_key,
       h.order_seq, h.turn, h.deps_left, h.waits_event, h.event_name,
       h.event_deadline_ms, h.on_deadline, h.created_at_ms, h.released_at_ms,
       h.done_at_ms,
       coalesce(array(select d.dep_id from waymark_held_deps d
                       where d.task_id = h.id order by d.dep_id), '{}') as after,
       coalesce(array(select d.dep_id from waymark_held_deps d
                       where d.task_id = h.id and not d.satisfied order by d.dep_id), '{}') as waiting_on
  from waymark_held h
 where (:id::text is null or h.id = :id)
   and (:state::text is null or h.state = :state)
   and (:order_key::text is null or h.order_key = :order_key)
   and (:flow_id::text is null or h.flow_id = :flow_id)
 order by h.created_at_ms desc, h.id desc
 limit :limit
