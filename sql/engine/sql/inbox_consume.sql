-- Records a dead letter from typed values (SQL engine). It writes
-- outbox.dead_letters through a body granted to nobody, so it runs as the
-- extension's owner; the consumer check takes the role the session acts as
-- (see inbox_consumer_check()).
CREATE FUNCTION @extschema@.inbox_dead_letter(consumer text, stream text, entry_id text, event_id uuid,
											  topic text, key text, payload jsonb, headers jsonb,
											  reason text, sqlstate text DEFAULT NULL, deliveries integer DEFAULT 1)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM outbox.consumer_check(consumer);
	RETURN outbox.inbox_dead_letter_unchecked(consumer, stream, entry_id, event_id, topic, key, payload, headers,
											  reason, sqlstate, deliveries);
END
$$;
COMMENT ON FUNCTION @extschema@.inbox_dead_letter(text, text, text, uuid, text, text, jsonb, jsonb, text, text, integer) IS
	'pg_outbox: records a stream entry a consumer gave up on, from typed values, with the reason; returns the dead letter id';

-- Records a dead letter from an entry's raw fields (SQL engine; as above).
CREATE FUNCTION @extschema@.inbox_dead_letter(consumer text, stream text, entry_id text, fields bytea[],
											  reason text, sqlstate text DEFAULT NULL, deliveries integer DEFAULT 1)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM outbox.consumer_check(consumer);
	RETURN outbox.inbox_dead_letter_unchecked(consumer, stream, entry_id, fields, reason, sqlstate, deliveries);
END
$$;
COMMENT ON FUNCTION @extschema@.inbox_dead_letter(text, text, text, bytea[], text, text, integer) IS
	'pg_outbox: records a stream entry a consumer gave up on, from its raw fields kept as received, with the reason; returns the dead letter id';

-- Applies a batch of stream entries for a consumer: decodes each entry's
-- fields, records the events in the inbox, and runs the handler for each
-- new one, in the order of the entries. Fields come as bytes, as they were
-- in the stream. By default the batch applies as one: no subtransaction
-- that writes, one transaction id. An entry found malformed (its field is
-- no UTF-8 text, its event id no uuid, its payload no JSON), a duplicate or
-- a conflict is reported alone; what raises (a failing handler, a number
-- beyond numeric's range) aborts the call. With isolate => true (at most 64
-- entries) each entry applies in a subtransaction of its own, and what
-- raises fails its entry alone ('malformed' or 'failed'). Runs as the
-- caller, with the caller's search_path, so the handler runs with the
-- consumer's own privileges and names: no SET clause, and every name it
-- resolves itself is qualified (SQL engine).
--
-- PL/pgSQL cannot check a field without raising, so the fields of the whole
-- batch are converted by one statement in an exception block (a
-- subtransaction that writes nothing and takes no transaction id); when it
-- raises, the batch is halved until each entry that raises is alone, and
-- only that entry's fields are checked one by one, each in an exception
-- block, for the SQLSTATE and message the C engine reports. The handler
-- is planned once per batch (see below).
CREATE FUNCTION @extschema@.inbox_consume(consumer text, handler text, event_ids bytea[], topics bytea[],
										  keys bytea[], payloads bytea[], headers bytea[],
										  isolate boolean DEFAULT false)
RETURNS TABLE (ord integer, status text, error_code text, error_message text)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
#variable_conflict use_variable
DECLARE
	n integer;
	utf8 boolean := pg_catalog.getdatabaseencoding() OPERATOR(pg_catalog.=) 'UTF8';
	names CONSTANT text[] := '{event_id,topic,key,payload,headers}';
	-- Per entry: the result, and the decoded fields.
	st text[];
	codes text[];
	messages text[];
	id_texts text[];
	ids uuid[];
	tops text[];
	ks text[];
	pays jsonb[];
	hdrs jsonb[];
	-- The first entry (in order) whose conversion raises what the C engine
	-- raises too, and that error.
	raise_at integer;
	raise_code text;
	raise_message text;
	raise_detail text;
	raise_hint text;
	-- Halving.
	todo_lo integer[];
	todo_hi integer[];
	a integer;
	b integer;
	k integer;
	sub_id_texts text[];
	sub_ids uuid[];
	sub_tops text[];
	sub_ks text[];
	sub_pays jsonb[];
	sub_hdrs jsonb[];
	alone integer[] := '{}';
	-- Checking one entry.
	i integer;
	f integer;
	raw bytea;
	txt text[];
	js jsonb;
	c text;
	m text;
	d text;
	h text;
	fault_field integer;
	fault_code text;
	fault_message text;
	late_field integer;
	late_code text;
	late_message text;
	late_detail text;
	late_hint text;
	-- Applying.
	well integer[];
	applied jsonb[];
	fresh integer[];
	fn text;
	usable boolean;
	created boolean := false;
	checked_handler boolean := false;
	bodies text;
	conflict_code text;
	-- The trace context: per entry, and the caller's settings.
	tps text[];
	tss text[];
	tp text;
	ts text;
	caller_tp text;
	caller_ts text;
	tracing boolean;
