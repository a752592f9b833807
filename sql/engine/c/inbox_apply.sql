CREATE FUNCTION @extschema@.inbox_apply(consumer text, event_id uuid, payload jsonb)
RETURNS boolean
AS 'MODULE_PATHNAME', 'outbox_inbox_checked'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION @extschema@.inbox_apply(text, uuid, jsonb) IS
	'pg_outbox: records that a consumer applies an event; true the first time, false for a redelivery, SQLSTATE OB001 for another payload under the same id';
