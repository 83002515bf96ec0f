-- Sent before a listening session closes, so that behind a pooler no LISTEN
-- is left on whichever server connection takes it next.
unlisten *
