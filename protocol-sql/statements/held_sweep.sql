-- params: limit int8
-- Upkeep of the held ledger: ends no settlement passed on, event deadlines,
-- expired events. Answers the counts as one jsonb object.
select waymark_held_sweep(:limit::integer) as counts
