-- The checked entries of the parked keys' drain and of the operator's
-- calls (SQL engine): the consumer check, then the body
-- outbox.<name>_unchecked (sql/install/46_redrive.sql). They read and
-- write tables their callers cannot, through bodies granted to nobody, so
-- they run as the extension's owner; the check takes the role the session
-- acts as (see inbox_consumer_check()). SQL functions, not PL/pgSQL: each
-- has a parameter named as a column of its result, which PL/pgSQL refuses
-- and SQL allows (a SQL function's body sees only its parameters); the
-- statements run in order, the check first.

-- Locks a parked key's row and returns what its next drain step applies,
-- for inbox_redrive_step().
CREATE FUNCTION outbox.parked_take(consumer text, stream text, key bytea, max_entries integer)
RETURNS TABLE (kind text, entry_id text, event_id bytea, topic bytea, key bytea, payload bytea, headers bytea,
			   deliveries integer, state text)
LANGUAGE sql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
	SELECT outbox.consumer_check(consumer);
	SELECT * FROM outbox.parked_take_unchecked(consumer, stream, key, max_entries);
$$;
COMMENT ON FUNCTION outbox.parked_take(text, text, bytea, integer) IS
	'pg_outbox: locks a parked key and returns its dead letter or its next parked entries in order, for inbox_redrive_step()';

-- The parked keys of a consumer.
CREATE FUNCTION @extschema@.inbox_parked_keys(consumer text, streams text[] DEFAULT NULL)
RETURNS TABLE (consumer text, stream text, key text, key_bytes bytea, state text, first_failed_at timestamptz,
			   last_failed_at timestamptz, parked bigint, deliveries integer, reason text, sqlstate text,
			   head_entry_id text, dead_letter_id bigint, redrive_requested_at timestamptz, redrive_requested_by name)
LANGUAGE sql STABLE PARALLEL RESTRICTED SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
	SELECT outbox.consumer_check(consumer);
	SELECT * FROM outbox.inbox_parked_keys_unchecked(consumer, streams);
$$;
COMMENT ON FUNCTION @extschema@.inbox_parked_keys(text, text[]) IS
	'pg_outbox: the parked keys of a consumer (of the streams given), by stream and first failure, with their state and counts';

-- Sets a dead key draining: its relay applies the dead letter, then the
-- parked entries, in order.
CREATE FUNCTION @extschema@.inbox_redrive(consumer text, key text, stream text DEFAULT NULL)
RETURNS TABLE (stream text, state text, parked bigint, result text)
LANGUAGE sql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
	SELECT outbox.consumer_check(consumer);
	SELECT * FROM outbox.inbox_redrive_unchecked(consumer, key, stream);
$$;
COMMENT ON FUNCTION @extschema@.inbox_redrive(text, text, text) IS
	'pg_outbox: sets a dead parked key draining (its dead letter, then its parked entries, in order, by the relay); returns requested, already draining, retrying or not parked per stream';

-- Gives up a parked key's dead letter and sets the key draining the rest.
CREATE FUNCTION @extschema@.inbox_skip(consumer text, key text, stream text DEFAULT NULL)
RETURNS TABLE (stream text, state text, parked bigint, result text)
LANGUAGE sql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
	SELECT outbox.consumer_check(consumer);
	SELECT * FROM outbox.inbox_skip_unchecked(consumer, key, stream);
$$;
COMMENT ON FUNCTION @extschema@.inbox_skip(text, text, text) IS
	'pg_outbox: gives up a parked key''s dead letter (recorded with who and when) and sets the key draining its parked entries; returns skipped, retrying or not parked per stream';
