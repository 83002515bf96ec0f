-- One LISTEN per channel, all sent as one script. {channel} is replaced by
-- the channel name as a quoted identifier, so its case and every byte are
-- kept (pg_notify does not fold case; an unquoted LISTEN would).
listen {channel};
