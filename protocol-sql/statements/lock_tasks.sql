-- params: ids text[]
-- waymark addition: locks these tasks in id order, first in a transaction
-- that writes several of them with more than one statement (a settlement
-- batch of completes and failures), so that two such transactions on tasks
-- they share (a settlement resent while its first try still holds its rows
-- on a server that has not yet seen its client go) take their locks in one
-- order. (heartbeat_batch skips locked rows, so it waits on no one.)
-- Returns the ids found.
select id
  from cairnq_tasks
 where id = any(:ids)
 order by id
   for update
