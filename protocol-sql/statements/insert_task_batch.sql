-- params: ids text[], names text[], queues text[], payloads jsonb[], metadata jsonb[], max_attempts int4[], priorities int4[], delays_ms int8[], parent_ids text[], root_ids text[], correlation_ids text[]
-- waymark addition: insert_task for many tasks in one statement. Each
-- parameter is an array with one element per task, all of one length, in
-- the order of insert_task's parameters (parent_ids and correlation_ids may
-- hold NULLs; a NULL root_id makes the task its own root, as insert_task's
-- callers do for a top-level task). Every row is queued and due delays_ms
-- after the one database clock reading. Only the count of rows inserted comes back: the caller
-- made the ids and every other value, and rows back cost both sides.
with clock as (
    select (extract(epoch from clock_timestamp()) * 1000)::bigint as now_ms
),
inserted as (
    insert into cairnq_tasks (
        id, name, queue, status, payload, metadata, attempt, max_attempts, priority,
        run_at_ms, parent_id, root_id, correlation_id, created_at_ms, updated_at_ms
    )
    select r.id, r.name, r.queue, 'queued', r.payload, r.metadata, 0, r.max_attempts, r.priority,
           clock.now_ms + r.delay_ms, r.parent_id, coalesce(r.root_id, r.id), r.correlation_id,
           clock.now_ms, clock.now_ms
      from clock,
           unnest(
               :ids, :names, :queues, :payloads, :metadata, :max_attempts, :priorities,
               :delays_ms, :parent_ids, :root_ids, :correlation_ids
           ) as r(
               id, name, queue, payload, metadata, max_attempts, priority,
               delay_ms, parent_id, root_id, correlation_id
           )
    returning 1
)
select count(*) as inserted
  from inserted
