-- params:
-- Always at least one row: the connection's current schema, then each schema
-- that holds a cairnq_tasks table (schema_name is null when there is none).
select current_schema()::text as current_schema,
       found.schema_name
  from (select 1) as one
  left join (
        select n.nspname::text as schema_name
          from pg_catalog.pg_class c
          join pg_catalog.pg_namespace n on n.oid = c.relnamespace
         where c.relname = 'cairnq_tasks'
           and c.relkind in ('r', 'p')
       ) as found on true
 order by found.schema_name
