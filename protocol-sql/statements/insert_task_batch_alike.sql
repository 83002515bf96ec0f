-- params: ids text[], payloads jsonb[], name text, queue text, metadata jsonb, max_attempts int4, priority int4, delay_ms int8, parent_id text, root_id text, correlation_id text
-- waymark addition: insert_task_batch for a batch whose tasks differ in
-- their id and payload only (a bulk load of one kind, the usual batch).
-- What they share is bound once, as insert_task binds it, instead of as an
-- array holding the same value per task: the server then unpacks two
-- arrays per row rather than eleven, which was about a tenth of the
-- statement's time for 500 tasks. A NULL root_id makes each task its own
-- root. Every row is queued and due delay_ms after the one database clock
-- reading. Only the count of rows inserted comes back, as from
-- insert_task_batch.
with clock as (
    select (extract(epoch from clock_timestamp()) * 1000)::bigint as now_ms
),
inserted as (
    insert into cairnq_tasks (
        id, name, queue, status, payload, metadata, attempt, max_attempts, priority,
        run_at_ms, parent_id, root_id, correlation_id, created_at_ms, updated_at_ms
    )
    select r.id, :name, :queue, 'queued', r.payload, :metadata, 0, :max_attempts, :priority,
           clock.now_ms + :delay_ms, :parent_id, coalesce(:root_id, r.id), :correlation_id,
           clock.now_ms, clock.now_ms
      from clock,
           unnest(:ids, :payloads) as r(id, payload)
    returning 1
)
select count(*) as inserted
  from inserted
