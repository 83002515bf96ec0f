-- params: worker_id text, lease_ms int8, queues text[], names text[], limit int8, limit_queue text, limit_name text, group_in text, group_path text[], max_running int8, scan int8
-- waymark addition: a claim under a fleet-wide concurrency limit. The
-- limit's scope is the running rows of limit_queue and/or limit_name (NULL:
-- any); with group_in ('payload' or 'metadata') and group_path, each value
-- of that JSON path is a group of its own (rows without it form one group).
-- No group may hold more than max_running running rows after the claim.
-- Running rows count whatever their lease says: a slot frees when its row
-- leaves running (settled, or its expired lease recovered by a claim pass),
-- not while its lease lasts. The store runs this after taking the
-- limit's advisory lock in the same transaction, so the count it reads
-- includes every claim committed under the same limit; rows claimed by
-- workers that do not know the limit (other SDKs) are counted all the same.
-- Each queue offers its best `scan` due rows in the claim index's order,
-- passing over the rows of groups already at their limit so that one full
-- group's backlog cannot hide the others'; within each group the best of
-- them fill that group's free slots; the best `limit` of those are locked
-- (skipping rows locked meanwhile, and rechecked as still queued, as in
-- claim.sql) and claimed. Only the rows claimed are locked: locking the
-- whole scan, up to eight times the claim, cost more than the claim.
-- Rows come back in no particular order.
with clock as (
    select (extract(epoch from clock_timestamp()) * 1000)::bigint as now_ms
),
busy as (
    select case :group_in
               when 'payload' then r.payload #>> :group_path
               when 'metadata' then r.metadata #>> :group_path
           end as grp,
           count(*) as running
      from cairnq_tasks as r
     where r.status = 'running'
       and (:limit_queue::text is null or r.queue = :limit_queue)
       and (:limit_name::text is null or r.name = :limit_name)
     group by 1
),
offered as (
    select best.id, best.priority, best.run_at_ms, best.grp
      from unnest(:queues) as q(queue)
     cross join lateral (
           select c.id, c.priority, c.run_at_ms,
                  case :group_in
                      when 'payload' then c.payload #>> :group_path
                      when 'metadata' then c.metadata #>> :group_path
                  end as grp
             from cairnq_tasks as c
            where c.queue = q.queue
              and c.status = 'queued'
              and (:names::text[] is null or c.name = any(:names))
              and (:limit_queue::text is null or c.queue = :limit_queue)
              and (:limit_name::text is null or c.name = :limit_name)
              and c.run_at_ms <= (select now_ms from clock)
              and not exists (
                      select 1
                        from busy as full_group
                       where full_group.running >= :max_running
                         and full_group.grp is not distinct from (
                                 case :group_in
                                     when 'payload' then c.payload #>> :group_path
                                     when 'metadata' then c.metadata #>> :group_path
                                 end))
            order by c.priority desc, c.run_at_ms, c.id
            limit :scan
     ) as best
),
ranked as (
    select o.id, o.priority, o.run_at_ms,
           row_number() over (partition by o.grp order by o.priority desc, o.run_at_ms, o.id) as place,
           coalesce(b.running, 0) as running
      from offered as o
      left join busy as b on b.grp is not distinct from o.grp
)
update cairnq_tasks as t
   set status = 'running',
       worker_id = :worker_id,
       lease_until_ms = clock.now_ms + :lease_ms,
       -- attempt + 1, kept between 1 and the int4 maximum for a row written
       -- out of range by plain SQL (negative, or at the top), which would fail
       -- the whole claim or every later write to it (see README.md)
       attempt = least(greatest(t.attempt, 0), 2147483646) + 1,
       updated_at_ms = clock.now_ms
  from clock
 where t.id = any(array(
           select c.id
             from cairnq_tasks as c
            where c.id = any(array(
                      select ranked.id
                        from ranked
                       where ranked.place <= :max_running - ranked.running
                       order by ranked.priority desc, ranked.run_at_ms, ranked.id
                       limit :limit))
              and c.status = 'queued'
              for update skip locked
       ))
-- Every column but status and worker_id, which the update sets to 'running'
-- and :worker_id: the caller knows them.
returning t.id, t.name, t.queue, t.payload, t.result, t.error, t.metadata,
          t.progress, t.message, t.attempt, t.max_attempts, t.priority,
          t.lease_until_ms, t.run_at_ms, t.cancel_requested_at_ms, t.parent_id,
          t.root_id, t.correlation_id, t.created_at_ms, t.updated_at_ms,
          t.completed_at_ms
