CREATE FUNCTION outbox.try_maintenance_lock()
RETURNS boolean
AS 'MODULE_PATHNAME', 'outbox_try_maintenance_lock'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.try_maintenance_lock() IS 'pg_outbox: takes the maintenance lock for this transaction if free';
