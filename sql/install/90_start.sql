-- pg_outbox install script, part 90: maintenance starts.
-- (assembled with the other parts of sql/install/; see 00_schema_roles.sql).

--
-- Maintenance of this database starts as soon as the install commits
-- (when pg_outbox is preloaded; see worker.c).
--
CREATE FUNCTION outbox.maintenance_wake()
RETURNS boolean
AS 'MODULE_PATHNAME', 'outbox_maintenance_wake'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.maintenance_wake() IS
	'pg_outbox: has the maintenance launcher look at every database once this transaction commits (when preloaded)';
REVOKE ALL ON FUNCTION outbox.maintenance_wake() FROM PUBLIC;
SELECT outbox.maintenance_wake();
