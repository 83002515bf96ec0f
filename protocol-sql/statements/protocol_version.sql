-- params:
-- The protocol this installation speaks; no row reads as 0 at the caller.
select value from cairnq_meta where key = 'protocol_version'
