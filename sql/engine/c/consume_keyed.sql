-- The relay's consume call (C, extension/keyed.c): when no key of the
-- batch's streams is parked, inbox_consume() itself; otherwise the body
-- outbox.inbox_consume_keyed_body() (sql/install/45_park.sql). Runs as
-- the caller, with the caller's search_path, as inbox_consume() does.
CREATE FUNCTION @extschema@.inbox_consume_keyed(consumer text, handler text, streams text[], entry_ids text[],
												event_ids bytea[], topics bytea[], keys bytea[], payloads bytea[],
												headers bytea[], isolate boolean DEFAULT false, park boolean DEFAULT true)
RETURNS TABLE (ord integer, status text, error_code text, error_message text)
AS 'MODULE_PATHNAME', 'outbox_inbox_consume_keyed'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION @extschema@.inbox_consume_keyed(text, text, text[], text[], bytea[], bytea[], bytea[], bytea[], bytea[], boolean, boolean) IS
	'pg_outbox: inbox_consume() with parked keys honoured: entries of a parked key are stored (parked), a retrying head applied; with isolate and park, entries after a failed one of their key are blocked';