BEGIN
	PERFORM @extschema@.inbox_consumer_check(consumer);
	IF handler IS NULL OR handler OPERATOR(pg_catalog.=) '' THEN
		RAISE EXCEPTION 'handler must not be empty' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF isolate IS NULL THEN
		RAISE EXCEPTION 'isolate must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;

	-- The arrays as a batch: of equal length (keys and headers may be
	-- NULL), one-dimensional from 1.
	n := coalesce(pg_catalog.cardinality(payloads), 0);
	IF coalesce(pg_catalog.cardinality(event_ids), 0) OPERATOR(pg_catalog.<>) n
	   OR coalesce(pg_catalog.cardinality(topics), 0) OPERATOR(pg_catalog.<>) n
	   OR coalesce(pg_catalog.cardinality(keys), n) OPERATOR(pg_catalog.<>) n
	   OR coalesce(pg_catalog.cardinality(headers), n) OPERATOR(pg_catalog.<>) n THEN
		RAISE EXCEPTION 'the arrays of inbox_consume() must have the same length'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'keys and headers may also be NULL.';
	END IF;
	IF n OPERATOR(pg_catalog.>) 0 AND EXISTS (
		SELECT FROM ROWS FROM (pg_catalog.unnest(ARRAY[pg_catalog.array_ndims(event_ids), pg_catalog.array_ndims(topics),
													   pg_catalog.array_ndims(keys), pg_catalog.array_ndims(payloads),
													   pg_catalog.array_ndims(headers)]),
							   pg_catalog.unnest(ARRAY[pg_catalog.array_lower(event_ids, 1), pg_catalog.array_lower(topics, 1),
													   pg_catalog.array_lower(keys, 1), pg_catalog.array_lower(payloads, 1),
													   pg_catalog.array_lower(headers, 1)])) s(dims, low)
		 WHERE s.dims OPERATOR(pg_catalog.<>) 1 OR s.low OPERATOR(pg_catalog.<>) 1) THEN
		RAISE EXCEPTION 'the arrays of inbox_consume() must be one-dimensional and start at 1'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF isolate AND n OPERATOR(pg_catalog.>) 64 THEN
		RAISE EXCEPTION 'inbox_consume() applies at most % entries with isolate => true', 64
			USING ERRCODE = 'program_limit_exceeded',
				  DETAIL = pg_catalog.format('The batch has %s entries. Each applies in a subtransaction, and a transaction with more than %s overflows its backend''s subtransaction cache, which slows every snapshot of the cluster.', n, 64),
				  HINT = pg_catalog.format('Pass the entries in parts of at most %s, each in a transaction of its own.', 64);
	END IF;
	IF n OPERATOR(pg_catalog.=) 0 THEN
		RETURN;
	END IF;

	st := pg_catalog.array_fill(NULL::text, ARRAY[n]);
	codes := st;
	messages := st;
	id_texts := st;
	tops := st;
	ks := st;
	ids := pg_catalog.array_fill(NULL::uuid, ARRAY[n]);
	pays := pg_catalog.array_fill(NULL::jsonb, ARRAY[n]);
	hdrs := pays;

	-- Every entry converted in one statement; the entries of a part that
	-- raises, in halves, until each one that raises is alone. An entry
	-- without a field it needs is checked alone.
	todo_lo := ARRAY[1];
	todo_hi := ARRAY[n];
	WHILE pg_catalog.cardinality(todo_lo) OPERATOR(pg_catalog.>) 0 LOOP
		k := pg_catalog.cardinality(todo_lo);
		a := todo_lo[k];
		b := todo_hi[k];
		todo_lo := todo_lo[1:k OPERATOR(pg_catalog.-) 1];
		todo_hi := todo_hi[1:k OPERATOR(pg_catalog.-) 1];
		BEGIN
			SELECT pg_catalog.array_agg(x.id_text ORDER BY x.o),
				   pg_catalog.array_agg(x.id_text::pg_catalog.uuid ORDER BY x.o),
				   pg_catalog.array_agg(x.top ORDER BY x.o),
				   pg_catalog.array_agg(x.k ORDER BY x.o),
				   pg_catalog.array_agg(x.pay::pg_catalog.jsonb ORDER BY x.o),
				   pg_catalog.array_agg(x.hdr::pg_catalog.jsonb ORDER BY x.o),
				   pg_catalog.array_agg(x.o::integer ORDER BY x.o) FILTER (WHERE NOT x.whole)
			  INTO sub_id_texts, sub_ids, sub_tops, sub_ks, sub_pays, sub_hdrs, well
			  FROM (SELECT e.o,
						   e.e IS NOT NULL AND e.t IS NOT NULL AND e.p IS NOT NULL AS whole,
						   CASE WHEN e.t IS NOT NULL AND e.p IS NOT NULL THEN pg_catalog.convert_from(e.e, 'UTF8') END AS id_text,
						   CASE WHEN e.e IS NOT NULL AND e.p IS NOT NULL THEN pg_catalog.convert_from(e.t, 'UTF8') END AS top,
						   CASE WHEN e.e IS NOT NULL AND e.t IS NOT NULL AND e.p IS NOT NULL THEN pg_catalog.convert_from(e.k, 'UTF8') END AS k,
						   CASE WHEN e.e IS NOT NULL AND e.t IS NOT NULL THEN pg_catalog.convert_from(e.p, 'UTF8') END AS pay,
						   CASE WHEN e.e IS NOT NULL AND e.t IS NOT NULL AND e.p IS NOT NULL THEN pg_catalog.convert_from(e.h, 'UTF8') END AS hdr
					  FROM ROWS FROM (pg_catalog.unnest(event_ids), pg_catalog.unnest(topics), pg_catalog.unnest(keys),
									  pg_catalog.unnest(payloads), pg_catalog.unnest(headers)) WITH ORDINALITY e(e, t, k, p, h, o)
					 WHERE e.o OPERATOR(pg_catalog.>=) a AND e.o OPERATOR(pg_catalog.<=) b) x;
			id_texts[a:b] := sub_id_texts;
			ids[a:b] := sub_ids;
			tops[a:b] := sub_tops;
			ks[a:b] := sub_ks;
			pays[a:b] := sub_pays;
			hdrs[a:b] := sub_hdrs;
			IF well IS NOT NULL THEN
				alone := alone OPERATOR(pg_catalog.||) well;
			END IF;
		EXCEPTION WHEN OTHERS THEN
			IF a OPERATOR(pg_catalog.=) b THEN
				alone := alone OPERATOR(pg_catalog.||) a;
			ELSE
				k := (a OPERATOR(pg_catalog.+) b) OPERATOR(pg_catalog./) 2;
				todo_lo := todo_lo OPERATOR(pg_catalog.||) ARRAY[k OPERATOR(pg_catalog.+) 1, a];
				todo_hi := todo_hi OPERATOR(pg_catalog.||) ARRAY[b, k];
			END IF;
		END;
	END LOOP;

	-- Each entry that raised, or lacks a field, checked field by field in
	-- order, as the C engine does without raising: the first field that
	-- fails makes it malformed. What the C engine's checks pass but its
	-- conversion raises (a number beyond numeric's range) raises here too,
	-- or, with isolate, fails the entry as malformed; nesting beyond the
	-- stack raises in both.
	alone := ARRAY(SELECT DISTINCT x FROM pg_catalog.unnest(alone) x ORDER BY x);
	<<entries>>
	FOREACH i IN ARRAY alone LOOP
		ids[i] := NULL;
		tops[i] := NULL;
		ks[i] := NULL;
		pays[i] := NULL;
		hdrs[i] := NULL;
		txt := pg_catalog.array_fill(NULL::text, ARRAY[5]);
		fault_field := NULL;
		late_field := NULL;
		FOR f IN 1 .. 5 LOOP
			-- An array, not CASE f WHEN ...: a simple CASE compares with
			-- whatever "=" the caller's search_path finds first.
			raw := (ARRAY[event_ids[i], topics[i], keys[i], payloads[i], headers[i]])[f];
			IF raw IS NULL THEN
				CONTINUE WHEN f OPERATOR(pg_catalog.=) ANY ('{3,5}');
				fault_field := f;
				fault_code := '22004';
				fault_message := 'the entry has no such field';
				EXIT;
			END IF;
			BEGIN
				IF utf8 OR f OPERATOR(pg_catalog.=) 1 THEN
					txt[f] := pg_catalog.convert_from(raw, 'UTF8');
				ELSE
					PERFORM pg_catalog.convert(raw, 'UTF8', 'UTF8');
				END IF;
			EXCEPTION WHEN OTHERS THEN
				GET STACKED DIAGNOSTICS c = RETURNED_SQLSTATE, m = MESSAGE_TEXT, d = PG_EXCEPTION_DETAIL;
				fault_field := f;
				fault_code := c;
				fault_message := CASE WHEN coalesce(d, '') OPERATOR(pg_catalog.=) '' THEN m
									  ELSE pg_catalog.format('%s (%s)', m, d) END;
				EXIT;
			END;
			IF f OPERATOR(pg_catalog.=) 1 THEN
				BEGIN
					ids[i] := txt[f]::pg_catalog.uuid;
				EXCEPTION WHEN OTHERS THEN
					GET STACKED DIAGNOSTICS c = RETURNED_SQLSTATE, m = MESSAGE_TEXT;
					fault_field := f;
					fault_code := c;
					fault_message := m;
					EXIT;
				END;
			ELSIF f OPERATOR(pg_catalog.>=) 4 AND utf8 THEN
				BEGIN
					js := txt[f]::pg_catalog.jsonb;
					IF f OPERATOR(pg_catalog.=) 4 THEN
						pays[i] := js;
					ELSE
						hdrs[i] := js;
					END IF;
				EXCEPTION WHEN OTHERS THEN
					GET STACKED DIAGNOSTICS c = RETURNED_SQLSTATE, m = MESSAGE_TEXT, d = PG_EXCEPTION_DETAIL,
											h = PG_EXCEPTION_HINT;
					IF c OPERATOR(pg_catalog.=) ANY ('{22P02,22P05}') THEN
						fault_field := f;
						fault_code := c;
						fault_message := CASE WHEN coalesce(d, '') OPERATOR(pg_catalog.=) '' THEN m
											  ELSE pg_catalog.format('%s (%s)', m, d) END;
						EXIT;
					END IF;
					IF c OPERATOR(pg_catalog.=) '54001' THEN
						-- The C engine's check raises it: the call ends here.
						IF raise_at IS NULL THEN
							raise_at := i;
							raise_code := c;
							raise_message := m;
							raise_detail := d;
							raise_hint := h;
						END IF;
						EXIT entries;
					END IF;
					-- Only the conversion found it: is the text JSON, as the
					-- C engine's check reads it (its \u escapes decoded,
					-- its numbers not)?
					BEGIN
						PERFORM pg_catalog.json_strip_nulls(txt[f]::pg_catalog.json);
					EXCEPTION WHEN OTHERS THEN
						GET STACKED DIAGNOSTICS c = RETURNED_SQLSTATE, m = MESSAGE_TEXT, d = PG_EXCEPTION_DETAIL,
												h = PG_EXCEPTION_HINT;
						IF c OPERATOR(pg_catalog.<>) ALL ('{22P02,22P05}') THEN
							IF raise_at IS NULL THEN
								raise_at := i;
								raise_code := c;
								raise_message := m;
								raise_detail := d;
								raise_hint := h;
							END IF;
							EXIT entries;
						END IF;
						fault_field := f;
						fault_code := c;
						fault_message := CASE WHEN coalesce(d, '') OPERATOR(pg_catalog.=) '' THEN m
											  ELSE pg_catalog.format('%s (%s)', m, d) END;
						EXIT;
					END;
					IF late_field IS NULL THEN
						GET STACKED DIAGNOSTICS late_code = RETURNED_SQLSTATE, late_message = MESSAGE_TEXT,
												late_detail = PG_EXCEPTION_DETAIL, late_hint = PG_EXCEPTION_HINT;
						late_field := f;
					END IF;
				END;
			END IF;
		END LOOP;
		IF fault_field IS NOT NULL THEN
			st[i] := 'malformed';
			codes[i] := fault_code;
			messages[i] := pg_catalog.format('field "%s": %s', names[fault_field], fault_message);
			ids[i] := NULL;
			CONTINUE;
		END IF;
		id_texts[i] := txt[1];
		-- The conversion, field by field, on a server that is not UTF-8.
		IF NOT utf8 THEN
			FOR f IN 2 .. 5 LOOP
				CONTINUE WHEN (ARRAY[event_ids[i], topics[i], keys[i], payloads[i], headers[i]])[f] IS NULL;
				BEGIN
					txt[f] := pg_catalog.convert_from((ARRAY[event_ids[i], topics[i], keys[i], payloads[i], headers[i]])[f],
													  'UTF8');
					IF f OPERATOR(pg_catalog.=) 4 THEN
						pays[i] := txt[f]::pg_catalog.jsonb;
					ELSIF f OPERATOR(pg_catalog.=) 5 THEN
						hdrs[i] := txt[f]::pg_catalog.jsonb;
					END IF;
				EXCEPTION WHEN OTHERS THEN
					GET STACKED DIAGNOSTICS late_code = RETURNED_SQLSTATE, late_message = MESSAGE_TEXT,
											late_detail = PG_EXCEPTION_DETAIL, late_hint = PG_EXCEPTION_HINT;
					late_field := f;
					EXIT;
				END;
			END LOOP;
		END IF;
		IF late_field IS NOT NULL THEN
			pays[i] := NULL;
			IF NOT isolate THEN
				IF raise_at IS NULL OR i OPERATOR(pg_catalog.<) raise_at THEN
					raise_at := i;
					raise_code := late_code;
					raise_message := late_message;
					raise_detail := late_detail;
					raise_hint := late_hint;
				END IF;
			ELSE
				st[i] := 'malformed';
				codes[i] := late_code;
				messages[i] := pg_catalog.format('field "%s": %s', names[late_field],
												 CASE WHEN coalesce(late_detail, '') OPERATOR(pg_catalog.=) '' THEN late_message
													  ELSE pg_catalog.format('%s (%s)', late_message, late_detail) END);
				ids[i] := NULL;
			END IF;
			CONTINUE;
		END IF;
		tops[i] := txt[2];
		ks[i] := txt[3];
	END LOOP;
	IF raise_at IS NOT NULL THEN
		IF coalesce(raise_detail, '') OPERATOR(pg_catalog.=) '' AND coalesce(raise_hint, '') OPERATOR(pg_catalog.=) '' THEN
			RAISE EXCEPTION USING ERRCODE = raise_code, MESSAGE = raise_message;
		ELSIF coalesce(raise_hint, '') OPERATOR(pg_catalog.=) '' THEN
			RAISE EXCEPTION USING ERRCODE = raise_code, MESSAGE = raise_message, DETAIL = raise_detail;
		ELSIF coalesce(raise_detail, '') OPERATOR(pg_catalog.=) '' THEN
			RAISE EXCEPTION USING ERRCODE = raise_code, MESSAGE = raise_message, HINT = raise_hint;
		ELSE
			RAISE EXCEPTION USING ERRCODE = raise_code, MESSAGE = raise_message, DETAIL = raise_detail, HINT = raise_hint;
		END IF;
	END IF;

	IF NOT isolate THEN
		-- The batch as one: the inbox records the events of the well-formed
		-- entries, then the handler runs for each new one, in order.
		SELECT pg_catalog.array_agg(s.o::integer ORDER BY s.o) INTO well
		  FROM ROWS FROM (pg_catalog.unnest(st), pg_catalog.unnest(ids)) WITH ORDINALITY s(st, id, o)
		 WHERE s.st IS NULL AND s.id IS NOT NULL;
		IF well IS NOT NULL THEN
			applied := outbox.inbox_record(consumer,
										   ARRAY(SELECT ids[w] FROM pg_catalog.unnest(well) w),
										   ARRAY(SELECT pays[w] FROM pg_catalog.unnest(well) w));
			FOR k IN 1 .. pg_catalog.cardinality(well) LOOP
				i := well[k];
				IF applied[k] IS NULL THEN
					CONTINUE;
				ELSIF applied[k] OPERATOR(pg_catalog.=) pays[i] THEN
					st[i] := 'duplicate';
				ELSE
					-- The error inbox_apply() raises, reported.
					BEGIN
						RAISE EXCEPTION 'event % was already applied by consumer "%" with another payload', id_texts[i], consumer
							USING ERRCODE = 'OB001',
								  DETAIL = pg_catalog.format('Applied payload: %s. Received payload: %s.', applied[k], pays[i]);
					EXCEPTION WHEN OTHERS THEN
						GET STACKED DIAGNOSTICS c = RETURNED_SQLSTATE, m = MESSAGE_TEXT, d = PG_EXCEPTION_DETAIL;
						st[i] := 'conflict';
						codes[i] := c;
						messages[i] := pg_catalog.format('%s (%s)', m, d);
					END;
				END IF;
			END LOOP;
			fresh := ARRAY(SELECT w FROM pg_catalog.unnest(well) w WHERE st[w] IS NULL ORDER BY w);
			IF pg_catalog.cardinality(fresh) OPERATOR(pg_catalog.>) 0 THEN
				-- What cannot run inside a function, named as the C engine
				-- names it (PL/pgSQL's EXECUTE and SQL functions refuse it).
				IF handler OPERATOR(pg_catalog.~*) '^\s*(begin|start|commit|end|rollback|abort|savepoint|release|prepare\s+transaction)\M' THEN
					RAISE EXCEPTION 'the handler cannot run in inbox_consume(): SPI_ERROR_TRANSACTION'
						USING ERRCODE = 'feature_not_supported',
							  HINT = 'The handler runs inside the transaction that records the event in the inbox.';
				END IF;
				IF handler OPERATOR(pg_catalog.~*) '^\s*copy\M.*\m(stdin|stdout)\M' THEN
					RAISE EXCEPTION 'the handler cannot run in inbox_consume(): SPI_ERROR_COPY'
						USING ERRCODE = 'feature_not_supported',
							  HINT = 'The handler runs inside the transaction that records the event in the inbox.';
				END IF;
				-- The handler as the body of an SQL function of the session's
				-- temporary schema, called for every new entry in order by
				-- one statement: its plan is made once for the batch, where
				-- an EXECUTE per entry would plan it for every entry. It runs
				-- as the caller with the caller's search_path, as EXECUTE
				-- would, and is dropped when the batch is done (a function
				-- kept for the next batch would keep its role from being
				-- dropped while the session lasts). One found already (a
				-- handler that consumes with the same handler) is used if
				-- it is the role's own with the same body and nothing
				-- changed; without the TEMPORARY privilege, or when another
				-- function holds the name, each entry's handler runs by
				-- EXECUTE.
				--
				-- The handler's $6 is the entry's valid traceparent, and
				-- while it runs pg_outbox.traceparent and
				-- pg_outbox.tracestate hold the entry's trace context
				-- (empty when none; the statement sets them before each
				-- entry's call), the caller's values set again after.
				-- Nothing is set when neither the entries nor the caller
				-- have a trace context.
				SELECT pg_catalog.array_agg(t.traceparent ORDER BY x.o), pg_catalog.array_agg(t.tracestate ORDER BY x.o)
				  INTO tps, tss
				  FROM pg_catalog.unnest(fresh) WITH ORDINALITY x(w, o)
				 CROSS JOIN LATERAL outbox.trace_context(hdrs[x.w]) t;
				caller_tp := pg_catalog.current_setting('pg_outbox.traceparent', true);
				caller_ts := pg_catalog.current_setting('pg_outbox.tracestate', true);
				tracing := EXISTS (SELECT FROM pg_catalog.unnest(tps) v WHERE v IS NOT NULL)
						   OR coalesce(caller_tp, '') OPERATOR(pg_catalog.<>) '' OR coalesce(caller_ts, '') OPERATOR(pg_catalog.<>) '';
				fn := 'pg_outbox_handler_' OPERATOR(pg_catalog.||) pg_catalog.md5(current_user OPERATOR(pg_catalog.||) '/' OPERATOR(pg_catalog.||) handler);
				SELECT p.prosrc OPERATOR(pg_catalog.=) handler AND NOT p.prosecdef AND p.proconfig IS NULL
					   AND p.provolatile OPERATOR(pg_catalog.=) 'v' AND p.pronargs OPERATOR(pg_catalog.=) 6
					   AND p.proowner OPERATOR(pg_catalog.=) (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) current_user)
					   AND p.prolang OPERATOR(pg_catalog.=) (SELECT l.oid FROM pg_catalog.pg_language l WHERE l.lanname OPERATOR(pg_catalog.=) 'sql')
				  INTO usable
				  FROM pg_catalog.pg_proc p
				 WHERE p.pronamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema() AND p.proname OPERATOR(pg_catalog.=) fn;
				IF NOT FOUND AND pg_catalog.has_database_privilege(pg_catalog.current_database(), 'TEMPORARY') THEN
					-- Checked when it first runs, as the handler run by
					-- EXECUTE would be.
					bodies := pg_catalog.current_setting('check_function_bodies');
					PERFORM pg_catalog.set_config('check_function_bodies', 'off', true);
					EXECUTE pg_catalog.format('CREATE FUNCTION pg_temp.%I(pg_catalog.text, pg_catalog.text, pg_catalog.jsonb, pg_catalog.jsonb, pg_catalog.uuid, pg_catalog.text) RETURNS void LANGUAGE sql VOLATILE AS %L',
											  fn, handler);
					PERFORM pg_catalog.set_config('check_function_bodies', bodies, true);
					usable := true;
					created := true;
				END IF;
				IF usable THEN
					-- The settings are set by the filter above the sort, for
					-- each entry just before its call (a qual that calls a
					-- volatile function stays where it is written).
					EXECUTE pg_catalog.format('SELECT pg_catalog.count(pg_temp.%I(s.t, s.k, s.p, s.h, s.id, s.tp)) FROM (SELECT u.t, u.k, u.p, u.h, u.id, u.tp, u.ts FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3), pg_catalog.unnest($4), pg_catalog.unnest($5), pg_catalog.unnest($6), pg_catalog.unnest($7)) WITH ORDINALITY u(t, k, p, h, id, tp, ts, o) ORDER BY u.o) s%s',
											  fn, CASE WHEN tracing THEN ' WHERE pg_catalog.set_config(''pg_outbox.traceparent'', COALESCE(s.tp, ''''), true) IS NOT NULL AND pg_catalog.set_config(''pg_outbox.tracestate'', COALESCE(s.ts, ''''), true) IS NOT NULL' ELSE '' END)
						USING ARRAY(SELECT tops[w] FROM pg_catalog.unnest(fresh) WITH ORDINALITY x(w, o) ORDER BY x.o),
							  ARRAY(SELECT ks[w] FROM pg_catalog.unnest(fresh) WITH ORDINALITY x(w, o) ORDER BY x.o),
							  ARRAY(SELECT pays[w] FROM pg_catalog.unnest(fresh) WITH ORDINALITY x(w, o) ORDER BY x.o),
							  ARRAY(SELECT hdrs[w] FROM pg_catalog.unnest(fresh) WITH ORDINALITY x(w, o) ORDER BY x.o),
							  ARRAY(SELECT ids[w] FROM pg_catalog.unnest(fresh) WITH ORDINALITY x(w, o) ORDER BY x.o),
							  tps, tss;
					IF created THEN
						EXECUTE pg_catalog.format('DROP FUNCTION pg_temp.%I(pg_catalog.text, pg_catalog.text, pg_catalog.jsonb, pg_catalog.jsonb, pg_catalog.uuid, pg_catalog.text)', fn);
					END IF;
				ELSE
					FOR k IN 1 .. pg_catalog.cardinality(fresh) LOOP
						i := fresh[k];
						IF tracing THEN
							PERFORM pg_catalog.set_config('pg_outbox.traceparent', coalesce(tps[k], ''), true),
									pg_catalog.set_config('pg_outbox.tracestate', coalesce(tss[k], ''), true);
						END IF;
						EXECUTE handler USING tops[i], ks[i], pays[i], hdrs[i], ids[i], tps[k];
					END LOOP;
				END IF;
				IF tracing THEN
					PERFORM pg_catalog.set_config('pg_outbox.traceparent', coalesce(caller_tp, ''), true),
							pg_catalog.set_config('pg_outbox.tracestate', coalesce(caller_ts, ''), true);
				END IF;
				FOREACH i IN ARRAY fresh LOOP
					st[i] := 'applied';
				END LOOP;
			END IF;
		END IF;
	ELSE
		-- Each entry in its own subtransaction: what raises fails its entry
		-- alone; a cancel (not caught by OTHERS) ends the call.
		FOR i IN 1 .. n LOOP
			CONTINUE WHEN st[i] IS NOT NULL OR ids[i] IS NULL;
			BEGIN
				applied := outbox.inbox_record(consumer, ARRAY[ids[i]], ARRAY[pays[i]]);
				IF applied[1] IS NULL THEN
					IF NOT checked_handler THEN
						IF handler OPERATOR(pg_catalog.~*) '^\s*(begin|start|commit|end|rollback|abort|savepoint|release|prepare\s+transaction)\M' THEN
							RAISE EXCEPTION 'the handler cannot run in inbox_consume(): SPI_ERROR_TRANSACTION'
								USING ERRCODE = 'feature_not_supported',
									  HINT = 'The handler runs inside the transaction that records the event in the inbox.';
						END IF;
						IF handler OPERATOR(pg_catalog.~*) '^\s*copy\M.*\m(stdin|stdout)\M' THEN
							RAISE EXCEPTION 'the handler cannot run in inbox_consume(): SPI_ERROR_COPY'
								USING ERRCODE = 'feature_not_supported',
									  HINT = 'The handler runs inside the transaction that records the event in the inbox.';
						END IF;
					END IF;
					-- The entry's trace context while the handler runs, as
					-- above; an error takes it back with the subtransaction.
					SELECT t.traceparent, t.tracestate INTO tp, ts FROM outbox.trace_context(hdrs[i]) t;
					caller_tp := pg_catalog.current_setting('pg_outbox.traceparent', true);
					caller_ts := pg_catalog.current_setting('pg_outbox.tracestate', true);
					tracing := tp IS NOT NULL OR coalesce(caller_tp, '') OPERATOR(pg_catalog.<>) ''
							   OR coalesce(caller_ts, '') OPERATOR(pg_catalog.<>) '';
					IF tracing THEN
						PERFORM pg_catalog.set_config('pg_outbox.traceparent', coalesce(tp, ''), true),
								pg_catalog.set_config('pg_outbox.tracestate', coalesce(ts, ''), true);
					END IF;
					EXECUTE handler USING tops[i], ks[i], pays[i], hdrs[i], ids[i], tp;
					IF tracing THEN
						PERFORM pg_catalog.set_config('pg_outbox.traceparent', coalesce(caller_tp, ''), true),
								pg_catalog.set_config('pg_outbox.tracestate', coalesce(caller_ts, ''), true);
					END IF;
					st[i] := 'applied';
				ELSIF applied[1] OPERATOR(pg_catalog.=) pays[i] THEN
					st[i] := 'duplicate';
				ELSE
					BEGIN
						RAISE EXCEPTION 'event % was already applied by consumer "%" with another payload', id_texts[i], consumer
							USING ERRCODE = 'OB001',
								  DETAIL = pg_catalog.format('Applied payload: %s. Received payload: %s.', applied[1], pays[i]);
					EXCEPTION WHEN OTHERS THEN
						GET STACKED DIAGNOSTICS c = RETURNED_SQLSTATE, m = MESSAGE_TEXT, d = PG_EXCEPTION_DETAIL;
						conflict_code := c;
						st[i] := 'conflict';
						codes[i] := c;
						messages[i] := pg_catalog.format('%s (%s)', m, d);
					END;
				END IF;
			EXCEPTION WHEN OTHERS THEN
				GET STACKED DIAGNOSTICS c = RETURNED_SQLSTATE, m = MESSAGE_TEXT, d = PG_EXCEPTION_DETAIL;
				IF conflict_code IS NULL THEN
					BEGIN
						RAISE EXCEPTION 'identity conflict' USING ERRCODE = 'OB001';
					EXCEPTION WHEN OTHERS THEN
						conflict_code := SQLSTATE;
					END;
				END IF;
				st[i] := CASE WHEN c OPERATOR(pg_catalog.=) conflict_code THEN 'conflict' ELSE 'failed' END;
				codes[i] := c;
				messages[i] := CASE WHEN coalesce(d, '') OPERATOR(pg_catalog.=) '' THEN m
									ELSE pg_catalog.format('%s (%s)', m, d) END;
			END;
		END LOOP;
	END IF;

	RETURN QUERY
		SELECT r.o::integer, r.st, r.c, r.m
		  FROM ROWS FROM (pg_catalog.unnest(st), pg_catalog.unnest(codes), pg_catalog.unnest(messages)) WITH ORDINALITY r(st, c, m, o)
		 ORDER BY r.o;
END
$$;
COMMENT ON FUNCTION @extschema@.inbox_consume(text, text, bytea[], bytea[], bytea[], bytea[], bytea[], boolean) IS
	'pg_outbox: applies a batch of entries (fields as bytes) through the inbox and a handler, as one transaction, or each in a subtransaction with isolate; returns applied, duplicate, conflict, malformed or failed per entry';
