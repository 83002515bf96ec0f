-- params: name text
insert into waymark_migrations (name, applied_at_ms)
values (:name, (extract(epoch from clock_timestamp()) * 1000)::bigint)
