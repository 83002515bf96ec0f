-- waymark's ledgers, beside cairnq's tables and never in them: held tasks,
-- the order of keys, and events. A held task waits here for its turn in its
-- key, for the tasks it depends on and for its event; the transaction that
-- makes the last of these true inserts it into cairnq_tasks as an ordinary
-- queued task (waymark_held_release). cairnq's tables, indexes, trigger and
-- schema_version are untouched: other SDKs see released tasks only.
--
-- Times are epoch milliseconds from the database clock. Errors that name bad
-- input are raised with SQLSTATE WM400, which the store reports as an invalid
-- argument.

-- One row per task submitted as held (and one per plain task a held task
-- depends on: `watched`, whose end the sweep follows).
--   state held: waiting, not in cairnq_tasks;
--   released: in cairnq_tasks, its end not yet passed on;
--   done: its end passed on (outcome succeeded, failed, canceled, missing:
--         the row was gone; skipped or dropped: by an operator);
--   canceled: canceled while held (outcome dependency, deadline, operator).
create table if not exists waymark_held (
    id                 text primary key,
    flow_id            text,
    watched            boolean not null default false,
    name               text not null,
    queue              text not null,
    payload            jsonb not null,
    metadata           jsonb not null,
    max_attempts       integer not null,
    priority           integer not null,
    delay_ms           bigint not null,
    parent_id          text,
    root_id            text,
    correlation_id     text,
    state              text not null
        check (state in ('held', 'released', 'done', 'canceled')),
    outcome            text,
    order_key          text,
    order_seq          bigint,
    turn               boolean not null,
    deps_left          integer not null,
    waits_event        text,
    event_name         text,
    event_deadline_ms  bigint,
    on_deadline        text check (on_deadline in ('release', 'cancel')),
    event_payload      jsonb,
    event_at_ms        bigint,
    created_at_ms      bigint not null,
    released_at_ms     bigint,
    done_at_ms         bigint
);

create index if not exists waymark_held_key_idx
    on waymark_held (order_key, order_seq) where order_key is not null;
create index if not exists waymark_held_event_idx
    on waymark_held (event_name) where state = 'held' and event_name is not null;
create index if not exists waymark_held_deadline_idx
    on waymark_held (event_deadline_ms)
    where state = 'held' and event_name is not null and event_deadline_ms is not null;
create index if not exists waymark_held_open_idx
    on waymark_held (id)
    where state = 'released' or (state = 'done' and outcome in ('failed', 'canceled', 'missing'));
create index if not exists waymark_held_waiting_idx
    on waymark_held (created_at_ms) where state = 'held';
create index if not exists waymark_held_flow_idx
    on waymark_held (flow_id) where flow_id is not null;
create index if not exists waymark_held_done_idx
    on waymark_held (done_at_ms) where state in ('done', 'canceled');

-- task_id waits for dep_id to succeed.
create table if not exists waymark_held_deps (
    task_id    text not null references waymark_held (id) on delete cascade,
    dep_id     text not null,
    satisfied  boolean not null default false,
    primary key (task_id, dep_id)
);
create index if not exists waymark_held_deps_dep_idx on waymark_held_deps (dep_id);

-- A key's sequence (last_seq) and the seq whose turn it is (head_seq; null
-- while the key holds nothing). Submits take the row lock, so a key's order
-- is the order its submits commit in.
create table if not exists waymark_order_keys (
    key            text primary key,
    last_seq       bigint not null,
    head_seq       bigint,
    updated_at_ms  bigint not null
);

-- Events, kept until expires_at_ms so that a task held for one after it was
-- emitted still finds it.
create table if not exists waymark_events (
    seq            bigserial primary key,
    name           text not null,
    payload        jsonb not null,
    emitted_at_ms  bigint not null,
    expires_at_ms  bigint not null
);
create index if not exists waymark_events_name_idx on waymark_events (name, seq desc);
create index if not exists waymark_events_expiry_idx on waymark_events (expires_at_ms);

create or replace function waymark_now_ms() returns bigint
language sql volatile as $$
    select (extract(epoch from clock_timestamp()) * 1000)::bigint
$$;

