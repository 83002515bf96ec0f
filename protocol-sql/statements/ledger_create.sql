-- params:
-- The migration ledger, shared with every cairnq SDK: one row per applied file.
create table if not exists cairnq_migrations (
    name           text primary key,
    applied_at_ms  bigint not null
)
