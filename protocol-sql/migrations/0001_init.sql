-- cairnq protocol v1, Postgres: the task table, the key table and the meta rows.
-- Times are epoch milliseconds from the database clock. status is a CHECK so
-- that every SDK sees the same five values.
create table if not exists cairnq_tasks (
    id                      text primary key,
    name                    text not null,
    queue                   text not null default 'default',
    status                  text not null
        check (status in ('queued', 'running', 'succeeded', 'failed', 'canceled')),
    payload                 jsonb not null,
    result                  jsonb,
    error                   jsonb,
    metadata                jsonb not null default '{}'::jsonb,
    progress                double precision,
    message                 text,
    attempt                 integer not null default 0,
    max_attempts            integer not null default 3,
    priority                integer not null default 0,
    worker_id               text,
    lease_until_ms          bigint,
    run_at_ms               bigint not null,
    cancel_requested_at_ms  bigint,
    parent_id               text,
    root_id                 text,
    correlation_id          text,
    created_at_ms           bigint not null,
    updated_at_ms           bigint not null,
    completed_at_ms         bigint
);

-- The first claim index; 0008 rebuilds it around run_at_ms.
create index if not exists cairnq_tasks_claim_idx
    on cairnq_tasks (queue, status, priority desc, created_at_ms);
-- Dropped again by 0010 once 0007 made it redundant.
create index if not exists cairnq_tasks_status_idx on cairnq_tasks (status);
create index if not exists cairnq_tasks_name_idx on cairnq_tasks (name);
create index if not exists cairnq_tasks_root_idx on cairnq_tasks (root_id);
create index if not exists cairnq_tasks_correlation_idx on cairnq_tasks (correlation_id);

-- A key names the current task for some business identity; the task row itself
-- stays free of uniqueness rules so that reuse, reject and replace all fit.
create table if not exists cairnq_task_keys (
    key            text primary key,
    task_id        text not null references cairnq_tasks (id) on delete cascade,
    created_at_ms  bigint not null,
    updated_at_ms  bigint not null
);

create table if not exists cairnq_meta (
    key    text primary key,
    value  text not null
);

insert into cairnq_meta (key, value)
values ('protocol_version', '1'), ('schema_version', '1')
on conflict (key) do nothing;
