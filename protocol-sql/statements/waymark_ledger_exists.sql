-- params:
-- Whether waymark's ledger table is visible on the search path (read-only check).
select to_regclass('waymark_migrations') is not null as present
