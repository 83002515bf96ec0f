-- params: id text, action text
-- An operator's release, skip or drop of one held task; answers its new state.
select waymark_held_operate(:id, :action) as state
