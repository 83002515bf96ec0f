-- params: lock_timeout text, statement_timeout text
-- Bounds one migration's transaction: how long it may wait for the ledger
-- lock (or a lock on a table it alters), and how long any one statement of
-- the file may run. Transaction-local, like set_lock_timeout.
select set_config('lock_timeout', :lock_timeout, true) as lock_timeout,
       set_config('statement_timeout', :statement_timeout, true) as statement_timeout
