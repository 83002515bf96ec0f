-- Claim order is priority, then due time, then id. Both claim indexes are
-- rebuilt in that order so a claim reads due rows first, straight off the index,
-- instead of stepping over delayed and backing-off rows.
drop index if exists cairnq_tasks_claim_idx;
create index cairnq_tasks_claim_idx
    on cairnq_tasks (queue, status, priority desc, run_at_ms, id);

drop index if exists cairnq_tasks_claim_name_idx;
create index cairnq_tasks_claim_name_idx
    on cairnq_tasks (queue, status, name, priority desc, run_at_ms, id);

update cairnq_meta set value = '8' where key = 'schema_version';