-- What a released task's metadata carries: its own, plus `waymark_held`
-- (how a waymark worker knows to pass the task's end on in its settlement's
-- transaction) and `waymark_event` (the event it was held for). Metadata
-- that is not an object is kept as it is.
create or replace function waymark_held_metadata(
    meta jsonb, waits text, payload jsonb, at_ms bigint
) returns jsonb
language sql immutable as $$
    select case
        when jsonb_typeof(meta) <> 'object' then meta
        when waits is null then meta || jsonb_build_object('waymark_held', true)
        when at_ms is null then meta || jsonb_build_object(
            'waymark_held', true,
            'waymark_event', jsonb_build_object('name', waits, 'timed_out', true))
        else meta || jsonb_build_object(
            'waymark_held', true,
            'waymark_event', jsonb_build_object('name', waits, 'payload', payload))
    end
$$;

-- Releases those of p_ids that are held and free to go: their turn, no
-- dependency left, no event awaited. Answers the ids released. A row of
-- cairnq_tasks that already has such an id (written there by hand) is left
-- as it is, and the ledger follows that row's end.
create or replace function waymark_held_release(p_ids text[]) returns setof text
language plpgsql as $$
declare
    now_ms bigint := waymark_now_ms();
begin
    return query
    with ready as (
        select h.id
          from waymark_held h
         where h.id = any(p_ids) and h.state = 'held'
           and h.turn and h.deps_left = 0 and h.event_name is null
         order by h.id
           for update
    ), moved as (
        update waymark_held h
           set state = 'released', released_at_ms = now_ms
         where h.id = any(array(select id from ready))
        returning h.*
    )
    insert into cairnq_tasks as t (
        id, name, queue, status, payload, metadata, attempt, max_attempts,
        priority, run_at_ms, parent_id, root_id, correlation_id,
        created_at_ms, updated_at_ms)
    select m.id, m.name, m.queue, 'queued', m.payload,
           waymark_held_metadata(m.metadata, m.waits_event, m.event_payload, m.event_at_ms),
           0, m.max_attempts, m.priority, now_ms + m.delay_ms, m.parent_id,
           coalesce(m.root_id, m.id), m.correlation_id, now_ms, now_ms
      from moved m
        on conflict (id) do nothing
    returning t.id;
end $$;

-- The task of p_key at p_seq ended: if it held the key's turn, the turn
-- passes to the key's next held task, which is released if nothing else
-- holds it.
create or replace function waymark_held_next_turn(p_key text, p_seq bigint) returns void
language plpgsql as $$
declare
    v_next text;
    v_seq bigint;
begin
    perform 1 from waymark_order_keys where key = p_key and head_seq = p_seq for update;
    if not found then
        return;
    end if;
    select h.id, h.order_seq into v_next, v_seq
      from waymark_held h
     where h.order_key = p_key and h.state = 'held' and h.order_seq > p_seq
     order by h.order_seq
     limit 1
       for update;
    update waymark_order_keys
       set head_seq = v_seq, updated_at_ms = waymark_now_ms()
     where key = p_key;
    if v_next is not null then
        update waymark_held set turn = true where id = v_next;
        perform waymark_held_release(array[v_next]);
    end if;
end $$;

-- p_ids succeeded (or were skipped): their dependents count one
-- dependency fewer each, and each key whose turn one of them held moves on
-- to its next held task; what that frees is released. Set-based: one pass
-- for a whole settlement batch.
create or replace function waymark_held_pass(p_ids text[]) returns void
language plpgsql as $$
declare
    v_ready text[];
    v_turns text[];
    v_keys text[];
    v_seqs bigint[];
