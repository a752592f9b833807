CREATE FUNCTION outbox.maintenance_wake()
RETURNS boolean
AS 'MODULE_PATHNAME', 'outbox_maintenance_wake'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.maintenance_wake() IS
	'pg_outbox: has the maintenance launcher look at every database once this transaction commits (when preloaded)';
