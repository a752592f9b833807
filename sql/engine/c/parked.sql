-- Parked keys' entry points (C): each checks that the caller may act for
-- the consumer, then calls outbox.<name>_unchecked (extension/inbox.c,
-- outbox_inbox_checked()); the bodies are sql/install/45_park.sql's.

-- Which entries of a batch belong to a parked key: park, head or
-- acknowledge (inbox_consume_keyed() calls it).
CREATE FUNCTION outbox.parked_match(consumer text, streams text[], keys bytea[], entry_ids text[])
RETURNS TABLE (ord integer, action text)
AS 'MODULE_PATHNAME', 'outbox_inbox_checked'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.parked_match(text, text[], bytea[], text[]) IS
	'pg_outbox: which entries of a batch belong to a parked key of the consumer, and whether each parks, is the retrying head, or is acknowledged';

-- Stores entries of parked keys; returns those whose key is no longer
-- parked.
CREATE FUNCTION outbox.parked_add(consumer text, streams text[], entry_ids text[], event_ids bytea[], topics bytea[],
								  keys bytea[], payloads bytea[], headers bytea[])
RETURNS integer[]
AS 'MODULE_PATHNAME', 'outbox_inbox_checked'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.parked_add(text, text[], text[], bytea[], bytea[], bytea[], bytea[], bytea[]) IS
	'pg_outbox: parks entries of parked keys (idempotent); returns the positions of those whose key is no longer parked; SQLSTATE OB005 past outbox.config.park_limit';

-- Records what was done for a parked key; un-parks it when nothing is
-- left.
CREATE FUNCTION outbox.parked_settle(consumer text, stream text, key bytea, head_done boolean, settled text[],
									 dead_letter_replayed boolean)
RETURNS text
AS 'MODULE_PATHNAME', 'outbox_inbox_checked'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.parked_settle(text, text, bytea, boolean, text[], boolean) IS
	'pg_outbox: records a parked key''s head applied, entries settled or dead letter replayed; un-parks the key when nothing is left; returns its state';

-- The relay's record of an entry's failure, for its key.
CREATE FUNCTION @extschema@.inbox_park_key(consumer text, stream text, entry_id text, fields bytea[], reason text,
										   sqlstate text, deliveries integer, dead boolean)
RETURNS TABLE (state text, dead_letter_id bigint)
AS 'MODULE_PATHNAME', 'outbox_inbox_checked'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION @extschema@.inbox_park_key(text, text, text, bytea[], text, text, integer, boolean) IS
	'pg_outbox: records an entry''s failure for its key: parks the key (retrying, or dead with a dead letter), or counts a parked entry''s failed delivery; returns the key''s state and the dead letter';
