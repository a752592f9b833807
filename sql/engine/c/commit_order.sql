-- The commit horizon: every commit ticket at or below it is final. Read it
-- before the snapshot that reads the markers, in an earlier statement.
CREATE FUNCTION outbox.commit_horizon()
RETURNS bigint
AS 'MODULE_PATHNAME', 'outbox_commit_horizon'
LANGUAGE C VOLATILE STRICT PARALLEL RESTRICTED;
COMMENT ON FUNCTION outbox.commit_horizon() IS 'pg_outbox: commit horizon; every commit ticket at or below it is final (needs preloading)';

CREATE FUNCTION outbox.commit_order_available()
RETURNS boolean
AS 'MODULE_PATHNAME', 'outbox_commit_order_available'
LANGUAGE C VOLATILE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION outbox.commit_order_available() IS 'pg_outbox: whether this server orders commits (pg_outbox preloaded, not a standby)';

-- Waits until no prepared transaction that emitted is pending, and keeps
-- new ones out until the end of the transaction.
CREATE FUNCTION outbox.commit_order_lock()
RETURNS void
AS 'MODULE_PATHNAME', 'outbox_commit_order_lock'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.commit_order_lock() IS 'pg_outbox: waits for prepared transactions that emitted, and keeps new ones out';
