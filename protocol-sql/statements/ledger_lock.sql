-- params:
-- Taken first in each migration's transaction, so concurrent migrators apply
-- every file exactly once between them.
lock table cairnq_migrations in exclusive mode
