-- The last background maintenance run of each database of the cluster, as
-- the C engine's launcher and workers record it in shared memory. The SQL
-- engine has no background worker (the leading relay, or a pg_cron job
-- calling outbox_maintain(), maintains each database), so nothing records
-- runs, and this says so (55000, as the C engine without preloading)
-- rather than list nothing.
CREATE FUNCTION @extschema@.outbox_maintenance_databases()
RETURNS TABLE (database name, runs bigint, last_outcome text, last_started_at timestamptz,
			   last_finished_at timestamptz)
LANGUAGE plpgsql VOLATILE STRICT PARALLEL RESTRICTED
AS $$
BEGIN
	RAISE EXCEPTION 'the SQL engine of pg_outbox has no background maintenance'
		USING ERRCODE = 'object_not_in_prerequisite_state',
			  DETAIL = 'No background worker runs maintenance, and nothing records runs: the leading relay, or a pg_cron job calling outbox_maintain(), maintains each database.',
			  HINT = 'Read outbox_maintenance_status() in each database.';
END
$$;
COMMENT ON FUNCTION @extschema@.outbox_maintenance_databases() IS
	'pg_outbox: the last background maintenance run of each database of the cluster: runs, outcome, start and end';
