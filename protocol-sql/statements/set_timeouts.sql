-- params: lock_timeout text, statement_timeout text
-- Bounds one transaction's lock waits and the time any one of its statements
-- may run: a migration's (the ledger lock, a lock on a table it alters), and
-- the worker's renewal of a lease whose row another transaction held.
-- Transaction-local, like set_lock_timeout.
select set_config('lock_timeout', :lock_timeout, true) as lock_timeout,
       set_config('statement_timeout', :statement_timeout, true) as statement_timeout
