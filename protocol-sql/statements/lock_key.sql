-- params: key text
-- Serialises every keyed transaction on one key; released at commit or rollback.
-- The void result carries nothing and is not decoded.
select pg_advisory_xact_lock(hashtextextended(:key, 0))
