-- Moves the cursor forward to the last published position. Only the leader
-- may; a position behind the cursor is refused (see outbox_rewind). The
-- last position per stream is recorded with it, bounded
-- (outbox.recorded_streams()), so that a group writing to ever new
-- streams does not rewrite an ever larger row. In C beside fetch
-- (advance.c): both pass the same leader and generation checks.
CREATE FUNCTION @extschema@.outbox_advance(group_name text, pos text, streams jsonb DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'outbox_advance'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION @extschema@.outbox_advance(text, text, jsonb) IS
	'pg_outbox: moves the group''s cursor forward to the last published position (leader only), recording the last position per stream';

-- A relay is about to wait for a notification: the next commit that
-- emitted sends one. True when notifications are sent on demand like this
-- (pg_outbox is preloaded), false when every such commit notifies anyway.
CREATE FUNCTION @extschema@.outbox_relay_waiting()
RETURNS boolean
AS 'MODULE_PATHNAME', 'outbox_relay_waiting'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION @extschema@.outbox_relay_waiting() IS
	'pg_outbox: a relay waits for a notification; the next committing transaction that emitted sends one';
