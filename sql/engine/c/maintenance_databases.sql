-- The last background maintenance run of each database of the cluster, as
-- the launcher and its workers record it in shared memory (pg_outbox
-- preloaded; else 55000): databases without the extension are listed too.
CREATE FUNCTION @extschema@.outbox_maintenance_databases()
RETURNS TABLE (database name, runs bigint, last_outcome text, last_started_at timestamptz,
			   last_finished_at timestamptz)
AS 'MODULE_PATHNAME', 'outbox_maintenance_databases'
LANGUAGE C VOLATILE STRICT PARALLEL RESTRICTED;
COMMENT ON FUNCTION @extschema@.outbox_maintenance_databases() IS
	'pg_outbox: the last background maintenance run of each database of the cluster: runs, outcome, start and end';
