-- params:
-- Taken first in each of waymark's migration transactions.
lock table waymark_migrations in exclusive mode