begin
    with sat as (
        update waymark_held_deps d
           set satisfied = true
         where d.dep_id = any(p_ids) and not d.satisfied
        returning d.task_id
    ), per_task as (
        select task_id, count(*)::integer as n from sat group by task_id
    ), counted as (
        update waymark_held h
           set deps_left = h.deps_left - (select p.n from per_task p where p.task_id = h.id)
         where h.id = any(array(select task_id from per_task)) and h.state = 'held'
        returning h.id
    )
    select coalesce(array_agg(id), '{}') into v_ready from counted;
    -- The keys whose turn one of p_ids held, locked in key order, in a
    -- statement of their own: the next task of each is looked for after,
    -- on a fresh snapshot, so a submit to the key that committed while
    -- this waited for the key's lock is seen.
    with ended as (
        select h.order_key as key, h.order_seq as seq
          from waymark_held h
         where h.id = any(p_ids) and h.order_key is not null
    ), locked as (
        select k.key, e.seq
          from waymark_order_keys k
          join ended e on e.key = k.key and k.head_seq = e.seq
         where k.key = any(array(select key from ended))
         order by k.key
           for update of k
    )
    select coalesce(array_agg(key order by key), '{}'), coalesce(array_agg(seq order by key), '{}')
      into v_keys, v_seqs
      from locked;
    if cardinality(v_keys) = 0 then
        perform waymark_held_release(v_ready);
        return;
    end if;
    -- Each key's next held task, locked: one canceled, skipped or released
    -- meanwhile fails the lock's re-check and the one after it is taken.
    with nxt as (
        select u.key, n.id, n.order_seq
          from unnest(v_keys, v_seqs) as u(key, seq)
          left join lateral (
              select h.id, h.order_seq from waymark_held h
               where h.order_key = u.key and h.state = 'held' and h.order_seq > u.seq
               order by h.order_seq
               limit 1
                 for update
          ) n on true
    ), moved as (
        update waymark_order_keys k
           set head_seq = nxt.order_seq, updated_at_ms = waymark_now_ms()
          from nxt
         where k.key = any(v_keys) and k.key = nxt.key
        returning k.key
    ), turned as (
        update waymark_held h
           set turn = true
         where h.id = any(array(select id from nxt where id is not null))
           and exists (select 1 from moved)
        returning h.id
    )
    select coalesce(array_agg(id), '{}') into v_turns from turned;
    perform waymark_held_release(v_ready || v_turns);
end $$;

-- Cancels the held tasks of p_ids, and, through them, every held task that
-- depends on one (outcome p_reason for the named ones, dependency for the
-- rest); a canceled task's key moves on past it. Answers the ids canceled.
create or replace function waymark_held_cancel(p_ids text[], p_reason text) returns setof text
language plpgsql as $$
declare
    r record;
    now_ms bigint := waymark_now_ms();
    v_level text[] := p_ids;
    v_reason text := p_reason;
    v_canceled text[];
begin
    -- One level at a time, each locked before its dependents are read (in
    -- a statement of their own): a task added after one of them by a
    -- submit that commits while this waits is reached too.
    while cardinality(v_level) > 0 loop
        v_canceled := '{}';
        for r in
            update waymark_held h
               set state = 'canceled', outcome = v_reason, done_at_ms = now_ms
             where h.id = any(v_level) and h.state = 'held'
            returning h.id, h.order_key, h.order_seq
        loop
            return next r.id;
            v_canceled := v_canceled || r.id;
            if r.order_key is not null then
                perform waymark_held_next_turn(r.order_key, r.order_seq);
            end if;
        end loop;
        select coalesce(array_agg(distinct d.task_id order by d.task_id), '{}') into v_level
          from waymark_held_deps d
         where d.dep_id = any(v_canceled);
        v_reason := 'dependency';
    end loop;
end $$;

-- The held tasks that wait on p_ids, which ended without success: canceled,
-- with everything held behind them.
create or replace function waymark_held_cancel_dependents(p_ids text[]) returns void
language plpgsql as $$
declare
    v_ids text[];
begin
    select coalesce(array_agg(distinct d.task_id), '{}') into v_ids
      from waymark_held_deps d
     where d.dep_id = any(p_ids);
    perform waymark_held_cancel(v_ids, 'dependency');
end $$;

-- Passes on the end of each task of p_ids whose cairnq row has ended (or is
-- gone): a success releases what waited for it; a failure or a cancel
-- cancels what depended on it and holds its key until an operator skips,
-- drops or retries it. A row still queued or running is left as it is.
-- Runs in the transaction of the settlement it follows, set-based for its
-- whole batch. Answers how many ends it passed on.
create or replace function waymark_held_settled(p_ids text[]) returns integer
language plpgsql as $$
declare
    v_passed text[];
    v_failed text[];
begin
    with picked as (
        select h.id, h.state, (select t.status from cairnq_tasks t where t.id = h.id) as status
          from waymark_held h
         where h.id = any(p_ids)
           and (h.state = 'released'
                or (h.state = 'done' and h.outcome in ('failed', 'canceled', 'missing')))
         order by h.id
           for update of h
    ), ended as (
        -- A released row that ended; an ended one only when a retry made
        -- it succeed after all.
        select id, state, coalesce(status, 'missing') as outcome
          from picked
         where (state = 'released' and (status is null or status in ('succeeded', 'failed', 'canceled')))
            or (state = 'done' and status = 'succeeded')
    ), moved as (
        update waymark_held h
           set state = 'done', outcome = e.outcome, done_at_ms = waymark_now_ms()
          from ended e
         where h.id = e.id
        returning h.id, e.outcome, e.state as was
    )
    select coalesce(array_agg(id) filter (where outcome = 'succeeded'), '{}'),
           coalesce(array_agg(id) filter (where outcome <> 'succeeded' and was = 'released'), '{}')
      into v_passed, v_failed
      from moved;
    if cardinality(v_passed) > 0 then
        perform waymark_held_pass(v_passed);
    end if;
    if cardinality(v_failed) > 0 then
        perform waymark_held_cancel_dependents(v_failed);
    end if;
    return cardinality(v_passed) + cardinality(v_failed);
