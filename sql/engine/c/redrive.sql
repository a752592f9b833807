-- The checked entries of the parked keys' drain and of the operator's
-- calls (C): each checks, as its caller, that the caller may act for the
-- consumer (its first argument), then calls its body outbox.<name>_unchecked
-- (sql/install/46_redrive.sql).

-- Locks a parked key's row and returns what its next drain step applies,
-- for inbox_redrive_step().
CREATE FUNCTION outbox.parked_take(consumer text, stream text, key bytea, max_entries integer)
RETURNS TABLE (kind text, entry_id text, event_id bytea, topic bytea, key bytea, payload bytea, headers bytea,
			   deliveries integer, state text)
AS 'MODULE_PATHNAME', 'outbox_inbox_checked'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.parked_take(text, text, bytea, integer) IS
	'pg_outbox: locks a parked key and returns its dead letter or its next parked entries in order, for inbox_redrive_step()';

-- The parked keys of a consumer.
CREATE FUNCTION @extschema@.inbox_parked_keys(consumer text, streams text[] DEFAULT NULL)
RETURNS TABLE (consumer text, stream text, key text, key_bytes bytea, state text, first_failed_at timestamptz,
			   last_failed_at timestamptz, parked bigint, deliveries integer, reason text, sqlstate text,
			   head_entry_id text, dead_letter_id bigint, redrive_requested_at timestamptz, redrive_requested_by name)
AS 'MODULE_PATHNAME', 'outbox_inbox_checked'
LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION @extschema@.inbox_parked_keys(text, text[]) IS
	'pg_outbox: the parked keys of a consumer (of the streams given), by stream and first failure, with their state and counts';

-- Sets a dead key draining: its relay applies the dead letter, then the
-- parked entries, in order.
CREATE FUNCTION @extschema@.inbox_redrive(consumer text, key text, stream text DEFAULT NULL)
RETURNS TABLE (stream text, state text, parked bigint, result text)
AS 'MODULE_PATHNAME', 'outbox_inbox_checked'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION @extschema@.inbox_redrive(text, text, text) IS
	'pg_outbox: sets a dead parked key draining (its dead letter, then its parked entries, in order, by the relay); returns requested, already draining, retrying or not parked per stream';

-- Gives up a parked key's dead letter and sets the key draining the rest.
CREATE FUNCTION @extschema@.inbox_skip(consumer text, key text, stream text DEFAULT NULL)
RETURNS TABLE (stream text, state text, parked bigint, result text)
AS 'MODULE_PATHNAME', 'outbox_inbox_checked'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION @extschema@.inbox_skip(text, text, text) IS
	'pg_outbox: gives up a parked key''s dead letter (recorded with who and when) and sets the key draining its parked entries; returns skipped, retrying or not parked per stream';
