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

-- What an emit reaches besides held tasks (waymark_0001's emit calls it):
-- the waits for the event whose deadline has not passed, of tasks still
-- live; their payload recorded, their snoozed task due now and its queue
-- notified. Answers how many runs it reached.
create or replace function waymark_event_reaches_runs(p_name text, p_payload jsonb, p_now_ms bigint)
returns integer
language plpgsql as $$
declare
    v_runs text[];
    v_queue text;
begin
    with ended as (
        update waymark_steps
           set done = true, result = p_payload
         where event = p_name and not done and kind = 'wait' and wake_at_ms > p_now_ms
           and exists (
               select 1 from cairnq_tasks t
                where t.id = waymark_steps.task_id and t.status in ('queued', 'running'))
        returning task_id
    )
    select coalesce(array_agg(distinct task_id), '{}') into v_runs from ended;
    for v_queue in
        update cairnq_tasks
           set run_at_ms = p_now_ms, updated_at_ms = p_now_ms
         where id = any(v_runs) and status = 'queued'
        returning queue
    loop
        perform pg_notify('cairnq_queued', v_queue);
    end loop;
    return cardinality(v_runs);
end $$;
