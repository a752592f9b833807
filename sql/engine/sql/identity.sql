-- Which engine this is (SQL: SQL and PL/pgSQL only), the version of its
-- scripts and the schema of the API: what a relay reads first, from the
-- fixed schema "outbox", to know where the API is and what it has. The
-- scripts get the schema as an identifier, quoted where it must be
-- ("Ob Schema" with its double quotes); parse_ident() gives its name.
CREATE FUNCTION outbox.engine(OUT engine text, OUT version text, OUT api_schema name)
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 'sql'::pg_catalog.text, '@extversion@'::pg_catalog.text, (pg_catalog.parse_ident('@extschema@'::pg_catalog.text))[1]::pg_catalog.name $$;
COMMENT ON FUNCTION outbox.engine() IS 'pg_outbox: the engine installed (sql: SQL and PL/pgSQL only), its version and the schema of its API';
