-- params: ids text[]
-- Passes on the ends of the named tasks (held tasks released earlier), in the
-- transaction of their settlement: releases what waited on a success,
-- cancels what depended on a failure. Answers how many ends it passed on.
select waymark_held_settled(:ids) as passed
