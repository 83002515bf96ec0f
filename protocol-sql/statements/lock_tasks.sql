-- params: ids text[]
-- waymark addition: locks these tasks in id order, first in a transaction
-- that writes several of them with more than one statement (a settlement
-- batch of completes and failures), so that it takes its row locks in the
-- order heartbeat_batch and complete_batch take theirs and cannot deadlock
-- with them. Returns the ids found.
select id
  from cairnq_tasks
 where id = any(:ids)
 order by id
   for update
