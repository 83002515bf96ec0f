-- params: queues text[], names text[]
-- Is a claim worth a transaction? True when a due queued row exists in these
-- queues (and names, when given), or any lease has expired anywhere.
select exists (
           select 1
             from cairnq_tasks
            where queue = any(:queues)
              and status = 'queued'
              and (:names::text[] is null or name = any(:names))
              and run_at_ms <= (select (extract(epoch from clock_timestamp()) * 1000)::bigint)
       )
       or exists (
           select 1
             from cairnq_tasks
            where status = 'running'
              and lease_until_ms is not null
              and lease_until_ms <= (select (extract(epoch from clock_timestamp()) * 1000)::bigint)
       ) as claimable
