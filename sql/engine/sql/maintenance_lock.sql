-- The database's maintenance lock, for this transaction, if it is free:
-- false when another run holds it, so that concurrent maintenance runs
-- return at once instead of queueing. The C engine locks an advisory tag
-- of its own (locks.c) that SQL cannot name; this engine takes the
-- transaction-level advisory lock on the pair (0x6F626F78 "obox", 5), the
-- same class and number: a database has one engine, so the two never meet.
CREATE FUNCTION outbox.try_maintenance_lock()
RETURNS boolean
LANGUAGE sql VOLATILE STRICT PARALLEL UNSAFE
AS $$ SELECT pg_catalog.pg_try_advisory_xact_lock(1868722040, 5) $$;
COMMENT ON FUNCTION outbox.try_maintenance_lock() IS 'pg_outbox: takes the maintenance lock for this transaction if free';
