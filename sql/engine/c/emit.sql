CREATE FUNCTION @extschema@.outbox_emit(topic text, key text, payload jsonb,
										headers jsonb DEFAULT NULL, event_id uuid DEFAULT NULL)
RETURNS uuid
AS 'MODULE_PATHNAME', 'outbox_emit'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION @extschema@.outbox_emit(text, text, jsonb, jsonb, uuid) IS
	'pg_outbox: writes one event in the current transaction and returns its event id';

CREATE FUNCTION @extschema@.outbox_emit_many(topic text, keys text[], payloads jsonb[],
											 headers jsonb[] DEFAULT NULL, event_ids uuid[] DEFAULT NULL)
RETURNS SETOF uuid
AS 'MODULE_PATHNAME', 'outbox_emit_many'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1000;
COMMENT ON FUNCTION @extschema@.outbox_emit_many(text, text[], jsonb[], jsonb[], uuid[]) IS
	'pg_outbox: writes one event per array element in the current transaction and returns their event ids in order';
