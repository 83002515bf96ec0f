-- params: older_than_ms int8, limit int8
-- Forgets ended ledger rows (done or canceled before now - older_than_ms),
-- oldest first, up to limit, and the keys that hold nothing; answers the
-- ids forgotten. Their cairnq rows are the task table's retention's.
with clock as (
    select (extract(epoch from now()) * 1000)::bigint as now_ms
), gone as (
    delete from waymark_held h
     where h.id in (
         select x.id from waymark_held x, clock
          where x.state in ('done', 'canceled')
            and x.done_at_ms < clock.now_ms - :older_than_ms
          order by x.done_at_ms
          limit :limit
            for update skip locked)
    returning h.id
), idle as (
    delete from waymark_order_keys k
     using clock
     where k.head_seq is null and k.updated_at_ms < clock.now_ms - :older_than_ms
)
select id from gone
