-- params: task_id text, seq int4
-- Closes a wait whose deadline passed, in the locked transaction that saw
-- it pass: an emit after it finds the wait done and leaves it, so every run
-- of the task reads the same answer (timed out).
update waymark_steps
   set done = true, timed_out = true
 where task_id = :task_id and seq = :seq and kind = 'wait' and not done
