-- params: lock_timeout text
-- Bounds every lock wait of the current transaction (advisory key locks, row
-- locks of a claim or a settlement). Transaction-local, so it cannot leak to
-- the next user of a pooled or pooler-shared connection. Value like '5000ms'.
select set_config('lock_timeout', :lock_timeout, true) as lock_timeout
