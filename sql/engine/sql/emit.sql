-- Emission in SQL and PL/pgSQL (the C engine: extension/emit.c, writer.c,
-- xact.c).
--
-- An event row carries the caller's top-level transaction id and a
-- sequence number that orders the events of that transaction: (txid, seq)
-- is its position in the feed. As in C the sequence number keeps growing
-- inside a transaction across rolled-back savepoints, so it must come from
-- something a rollback does not undo: the sequence outbox.emit_seq, whose
-- large cache hands each backend a block of numbers of its own (nextval()
-- then touches neither shared memory nor WAL). The first emit of a
-- transaction takes a number as the transaction's offset and keeps it in
-- a transaction-local setting; each event's seq is its number minus the
-- offset, so a transaction numbers its events 1, 2, 3, ... (a jump, still
-- in order, only where a backend's block runs out). One difference from C
-- remains: a rolled-back savepoint that holds the transaction's first
-- event also rolls back the offset, and the next event is numbered 1
-- again (C goes on from the rolled-back numbers); positions stay unique
-- and in emission order either way.
--
-- Generated event ids are version 7 UUIDs, as in C: 48 bits of Unix
-- milliseconds, the version, 12 random bits, the variant, 32 random bits
-- and the low 30 bits of the event's number from outbox.emit_seq. The
-- random bits come from random() (a generator seeded per backend from a
-- strong source), not from gen_random_uuid(), whose strong randomness per
-- call would cost an emit more than its INSERT; the sequence's number,
-- never handed out twice in a database, keeps two ids of one database
-- apart even where random() was made repeatable by setseed(). (The C
-- engine draws its 74 random bits from a pool of strong random bytes.)
--
-- The functions write as the extension's owner (SECURITY DEFINER), where
-- the C engine writes the rows through the table access method without a
-- privilege check: callers need EXECUTE on them, not INSERT on the table,
-- so that nobody can write a row with a forged position. This is the one
-- declaration that differs from the C engine's (prosecdef, and the pinned
-- search_path that SECURITY DEFINER requires).
CREATE SEQUENCE outbox.emit_seq AS bigint CACHE 1000000;
COMMENT ON SEQUENCE outbox.emit_seq IS 'pg_outbox (SQL engine): numbers events within their transaction (each backend draws from a cached block of its own)';
REVOKE ALL ON SEQUENCE outbox.emit_seq FROM PUBLIC;

CREATE FUNCTION @extschema@.outbox_emit(topic text, key text, payload jsonb,
										headers jsonb DEFAULT NULL, event_id uuid DEFAULT NULL)
RETURNS uuid
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
	lim bigint;
	setting text;
	size bigint;
	hsize bigint;
	text_size bigint;
	id uuid;
	m text[];
	msg text;
	detail text;
	dropped text;
