-- params: rows jsonb
-- Submits held tasks (waymark's ledger; see ledgers/waymark_0001_held_tasks.sql):
-- one row per task, its id and whether it was released at once.
select s.id, s.state from waymark_held_submit(:rows) as s