end $$;

-- The runs an emit of p_name reaches besides held tasks (their waits ended,
-- their tasks made due), counted. None here: waymark_0002 replaces this
-- with its waits for events.
create or replace function waymark_event_reaches_runs(p_name text, p_payload jsonb, p_now_ms bigint)
returns integer
language sql as $$
    select 0
$$;

-- An event: kept for p_keep_ms, and the held tasks waiting for it get its
-- payload and are released if nothing else holds them, as are the runs
-- waiting for it (waymark_event_reaches_runs). Answers how many waiting
-- tasks and runs it reached.
create or replace function waymark_held_emit(p_name text, p_payload jsonb, p_keep_ms bigint)
returns integer
language plpgsql as $$
declare
    now_ms bigint;
    v_woke text[];
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
    return cardinality(v_woke) + waymark_event_reaches_runs(p_name, p_payload, now_ms);
end $$;

-- An operator's hand on one task: release (a held task goes now, whatever
-- it waits for), skip (a held task, or an ended head that holds its key,
-- counts as succeeded for those that wait on it) or drop (a held task is
-- canceled with what waits on it; an ended head lets its key move on).
-- Answers the state it leaves the task in.
create or replace function waymark_held_operate(p_id text, p_action text) returns text
language plpgsql as $$
declare
    r record;
begin
    select h.state, h.outcome, h.order_key, h.order_seq into r
      from waymark_held h where h.id = p_id for update;
    if not found then
        raise exception 'no held task %', p_id using errcode = 'WM404';
    end if;
    if r.state = 'held' then
        if p_action = 'release' then
            -- An event not received is not claimed in the metadata.
            update waymark_held
               set turn = true, deps_left = 0, event_name = null,
                   waits_event = case when event_name is null then waits_event end
             where id = p_id;
            perform waymark_held_release(array[p_id]);
            return 'released';
        elsif p_action = 'skip' then
            update waymark_held
               set state = 'done', outcome = 'skipped', done_at_ms = waymark_now_ms()
             where id = p_id;
            perform waymark_held_pass(array[p_id]);
            return 'done';
        elsif p_action = 'drop' then
            perform waymark_held_cancel(array[p_id], 'operator');
            return 'canceled';
        end if;
    elsif r.state = 'done' and r.outcome in ('failed', 'canceled', 'missing')
          and p_action in ('skip', 'drop') then
        update waymark_held
           set outcome = case when p_action = 'skip' then 'skipped' else 'dropped' end
         where id = p_id;
        if p_action = 'skip' then
            perform waymark_held_pass(array[p_id]);
        elsif r.order_key is not null then
            perform waymark_held_next_turn(r.order_key, r.order_seq);
        end if;
        return 'done';
    end if;
    raise exception 'task % is % (%): % applies to a held task, or to an ended one that holds its key',
        p_id, r.state, coalesce(r.outcome, 'waiting'), p_action using errcode = 'WM400';
end $$;

-- Upkeep, bounded by p_limit per part: passes on the ends that no
-- settlement passed on (tasks settled by other SDKs or by plain SQL, leases
-- that expired for good, plain tasks a held task depends on), applies event
-- deadlines, and forgets expired events. Answers the counts.
create or replace function waymark_held_sweep(p_limit integer) returns jsonb
language plpgsql as $$
declare
    now_ms bigint := waymark_now_ms();
    v_ended text[];
    v_settled integer;
    v_deadlines integer := 0;
    v_events integer;
    v_failed integer := 0;
    v_id text;
    r record;