BEGIN
	-- Every check of the C engine, in its order, where one of them could
	-- fail, and the trace context (outbox.emit_trace()) where the headers
	-- or the settings have one; most calls pass them all in this one
	-- expression. (A value's
	-- size as jsonb is read from the datum here, which is at most 3 bytes
	-- short of the C engine's count for a value with a short header, and
	-- less for a compressed one: both take the full checks.)
	IF topic IS NULL OR octet_length(topic) NOT BETWEEN 1 AND 255 OR octet_length(key) > 1024 OR payload IS NULL
	   OR (headers IS NOT NULL AND jsonb_typeof(headers) <> 'object')
	   OR coalesce(nullif(current_setting('pg_outbox.max_payload_size', true), ''), '1MB') <> '1MB'
	   OR pg_column_size(payload) + coalesce(pg_column_size(headers), 0) > 1048570
	   OR pg_column_compression(payload) IS NOT NULL OR pg_column_compression(headers) IS NOT NULL
	   OR octet_length(payload::text) + coalesce(octet_length(headers::text), 0) > 1048576
	   OR headers ? 'traceparent' OR headers ? 'tracestate'
	   OR current_setting('pg_outbox.traceparent', true) <> '' OR current_setting('pg_outbox.tracestate', true) <> ''
	   OR current_setting('transaction_read_only') = 'on' THEN
		IF topic IS NULL THEN
			RAISE EXCEPTION 'topic must not be null' USING ERRCODE = 'null_value_not_allowed';
		END IF;
		IF octet_length(topic) = 0 THEN
			RAISE EXCEPTION 'topic must not be empty' USING ERRCODE = 'invalid_parameter_value';
		ELSIF octet_length(topic) > 255 THEN
			RAISE EXCEPTION 'topic is too long' USING ERRCODE = 'program_limit_exceeded',
				DETAIL = format('The topic is %s bytes; the limit is 255 bytes.', octet_length(topic));
		END IF;
		IF octet_length(key) > 1024 THEN
			RAISE EXCEPTION 'key is too long' USING ERRCODE = 'program_limit_exceeded',
				DETAIL = format('The key is %s bytes; the limit is 1024 bytes.', octet_length(key));
		END IF;
		IF payload IS NULL THEN
			RAISE EXCEPTION 'payload must not be null' USING ERRCODE = 'null_value_not_allowed',
				HINT = 'Use ''{}'' or ''null''::jsonb for an event without a payload.';
		END IF;
		IF headers IS NOT NULL AND jsonb_typeof(headers) <> 'object' THEN
			RAISE EXCEPTION 'headers must be a JSON object' USING ERRCODE = 'invalid_parameter_value',
				HINT = 'Pass NULL for no headers.';
		END IF;

		-- pg_outbox.max_payload_size: payload and headers, as jsonb and as
		-- JSON text (what the relay publishes), as set (a placeholder's
		-- text) or shown (by a backend that loaded pg_outbox.so for another
		-- database).
		setting := current_setting('pg_outbox.max_payload_size', true);
		IF setting IS NULL OR setting = '' THEN
			lim := 1048576;
		ELSE
			m := regexp_match(setting, '^\s*([0-9]{1,12})\s*(B|kB|MB|GB|TB)?\s*$');
			IF m IS NULL THEN
				RAISE EXCEPTION 'invalid value for parameter "pg_outbox.max_payload_size": "%"', setting
					USING ERRCODE = 'invalid_parameter_value',
						  HINT = 'Valid units for this parameter are "B", "kB", "MB", "GB", and "TB".';
			END IF;
			lim := m[1]::bigint * CASE coalesce(m[2], 'B') WHEN 'B' THEN 1 WHEN 'kB' THEN 1024 WHEN 'MB' THEN 1048576
									   WHEN 'GB' THEN 1073741824 ELSE 1099511627776 END;
			IF lim < 1024 OR lim > 268435456 THEN
				RAISE EXCEPTION '% B is outside the valid range for parameter "pg_outbox.max_payload_size" (1024 .. 268435456)', lim
					USING ERRCODE = 'invalid_parameter_value';
			END IF;
		END IF;
		IF headers ? 'traceparent' OR headers ? 'tracestate'
		   OR current_setting('pg_outbox.traceparent', true) <> '' OR current_setting('pg_outbox.tracestate', true) <> '' THEN
			SELECT t.headers_out[1], t.dropped INTO headers, dropped
			  FROM outbox.emit_trace(ARRAY[payload], ARRAY[headers], lim, false) t;
		END IF;
		-- The size of the values as jsonb, whatever their storage (#> '{}'
		-- returns the value detoasted, as C reads it).
		size := pg_column_size(payload #> '{}');
		hsize := coalesce(pg_column_size(headers #> '{}'), 0);
		IF size + hsize > lim THEN
			IF headers IS NULL THEN
				msg := 'payload is too large';
				detail := format('The payload is %s bytes as jsonb; pg_outbox.max_payload_size is %s bytes.', size, lim);
			ELSE
				msg := 'payload and headers are too large';
				detail := format('The payload is %s bytes and the headers are %s bytes as jsonb; pg_outbox.max_payload_size, which counts both, is %s bytes.',
								 size, hsize, lim);
			END IF;
			RAISE EXCEPTION USING MESSAGE = msg, ERRCODE = 'program_limit_exceeded', DETAIL = detail,
				HINT = 'Store large content elsewhere and emit a reference to it, or raise pg_outbox.max_payload_size.';
		END IF;
		-- As JSON text: printed, as jsonb's output function prints it.
		text_size := octet_length(payload::text) + coalesce(octet_length(headers::text), 0);
		IF text_size > lim THEN
			IF headers IS NULL THEN
				msg := 'payload is too large';
				detail := format('The payload is %s bytes as jsonb but prints as %s bytes of JSON text, as the relay publishes it; pg_outbox.max_payload_size is %s bytes.',
								 size, text_size, lim);
			ELSE
				msg := 'payload and headers are too large';
				detail := format('The payload and headers are %s bytes as jsonb but print as %s bytes of JSON text, as the relay publishes them; pg_outbox.max_payload_size, which counts both, is %s bytes.',
								 size + hsize, text_size, lim);
			END IF;
			RAISE EXCEPTION USING MESSAGE = msg, ERRCODE = 'program_limit_exceeded', DETAIL = detail,
				HINT = 'A number prints with every digit (1e1000 as 1001 bytes), a control character in a string as 6 bytes: store such content elsewhere and emit a reference to it, or raise pg_outbox.max_payload_size.';
		END IF;
		IF dropped IS NOT NULL THEN
			RAISE WARNING 'trace context dropped' USING DETAIL = dropped, ERRCODE = 'OB006';
		END IF;

		IF current_setting('transaction_read_only') = 'on' THEN
			RAISE EXCEPTION 'cannot execute outbox_emit() in a read-only transaction'
				USING ERRCODE = 'read_only_sql_transaction';
		END IF;
	END IF;

	-- One statement: the event's number, the transaction's offset (set by
	-- its first event), a version 7 id unless given (see the top of this
	-- file), the row.
	INSERT INTO outbox.event (txid, seq, event_id, topic, key, payload, headers, created_at)
	SELECT pg_current_xact_id(),
		   v.n - coalesce(nullif(current_setting('pg_outbox_sql.seq_offset', true), '')::bigint,
						  set_config('pg_outbox_sql.seq_offset', (v.n - 1)::text, true)::bigint),
		   coalesce(event_id,
					encode(int8send((floor(date_part('epoch', v.now) * 1000)::bigint << 16) | 28672
									| floor(random() * 4096)::bigint)
						   || int8send(-9223372036854775808 | (floor(random() * 4294967296)::bigint << 30)
									   | (v.n & 1073741823)), 'hex')::uuid),
		   topic, key, payload, headers, v.now
	  FROM (SELECT nextval('outbox.emit_seq'::regclass) AS n, clock_timestamp() AS now) v
	RETURNING event.event_id INTO id;
	RETURN id;
END
$$;
COMMENT ON FUNCTION @extschema@.outbox_emit(text, text, jsonb, jsonb, uuid) IS
	'pg_outbox: writes one event in the current transaction and returns its event id';

CREATE FUNCTION @extschema@.outbox_emit_many(topic text, keys text[], payloads jsonb[],
											 headers jsonb[] DEFAULT NULL, event_ids uuid[] DEFAULT NULL)
RETURNS SETOF uuid
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE ROWS 1000 SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
	lim bigint;
	setting text := current_setting('pg_outbox.max_payload_size', true);
	n integer;
	i integer;
	p jsonb;
	h jsonb;
	size bigint;
	hsize bigint;
	text_size bigint;
	offs text;
	first bigint;
	now timestamptz := clock_timestamp();
	ms bigint;
	m text[];
	msg text;
	detail text;
	dropped text;
BEGIN
	IF topic IS NULL THEN
		RAISE EXCEPTION 'topic must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF octet_length(topic) = 0 THEN
		RAISE EXCEPTION 'topic must not be empty' USING ERRCODE = 'invalid_parameter_value';
	ELSIF octet_length(topic) > 255 THEN
		RAISE EXCEPTION 'topic is too long' USING ERRCODE = 'program_limit_exceeded',
			DETAIL = format('The topic is %s bytes; the limit is 255 bytes.', octet_length(topic));
	END IF;
	IF payloads IS NULL THEN
		RAISE EXCEPTION 'payloads must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF array_ndims(payloads) > 1 THEN
		RAISE EXCEPTION 'payloads must be a one-dimensional array' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	-- Read element by element from 1, whatever the arrays' lower bounds.
	payloads := array(SELECT u FROM unnest(payloads) u);
	n := cardinality(payloads);
	FOR i IN 1 .. n LOOP
		IF payloads[i] IS NULL THEN
			RAISE EXCEPTION 'payload % must not be null', i USING ERRCODE = 'null_value_not_allowed',
				HINT = 'Use ''{}'' or ''null''::jsonb for an event without a payload.';
		END IF;
	END LOOP;

	IF keys IS NOT NULL THEN
		IF array_ndims(keys) > 1 THEN
			RAISE EXCEPTION 'keys must be a one-dimensional array' USING ERRCODE = 'invalid_parameter_value';
		END IF;
		keys := array(SELECT u FROM unnest(keys) u);
		IF cardinality(keys) <> n THEN
			RAISE EXCEPTION 'keys has % elements, payloads has %', cardinality(keys), n
				USING ERRCODE = 'invalid_parameter_value',
					  DETAIL = 'The arrays of outbox_emit_many() are read in parallel and must have the same length.';
		END IF;
		FOR i IN 1 .. n LOOP
			IF octet_length(keys[i]) > 1024 THEN
				RAISE EXCEPTION 'key % is too long', i USING ERRCODE = 'program_limit_exceeded',
					DETAIL = format('The key is %s bytes; the limit is 1024 bytes.', octet_length(keys[i]));
			END IF;
		END LOOP;
	END IF;

	IF headers IS NOT NULL THEN
		IF array_ndims(headers) > 1 THEN
			RAISE EXCEPTION 'headers must be a one-dimensional array' USING ERRCODE = 'invalid_parameter_value';
		END IF;
		headers := array(SELECT u FROM unnest(headers) u);
		IF cardinality(headers) <> n THEN
			RAISE EXCEPTION 'headers has % elements, payloads has %', cardinality(headers), n
				USING ERRCODE = 'invalid_parameter_value',
					  DETAIL = 'The arrays of outbox_emit_many() are read in parallel and must have the same length.';
		END IF;
		FOR i IN 1 .. n LOOP
			IF headers[i] IS NOT NULL AND jsonb_typeof(headers[i]) <> 'object' THEN
				RAISE EXCEPTION 'headers % must be a JSON object', i USING ERRCODE = 'invalid_parameter_value',
					HINT = 'Pass NULL for no headers.';
			END IF;
		END LOOP;
	END IF;

	-- pg_outbox.max_payload_size, as set (a placeholder's text) or shown
	-- (by a backend that loaded pg_outbox.so for another database).
	IF setting IS NULL OR setting = '' THEN
		lim := 1048576;
	ELSE
		m := regexp_match(setting, '^\s*([0-9]{1,12})\s*(B|kB|MB|GB|TB)?\s*$');
		IF m IS NULL THEN
			RAISE EXCEPTION 'invalid value for parameter "pg_outbox.max_payload_size": "%"', setting
				USING ERRCODE = 'invalid_parameter_value',
					  HINT = 'Valid units for this parameter are "B", "kB", "MB", "GB", and "TB".';
		END IF;
		lim := m[1]::bigint * CASE coalesce(m[2], 'B') WHEN 'B' THEN 1 WHEN 'kB' THEN 1024 WHEN 'MB' THEN 1048576
								   WHEN 'GB' THEN 1073741824 ELSE 1099511627776 END;
		IF lim < 1024 OR lim > 268435456 THEN
			RAISE EXCEPTION '% B is outside the valid range for parameter "pg_outbox.max_payload_size" (1024 .. 268435456)', lim
				USING ERRCODE = 'invalid_parameter_value';
		END IF;
	END IF;
	-- The trace context, where the headers or the settings have one.
	IF current_setting('pg_outbox.traceparent', true) <> '' OR current_setting('pg_outbox.tracestate', true) <> ''
	   OR EXISTS (SELECT FROM unnest(headers) u WHERE u ? 'traceparent' OR u ? 'tracestate') THEN
		SELECT t.headers_out, t.dropped INTO headers, dropped FROM outbox.emit_trace(payloads, headers, lim, true) t;
	END IF;
	FOR i IN 1 .. n LOOP
		p := payloads[i];
		h := headers[i];
		size := pg_column_size(p #> '{}');
		hsize := coalesce(pg_column_size(h #> '{}'), 0);
		IF size + hsize > lim THEN
			IF h IS NULL THEN
				msg := format('payload %s is too large', i);
				detail := format('The payload is %s bytes as jsonb; pg_outbox.max_payload_size is %s bytes.', size, lim);
			ELSE
				msg := format('payload and headers %s are too large', i);
				detail := format('The payload is %s bytes and the headers are %s bytes as jsonb; pg_outbox.max_payload_size, which counts both, is %s bytes.',
								 size, hsize, lim);
			END IF;
			RAISE EXCEPTION USING MESSAGE = msg, ERRCODE = 'program_limit_exceeded', DETAIL = detail,
				HINT = 'Store large content elsewhere and emit a reference to it, or raise pg_outbox.max_payload_size.';
		END IF;
		-- As JSON text: printed, as jsonb's output function prints it.
		text_size := octet_length(p::text) + coalesce(octet_length(h::text), 0);
		IF text_size > lim THEN
			IF h IS NULL THEN
				msg := format('payload %s is too large', i);
				detail := format('The payload is %s bytes as jsonb but prints as %s bytes of JSON text, as the relay publishes it; pg_outbox.max_payload_size is %s bytes.',
								 size, text_size, lim);
			ELSE
				msg := format('payload and headers %s are too large', i);
				detail := format('The payload and headers are %s bytes as jsonb but print as %s bytes of JSON text, as the relay publishes them; pg_outbox.max_payload_size, which counts both, is %s bytes.',
								 size + hsize, text_size, lim);
			END IF;
			RAISE EXCEPTION USING MESSAGE = msg, ERRCODE = 'program_limit_exceeded', DETAIL = detail,
				HINT = 'A number prints with every digit (1e1000 as 1001 bytes), a control character in a string as 6 bytes: store such content elsewhere and emit a reference to it, or raise pg_outbox.max_payload_size.';
		END IF;
	END LOOP;
	IF dropped IS NOT NULL THEN
		RAISE WARNING 'trace context dropped' USING DETAIL = dropped, ERRCODE = 'OB006';
	END IF;

	IF event_ids IS NOT NULL THEN
		IF array_ndims(event_ids) > 1 THEN
			RAISE EXCEPTION 'event_ids must be a one-dimensional array' USING ERRCODE = 'invalid_parameter_value';
		END IF;
		event_ids := array(SELECT u FROM unnest(event_ids) u);
		IF cardinality(event_ids) <> n THEN
			RAISE EXCEPTION 'event_ids has % elements, payloads has %', cardinality(event_ids), n
				USING ERRCODE = 'invalid_parameter_value',
					  DETAIL = 'The arrays of outbox_emit_many() are read in parallel and must have the same length.';
		END IF;
	END IF;

	IF n = 0 THEN
		RETURN;
	END IF;
	IF current_setting('transaction_read_only') = 'on' THEN
		RAISE EXCEPTION 'cannot execute outbox_emit() in a read-only transaction'
			USING ERRCODE = 'read_only_sql_transaction';
	END IF;

	first := nextval('outbox.emit_seq'::regclass);
	offs := current_setting('pg_outbox_sql.seq_offset', true);
	IF offs IS NULL OR offs = '' THEN
		offs := set_config('pg_outbox_sql.seq_offset', (first - 1)::text, true);
	END IF;
	ms := (floor(date_part('epoch', now) * 1000)::bigint << 16) | 28672;

	-- Element 1 takes the number drawn above, the others one each, in
	-- array order; generated ids as outbox_emit() makes them.
	RETURN QUERY
	WITH written AS (
		INSERT INTO outbox.event (txid, seq, event_id, topic, key, payload, headers, created_at)
		SELECT pg_current_xact_id(), e.n - offs::bigint,
			   coalesce(e.id, encode(int8send(ms | (e.r >> 32))
									 || int8send(-9223372036854775808 | ((e.r & 4294967295) << 30) | (e.n & 1073741823)),
									 'hex')::uuid),
			   topic, e.k, e.p, e.h, now
		  FROM (SELECT u.*, CASE WHEN u.i = 1 THEN first ELSE nextval('outbox.emit_seq'::regclass) END AS n,
					   floor(random() * 17592186044416)::bigint AS r
				  FROM unnest(payloads, keys, headers, event_ids) WITH ORDINALITY AS u(p, k, h, id, i)) e
		RETURNING seq, event_id
	)
	SELECT w.event_id FROM written w ORDER BY w.seq;
END
$$;
COMMENT ON FUNCTION @extschema@.outbox_emit_many(text, text[], jsonb[], jsonb[], uuid[]) IS
	'pg_outbox: writes one event per array element in the current transaction and returns their event ids in order';

-- Waking relays. The C engine queues one NOTIFY on channel "pg_outbox" at
-- the pre-commit of a transaction that emitted, when pg_outbox.notify is
-- on (its default) and a relay asked for one, and none at PREPARE
-- TRANSACTION: a transaction that queued a NOTIFY cannot be prepared, and
-- emitting transactions must support two-phase commit. Here a deferred
-- constraint trigger does it: it is queued by the first event of a
-- transaction (seq 1; a rolled-back savepoint takes its queued event with
-- it, and the next event is seq 1 again), and fires when the transaction
-- commits or prepares. It notifies only while a relay waits (the flag
-- outbox_relay_waiting() arms, in fetch.sql), and disarms the flag; two
-- transactions committing at once may both notify. At a PREPARE
-- TRANSACTION, which only a client's statement can run, it queues
-- nothing: the prepared transaction wakes nobody when it commits, and
-- relays find its events by polling, as with the C engine.
--
-- It runs as the extension's owner, which alone may read and set the flag.
CREATE FUNCTION outbox.notify_relays()
RETURNS trigger
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	done text;
BEGIN
	IF pg_sequence_last_value('outbox.relays_waiting'::regclass) = 1
	   AND btrim(coalesce(current_setting('pg_outbox.notify', true), '')) !~* '^(of|off|f|fa|fal|fals|false|n|no|0)$'
	   AND coalesce(current_query(), '') !~* '\mprepare\s+transaction\M' THEN
		PERFORM setval('outbox.relays_waiting'::regclass, 0, true);
		-- An assignment, not PERFORM: evaluated as an expression, without
		-- running a query.
		done := pg_notify('pg_outbox', '')::text;
	END IF;
	RETURN NULL;
END
$$;
COMMENT ON FUNCTION outbox.notify_relays() IS
	'pg_outbox (SQL engine): wakes waiting relays with NOTIFY pg_outbox when a transaction that emitted commits';
REVOKE ALL ON FUNCTION outbox.notify_relays() FROM PUBLIC;

CREATE CONSTRAINT TRIGGER notify_relays AFTER INSERT ON outbox.event
	DEFERRABLE INITIALLY DEFERRED
	FOR EACH ROW WHEN (NEW.seq OPERATOR(pg_catalog.=) 1::bigint)
	EXECUTE FUNCTION outbox.notify_relays();
