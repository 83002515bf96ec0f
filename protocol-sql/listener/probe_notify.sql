-- Sent from a second, short-lived session to prove that LISTEN delivers:
-- the listener must hear this payload on this channel.
-- $1 text: the channel; $2 text: the probe payload.
select pg_notify($1, $2)
