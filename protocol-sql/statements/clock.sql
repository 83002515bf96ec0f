-- params:
-- waymark addition. The database's clock in epoch milliseconds, the clock
-- every statement stamps rows with: schedulers read it so that the slots
-- they fire and the tasks' times agree, whatever each host's clock says.
select (extract(epoch from clock_timestamp()) * 1000)::bigint as now_ms
