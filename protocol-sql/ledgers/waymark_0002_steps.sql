-- waymark's ledger of a run's durable steps and sleeps: one row per step a
-- task's handler finished, by the task and the step's place in the run
-- (its seq) and name. A run that comes again (a crash, a lost lease, a
-- retry, the end of a durable sleep) reads them back and goes past what is
-- recorded instead of doing it again; a name that differs from the one
-- recorded at its place fails the run. No cairnq table changes.
create table if not exists waymark_steps (
    task_id         text not null,
    seq             integer not null,
    name            text not null,
    kind            text not null check (kind in ('step', 'sleep')),
    result          jsonb,
    wake_at_ms      bigint,
    attempt         integer not null,
    recorded_at_ms  bigint not null,
    primary key (task_id, seq)
);
create unique index if not exists waymark_steps_name_idx on waymark_steps (task_id, name);
create index if not exists waymark_steps_recorded_idx on waymark_steps (recorded_at_ms);
