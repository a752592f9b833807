-- Which engine this is (C: pg_outbox.so behind the functions), the version of its
-- scripts and the schema of the API: what a relay reads first, from the
-- fixed schema "outbox", to know where the API is and what it has. The
-- scripts get the schema as an identifier, quoted where it must be
-- ("Ob Schema" with its double quotes); parse_ident() gives its name.
CREATE FUNCTION outbox.engine(OUT engine text, OUT version text, OUT api_schema name)
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 'c'::pg_catalog.text, '@extversion@'::pg_catalog.text, (pg_catalog.parse_ident('@extschema@'::pg_catalog.text))[1]::pg_catalog.name $$;
COMMENT ON FUNCTION outbox.engine() IS 'pg_outbox: the engine installed (c: C library), its version and the schema of its API';