begin
    -- Released rows whose cairnq row has ended (or is gone), and ended ones
    -- a retry made succeed; each cairnq row looked up by its key, rows
    -- another sweep holds skipped.
    select coalesce(array_agg(x.id order by x.id), '{}') into v_ended
      from (
        select h.id
          from waymark_held h
         where (h.state = 'released'
                or (h.state = 'done' and h.outcome in ('failed', 'canceled', 'missing')))
           and (case when h.state = 'released'
                     then coalesce((select t.status from cairnq_tasks t where t.id = h.id), 'gone')
                          in ('succeeded', 'failed', 'canceled', 'gone')
                     else (select t.status from cairnq_tasks t where t.id = h.id) = 'succeeded'
                end)
         limit p_limit
           for update skip locked
      ) x;
    begin
        v_settled := waymark_held_settled(v_ended);
    exception when others then
        -- One row's failure (a release refused) must not stop the rest:
        -- each on its own, the failing ones left for the next pass.
        v_settled := 0;
        foreach v_id in array v_ended loop
            begin
                v_settled := v_settled + waymark_held_settled(array[v_id]);
            exception when others then
                v_failed := v_failed + 1;
                raise warning 'waymark held sweep: passing on the end of % failed: %', v_id, sqlerrm;
            end;
        end loop;
    end;
    for r in
        select h.id, h.on_deadline
          from waymark_held h
         where h.state = 'held' and h.event_name is not null and h.event_deadline_ms <= now_ms
         order by h.event_deadline_ms, h.id
         limit p_limit
           for update skip locked
    loop
        if r.on_deadline = 'release' then
            update waymark_held set event_name = null where id = r.id;
            perform waymark_held_release(array[r.id]);
        else
            perform waymark_held_cancel(array[r.id], 'deadline');
        end if;
        v_deadlines := v_deadlines + 1;
    end loop;
    delete from waymark_events
     where seq in (select seq from waymark_events where expires_at_ms <= now_ms limit p_limit);
    get diagnostics v_events = row_count;
    return jsonb_build_object(
        'settled', v_settled, 'deadlines', v_deadlines, 'events_expired', v_events,
        'failed', v_failed);
end $$;

-- Submits held tasks: p_rows is a JSON array of objects (id, flow_id, name,
-- queue, payload, metadata, max_attempts, priority, delay_ms, parent_id,
-- root_id, correlation_id, order_key, after: [ids], event, deadline_ms,
-- on_deadline), each after the rows it depends on. A dependency names a row
-- before it, a held task, or a task of cairnq_tasks; one that ended without
-- success, or that exists nowhere, refuses the whole call. Locks, in this
-- order: the events (in name order, shared: submits do not wait for each
-- other, only for an emit), the dependencies' ledger rows, the keys (in
-- key order). Answers each row's id and state (held or released).
create or replace function waymark_held_submit(p_rows jsonb)
returns table (id text, state text)
language plpgsql as $$
declare
    now_ms bigint := waymark_now_ms();
    r jsonb;
    v_id text;
    v_dep text;
    v_deps text[];
    v_left integer;
    v_dep_row record;
    v_status text;
    v_key text;
    v_seq bigint;
    v_head bigint;
    v_event text;
    v_ev_payload jsonb;
    v_ev_at bigint;
    v_ids text[] := '{}';
    v_released text[];
