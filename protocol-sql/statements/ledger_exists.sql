-- params:
-- Whether the ledger table is visible on the search path (read-only check).
select to_regclass('cairnq_migrations') is not null as present
