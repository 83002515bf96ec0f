-- params:
-- waymark's migration ledger, beside cairnq's: one row per applied file of
-- protocol-sql/ledgers/. No cairnq SDK reads or writes it.
create table if not exists waymark_migrations (
    name           text primary key,
    applied_at_ms  bigint not null
)
