CREATE FUNCTION @extschema@.inbox_dead_letter(consumer text, stream text, entry_id text, event_id uuid,
											  topic text, key text, payload jsonb, headers jsonb,
											  reason text, sqlstate text DEFAULT NULL, deliveries integer DEFAULT 1)
RETURNS bigint
AS 'MODULE_PATHNAME', 'outbox_inbox_checked'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION @extschema@.inbox_dead_letter(text, text, text, uuid, text, text, jsonb, jsonb, text, text, integer) IS
	'pg_outbox: records a stream entry a consumer gave up on, from typed values, with the reason; returns the dead letter id';

CREATE FUNCTION @extschema@.inbox_dead_letter(consumer text, stream text, entry_id text, fields bytea[],
											  reason text, sqlstate text DEFAULT NULL, deliveries integer DEFAULT 1)
RETURNS bigint
AS 'MODULE_PATHNAME', 'outbox_inbox_checked'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION @extschema@.inbox_dead_letter(text, text, text, bytea[], text, text, integer) IS
	'pg_outbox: records a stream entry a consumer gave up on, from its raw fields kept as received, with the reason; returns the dead letter id';

-- Applies a batch of stream entries for a consumer: decodes each entry's
-- fields, records the events in the inbox, and runs the handler for each
-- new one, in the order of the entries. Fields come as bytes, as they were
-- in the stream. By default the batch applies as one: no subtransaction,
-- one transaction id. An entry found malformed (its field is no UTF-8
-- text, its event id no uuid, its payload no JSON), a duplicate or a
-- conflict is reported alone; what raises (a failing handler, a number
-- beyond numeric's range) aborts the call. With isolate => true (at most 64
-- entries) each entry applies in a subtransaction of its own, and what
-- raises fails its entry alone ('malformed' or 'failed'). Runs as the
-- caller, with the caller's search_path, so the handler runs with the
-- consumer's own privileges and names (C, extension/consume.c).
CREATE FUNCTION @extschema@.inbox_consume(consumer text, handler text, event_ids bytea[], topics bytea[],
										  keys bytea[], payloads bytea[], headers bytea[],
										  isolate boolean DEFAULT false)
RETURNS TABLE (ord integer, status text, error_code text, error_message text)
AS 'MODULE_PATHNAME', 'outbox_inbox_consume'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION @extschema@.inbox_consume(text, text, bytea[], bytea[], bytea[], bytea[], bytea[], boolean) IS
	'pg_outbox: applies a batch of entries (fields as bytes) through the inbox and a handler, as one transaction, or each in a subtransaction with isolate; returns applied, duplicate, conflict, malformed or failed per entry';
