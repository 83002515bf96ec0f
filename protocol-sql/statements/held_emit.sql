-- params: name text, payload jsonb, keep_ms int8
-- Emits an event, kept for keep_ms; answers how many held tasks it reached.
select waymark_held_emit(:name, :payload, :keep_ms) as reached
