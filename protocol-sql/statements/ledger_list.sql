-- params:
select name, applied_at_ms from cairnq_migrations order by name
