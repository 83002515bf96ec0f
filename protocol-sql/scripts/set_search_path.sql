-- Run on each new connection when an installation lives in its own schema.
-- {schema} is replaced by a validated name, as in create_schema.sql.
set search_path to "{schema}"
