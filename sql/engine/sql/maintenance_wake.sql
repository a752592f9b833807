-- The C engine has its maintenance launcher look at every database once
-- the transaction commits (when preloaded), and returns whether a launcher
-- runs. The SQL engine has none: it returns false, as the C engine does
-- without preloading.
CREATE FUNCTION outbox.maintenance_wake()
RETURNS boolean
LANGUAGE sql VOLATILE STRICT PARALLEL UNSAFE
AS $$ SELECT false $$;
COMMENT ON FUNCTION outbox.maintenance_wake() IS
	'pg_outbox: has the maintenance launcher look at every database once this transaction commits (when preloaded)';
