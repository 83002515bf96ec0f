-- Wakeups for listeners. cairnq_queued carries the queue of a row that became
-- queued; cairnq_done carries the id of a row that reached a terminal status.
-- The trigger never fires for claim (status 'running'), and heartbeat and
-- progress do not touch status, so the hot paths pay nothing for it.
-- Notifications only shorten waits: readers always re-read the table.
-- This migration leaves schema_version alone, as every SDK's 0003 does.
create or replace function cairnq_notify() returns trigger
language plpgsql as $fn$
begin
    if new.status = 'queued' then
        if tg_op = 'INSERT' or old.status is distinct from 'queued' then
            perform pg_notify('cairnq_queued', new.queue);
        end if;
    elsif tg_op = 'UPDATE'
          and new.status in ('succeeded', 'failed', 'canceled')
          and old.status in ('queued', 'running') then
        perform pg_notify('cairnq_done', new.id);
    end if;
    return null;
end;
$fn$;

drop trigger if exists cairnq_tasks_notify on cairnq_tasks;
create trigger cairnq_tasks_notify
    after insert or update of status on cairnq_tasks
    for each row
    when (new.status <> 'running')
    execute function cairnq_notify();
