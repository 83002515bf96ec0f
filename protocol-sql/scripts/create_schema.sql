-- Creates the schema an installation was asked to live in. {schema} is replaced
-- by a name that matched ^[A-Za-z_][A-Za-z0-9_$]*$, quoted so its case is kept.
create schema if not exists "{schema}"
