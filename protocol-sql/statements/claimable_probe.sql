-- params: queues text[], names text[]
-- Is a claim worth a statement? due: a due queued row exists in these queues
-- (and names, when given). expired: a running row's lease has run out,
-- anywhere, so lease recovery has work. claimable: either of them.
-- due asks each queue (and each name, when given) for its first row in the
-- order of the claim index (or the claim-by-name index), so it reads that
-- index even when stale statistics say most rows are queued: a plain exists
-- could then scan the whole table for a row that is not there. Only one
-- branch runs: names is either null or not. expired matches the lease
-- index's predicate.
with clock as (
    select (extract(epoch from clock_timestamp()) * 1000)::bigint as now_ms
),
probe as materialized (
    select exists (
               select 1
                 from unnest(:queues) as q(queue)
                cross join lateral (
                      select 1
                        from cairnq_tasks as t
                       where t.queue = q.queue
                         and t.status = 'queued'
                         and t.run_at_ms <= (select now_ms from clock)
                       order by t.priority desc, t.run_at_ms, t.id
                       limit 1
                ) as first_due
                where :names::text[] is null
           )
           or exists (
               select 1
                 from unnest(:queues) as q(queue)
                cross join unnest(:names) as n(name)
                cross join lateral (
                      select 1
                        from cairnq_tasks as t
                       where t.queue = q.queue
                         and t.status = 'queued'
                         and t.name = n.name
                         and t.run_at_ms <= (select now_ms from clock)
                       order by t.priority desc, t.run_at_ms, t.id
                       limit 1
                ) as first_due
           ) as due,
           exists (
               select 1
                 from cairnq_tasks
                where status = 'running'
                  and lease_until_ms is not null
                  and lease_until_ms <= (select now_ms from clock)
           ) as expired
)
select due or expired as claimable, due, expired
  from probe
