-- params:
select name, applied_at_ms from waymark_migrations order by name
