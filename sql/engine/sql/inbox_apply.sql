-- Records that a consumer applies an event (SQL engine): its consumer
-- check, then outbox.inbox_record() for the one event. No SET clause, as
-- the C declaration: every name is qualified.
CREATE FUNCTION @extschema@.inbox_apply(consumer text, event_id uuid, payload jsonb)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
	applied jsonb;
BEGIN
	PERFORM @extschema@.inbox_consumer_check(consumer);
	IF event_id IS NULL OR payload IS NULL THEN
		RAISE EXCEPTION '% must not be null', CASE WHEN event_id IS NULL THEN 'event_id' ELSE 'payload' END
			USING ERRCODE = 'null_value_not_allowed';
	END IF;
	applied := (outbox.inbox_record(consumer, ARRAY[event_id], ARRAY[payload]))[1];
	IF applied IS NULL THEN
		RETURN true;
	ELSIF applied OPERATOR(pg_catalog.=) payload THEN
		RETURN false;
	END IF;
	RAISE EXCEPTION 'event % was already applied by consumer "%" with another payload', event_id, consumer
		USING ERRCODE = 'OB001',
			  DETAIL = pg_catalog.format('Applied payload: %s. Received payload: %s.', applied, payload),
			  HINT = 'Two different events carry the same event id. Nothing was applied; find the producer that reused the id.';
END
$$;
COMMENT ON FUNCTION @extschema@.inbox_apply(text, uuid, jsonb) IS
	'pg_outbox: records that a consumer applies an event; true the first time, false for a redelivery, SQLSTATE OB001 for another payload under the same id';
