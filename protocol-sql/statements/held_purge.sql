-- params: older_than_ms int8, limit int8
-- Forgets ended ledger rows (done or canceled before now - older_than_ms),
-- oldest first, up to limit, but a failed head that holds its key, and the
-- keys no ledger row names any more; answers the ids forgotten. Their cairnq rows are the task table's retention's.
with clock as (
    select (extract(epoch from now()) * 1000)::bigint as now_ms
), gone as (
    delete from waymark_held h
     where h.id in (
         select x.id from waymark_held x, clock
          where x.state in ('done', 'canceled')
            and x.done_at_ms < clock.now_ms - :older_than_ms
            -- A failed head holds its key until an operator acts on it.
            and not exists (
                select 1 from waymark_order_keys k
                 where k.key = x.order_key and k.head_seq = x.order_seq)
          order by x.done_at_ms
          limit :limit
            for update skip locked)
    returning h.id
), idle as (
    delete from waymark_order_keys k
     using clock
     where k.head_seq is null and k.updated_at_ms < clock.now_ms - :older_than_ms
       and not exists (select 1 from waymark_held h where h.order_key = k.key)
)
select id from gone