begin
    if jsonb_typeof(p_rows) <> 'array' then
        raise exception 'held tasks must be a JSON array' using errcode = 'WM400';
    end if;
    -- Events first (as emit takes them), then dependencies, then keys.
    for v_event in
        select distinct x.value->>'event'
          from jsonb_array_elements(p_rows) x
         where x.value->>'event' is not null
         order by 1
    loop
        perform pg_advisory_xact_lock_shared(hashtextextended('waymark_event:' || v_event, 0));
    end loop;

    -- The plain tasks named as dependencies, and the ledger rows of every
    -- dependency from outside this call, locked before any key.
    for v_dep in
        select distinct d.value
          from jsonb_array_elements(p_rows) x,
               jsonb_array_elements_text(coalesce(x.value->'after', '[]')) d
         where not exists (
             select 1 from jsonb_array_elements(p_rows) y where y.value->>'id' = d.value)
         order by d.value
    loop
        if not exists (select 1 from waymark_held h where h.id = v_dep) then
            select t.status into v_status from cairnq_tasks t where t.id = v_dep;
            if not found then
                raise exception 'task % depends on %, which is in neither cairnq_tasks nor the held ledger of this database',
                    (select x.value->>'id' from jsonb_array_elements(p_rows) x
                      where x.value->'after' ? v_dep limit 1), v_dep
                    using errcode = 'WM400';
            end if;
            if v_status in ('queued', 'running') then
                insert into waymark_held (
                    id, watched, name, queue, payload, metadata, max_attempts, priority,
                    delay_ms, state, turn, deps_left, created_at_ms, released_at_ms)
                select t.id, true, t.name, t.queue, '{}'::jsonb, '{}'::jsonb, t.max_attempts,
                       t.priority, 0, 'released', true, 0, now_ms, now_ms
                  from cairnq_tasks t where t.id = v_dep
                on conflict do nothing;
            end if;
        end if;
        perform 1 from waymark_held h where h.id = v_dep for share;
    end loop;
    -- Keys, in key order: each submit of a key waits for the one before it
    -- to commit, so a key's order is its commit order.
    insert into waymark_order_keys as k (key, last_seq, head_seq, updated_at_ms)
    select distinct x.value->>'order_key', 0, null::bigint, now_ms
      from jsonb_array_elements(p_rows) x
     where x.value->>'order_key' is not null
     order by 1
    on conflict (key) do update set updated_at_ms = excluded.updated_at_ms;
    for r in select x.value from jsonb_array_elements(p_rows) x loop
        v_id := r->>'id';
        if exists (select 1 from cairnq_tasks t where t.id = v_id)
           or exists (select 1 from waymark_held h where h.id = v_id) then
            raise exception 'task id % is taken', v_id using errcode = 'WM400';
        end if;
        v_deps := array(select distinct jsonb_array_elements_text(coalesce(r->'after', '[]')));
        v_left := 0;
        foreach v_dep in array v_deps loop
            select h.state, h.outcome into v_dep_row from waymark_held h where h.id = v_dep;
            if found then
                if v_dep_row.state in ('held', 'released') then
                    v_left := v_left + 1;
                elsif not (v_dep_row.state = 'done' and v_dep_row.outcome in ('succeeded', 'skipped')) then
                    raise exception 'task % depends on %, which has ended % (%): it would never run',
                        v_id, v_dep, v_dep_row.state, v_dep_row.outcome using errcode = 'WM400';
                end if;
            else
                select t.status into v_status from cairnq_tasks t where t.id = v_dep;
                if v_status is distinct from 'succeeded' then
                    raise exception 'task % depends on %, which has ended %: it would never run',
                        v_id, v_dep, coalesce(v_status, 'and is gone') using errcode = 'WM400';
                end if;
            end if;
        end loop;
        v_key := r->>'order_key';
        v_seq := null;
        v_head := null;
        if v_key is not null then
            update waymark_order_keys k
               set last_seq = k.last_seq + 1,
                   head_seq = coalesce(k.head_seq, k.last_seq + 1)
             where k.key = v_key
            returning k.last_seq, k.head_seq into v_seq, v_head;
        end if;
        v_event := r->>'event';
        v_ev_payload := null;
        v_ev_at := null;
        if v_event is not null then
            select e.payload, e.emitted_at_ms into v_ev_payload, v_ev_at
              from waymark_events e
             where e.name = v_event and e.expires_at_ms > now_ms
             order by e.seq desc
             limit 1;
        end if;
        insert into waymark_held (
            id, flow_id, name, queue, payload, metadata, max_attempts, priority, delay_ms,
            parent_id, root_id, correlation_id, state, order_key, order_seq, turn,
            deps_left, waits_event, event_name, event_deadline_ms, on_deadline,
            event_payload, event_at_ms, created_at_ms)
        values (
            v_id, r->>'flow_id', r->>'name', r->>'queue', r->'payload', r->'metadata',
            (r->>'max_attempts')::integer, (r->>'priority')::integer, (r->>'delay_ms')::bigint,
            r->>'parent_id', r->>'root_id', r->>'correlation_id', 'held', v_key, v_seq,
            v_key is null or v_seq = v_head, v_left, v_event,
            case when v_ev_at is null then v_event end,
            case when v_event is not null and r->>'deadline_ms' is not null
                 then now_ms + (r->>'deadline_ms')::bigint end,
            case when v_event is not null then coalesce(r->>'on_deadline', 'cancel') end,
            v_ev_payload, v_ev_at, now_ms);
        insert into waymark_held_deps (task_id, dep_id, satisfied)
        select v_id, d, not exists (
                   select 1 from waymark_held h where h.id = d and h.state in ('held', 'released'))
          from unnest(v_deps) d;
        v_ids := v_ids || v_id;
    end loop;
    v_released := array(select waymark_held_release(v_ids));
    return query
    select u.id, case when u.id = any(v_released) then 'released' else 'held' end
      from unnest(v_ids) with ordinality as u(id, n)
     order by u.n;
end $$;
