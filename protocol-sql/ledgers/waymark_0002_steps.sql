-- waymark's ledger of a run's durable steps, sleeps and waits for an event:
-- one row per step a task's handler finished (a wait: per wait begun, done
-- once its event came), by the task and the step's place in the run
-- (its seq) and name. A run that comes again (a crash, a lost lease, a
-- retry, the end of a durable sleep) reads them back and goes past what is
-- recorded instead of doing it again; a name that differs from the one
-- recorded at its place fails the run. No cairnq table changes.
create table if not exists waymark_steps (
    task_id         text not null,
    seq             integer not null,
    name            text not null,
    kind            text not null check (kind in ('step', 'sleep', 'wait')),
    result          jsonb,
    -- A sleep's end; a wait's deadline.
    wake_at_ms      bigint,
    -- A wait's event, and whether it came (its payload in result).
    event           text,
    done            boolean not null default true,
    -- A wait closed by its deadline rather than its event.
    timed_out       boolean not null default false,
    attempt         integer not null,
    recorded_at_ms  bigint not null,
    primary key (task_id, seq)
);
create unique index if not exists waymark_steps_name_idx on waymark_steps (task_id, name);
create index if not exists waymark_steps_recorded_idx on waymark_steps (recorded_at_ms);
create index if not exists waymark_steps_waiting_idx on waymark_steps (event) where not done;

-- emit, again: it also ends the waits for the event whose deadline has not
-- passed (their payload recorded, their snoozed task due now and its queue
-- notified), besides what waymark_0001 made it do.
create or replace function waymark_held_emit(p_name text, p_payload jsonb, p_keep_ms bigint)
returns integer
language plpgsql as $$
declare
    now_ms bigint;
    v_woke text[];
    v_runs text[];
    v_queue text;
begin
    perform pg_advisory_xact_lock(hashtextextended('waymark_event:' || p_name, 0));
    -- The clock after the lock: a wait whose deadline passed while this
    -- waited for it was answered "timed out" by then.
    now_ms := waymark_now_ms();
    insert into waymark_events (name, payload, emitted_at_ms, expires_at_ms)
    values (p_name, p_payload, now_ms, now_ms + p_keep_ms);
    with woke as (
        update waymark_held
           set event_name = null, event_payload = p_payload, event_at_ms = now_ms
         where event_name = p_name and state = 'held'
        returning id
    )
    select coalesce(array_agg(id order by id), '{}') into v_woke from woke;
    perform waymark_held_release(v_woke);
    with ended as (
        update waymark_steps
           set done = true, result = p_payload
         where event = p_name and not done and kind = 'wait' and wake_at_ms > now_ms
           and exists (
               select 1 from cairnq_tasks t
                where t.id = waymark_steps.task_id and t.status in ('queued', 'running'))
        returning task_id
    )
    select coalesce(array_agg(distinct task_id), '{}') into v_runs from ended;
    for v_queue in
        update cairnq_tasks
           set run_at_ms = now_ms, updated_at_ms = now_ms
         where id = any(v_runs) and status = 'queued'
        returning queue
    loop
        perform pg_notify('cairnq_queued', v_queue);
    end loop;
    return cardinality(v_woke) + cardinality(v_runs);
end $$;
