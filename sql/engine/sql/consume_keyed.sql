-- The relay's consume call (SQL): the body outbox.inbox_consume_keyed_body()
-- (sql/install/45_park.sql), which takes its own fast path. Runs as the
-- caller, with the caller's search_path.
CREATE FUNCTION @extschema@.inbox_consume_keyed(consumer text, handler text, streams text[], entry_ids text[],
												event_ids bytea[], topics bytea[], keys bytea[], payloads bytea[],
												headers bytea[], isolate boolean DEFAULT false, park boolean DEFAULT true)
RETURNS TABLE (ord integer, status text, error_code text, error_message text)
LANGUAGE sql VOLATILE PARALLEL UNSAFE
AS $$
SELECT b.ord, b.status, b.error_code, b.error_message
  FROM outbox.inbox_consume_keyed_body($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) b
$$;
COMMENT ON FUNCTION @extschema@.inbox_consume_keyed(text, text, text[], text[], bytea[], bytea[], bytea[], bytea[], bytea[], boolean, boolean) IS
	'pg_outbox: inbox_consume() with parked keys honoured: entries of a parked key are stored (parked), a retrying head applied; with isolate and park, entries after a failed one of their key are blocked';
