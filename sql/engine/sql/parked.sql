-- Parked keys' entry points (SQL engine): each checks that the role the
-- session acts as may act for the consumer (outbox.consumer_check()), then
-- calls outbox.<name>_unchecked, a body granted to nobody, so it runs as
-- the extension's owner; the bodies are sql/install/45_park.sql's.

-- Which entries of a batch belong to a parked key: park, head or
-- acknowledge (inbox_consume_keyed() calls it).
CREATE FUNCTION outbox.parked_match(consumer text, streams text[], keys bytea[], entry_ids text[])
RETURNS TABLE (ord integer, action text)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM outbox.consumer_check(consumer);
	RETURN QUERY SELECT m.ord, m.action FROM outbox.parked_match_unchecked(consumer, streams, keys, entry_ids) m;
END
$$;
COMMENT ON FUNCTION outbox.parked_match(text, text[], bytea[], text[]) IS
	'pg_outbox: which entries of a batch belong to a parked key of the consumer, and whether each parks, is the retrying head, or is acknowledged';

-- Stores entries of parked keys; returns those whose key is no longer
-- parked.
CREATE FUNCTION outbox.parked_add(consumer text, streams text[], entry_ids text[], event_ids bytea[], topics bytea[],
								  keys bytea[], payloads bytea[], headers bytea[])
RETURNS integer[]
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM outbox.consumer_check(consumer);
	RETURN outbox.parked_add_unchecked(consumer, streams, entry_ids, event_ids, topics, keys, payloads, headers);
END
$$;
COMMENT ON FUNCTION outbox.parked_add(text, text[], text[], bytea[], bytea[], bytea[], bytea[], bytea[]) IS
	'pg_outbox: parks entries of parked keys (idempotent); returns the positions of those whose key is no longer parked; SQLSTATE OB005 past outbox.config.park_limit';

-- Records what was done for a parked key; un-parks it when nothing is
-- left.
CREATE FUNCTION outbox.parked_settle(consumer text, stream text, key bytea, head_done boolean, settled text[],
									 dead_letter_replayed boolean)
RETURNS text
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM outbox.consumer_check(consumer);
	RETURN outbox.parked_settle_unchecked(consumer, stream, key, head_done, settled, dead_letter_replayed);
END
$$;
COMMENT ON FUNCTION outbox.parked_settle(text, text, bytea, boolean, text[], boolean) IS
	'pg_outbox: records a parked key''s head applied, entries settled or dead letter replayed; un-parks the key when nothing is left; returns its state';

-- The relay's record of an entry's failure, for its key.
CREATE FUNCTION @extschema@.inbox_park_key(consumer text, stream text, entry_id text, fields bytea[], reason text,
										   sqlstate text, deliveries integer, dead boolean)
RETURNS TABLE (state text, dead_letter_id bigint)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM outbox.consumer_check(consumer);
	RETURN QUERY SELECT r.state, r.dead_letter_id
				   FROM outbox.inbox_park_key_unchecked(consumer, stream, entry_id, fields, reason, sqlstate, deliveries,
														dead) r;
END
$$;
COMMENT ON FUNCTION @extschema@.inbox_park_key(text, text, text, bytea[], text, text, integer, boolean) IS
	'pg_outbox: records an entry''s failure for its key: parks the key (retrying, or dead with a dead letter), or counts a parked entry''s failed delivery; returns the key''s state and the dead letter';
