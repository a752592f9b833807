-- pg_outbox install script, part 46: draining parked keys, and the
-- operator's view of them (inbox_parked_keys, inbox_redrive, inbox_skip).
-- (assembled with the other parts of sql/install/; see 00_schema_roles.sql).

--
-- A parked key (part 45) drains in steps: inbox_redrive_step() applies the
-- head's dead letter alone, or the next entries of the key (at most 64) in
-- stream order, through the consumer's handler, in the caller's
-- transaction. The relay that reads the stream runs the steps, one
-- transaction each, between its reads: other keys keep flowing, no
-- transaction stays long, and no path holds more than 64 subtransactions
-- (I-19). A step records no failure itself: the relay classifies what
-- failed and records it with inbox_park_key(), which sends the key back to
-- "dead" when the entry has had its deliveries.
--
-- inbox_redrive() and inbox_skip() only change a key's state, in the
-- caller's transaction: the relay drains it within its claim interval, with
-- its own handler, as the consumer's role, so that no second copy of the
-- handler is needed (and none can drift). With no relay reading the
-- stream, nothing drains.
--
-- The functions that name a consumer are checked entries (sql/engine/*/
-- redrive.sql): the check of the engine, then the body
-- outbox.<name>_unchecked below, which runs as the extension's owner and
-- is granted to nobody. A body's parameters are those of its entry, but
-- where the entry's result has a column of the same name (PL/pgSQL takes
-- the parameters and the result's columns as variables of one namespace):
-- there the body's parameter is called "of_<name>".
--

-- Body of outbox.parked_take(): locks the key's row (so that one drain
-- step at a time works on a key, and a parker waits for it) and returns
-- what its next step applies, a row each:
--   'none': the key is not draining (state: its state, NULL when it is not
--     parked); the step does nothing;
--   'dead_letter': the head's dead letter, which is neither replayed nor
--     skipped: the step applies it alone, first. Its fields as received
--     (as made from its typed values when it has none);
--   'entry': the next parked entries of the key, at most max_entries, in
--     stream order.
-- No row: the key is draining and nothing is left; the step settles it.
-- deliveries is the number the delivery about to be made has: the dead
-- letter's deliveries, or the entry's failed drains, plus one.
CREATE FUNCTION outbox.parked_take_unchecked(consumer text, stream text, of_key bytea, max_entries integer)
RETURNS TABLE (kind text, entry_id text, event_id bytea, topic bytea, key bytea, payload bytea, headers bytea,
			   deliveries integer, state text)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	k outbox.parked_keys;
	d outbox.dead_letters;
BEGIN
	IF stream IS NULL OR of_key IS NULL OR max_entries IS NULL THEN
		RAISE EXCEPTION '% must not be null',
			CASE WHEN stream IS NULL THEN 'stream' WHEN of_key IS NULL THEN 'key' ELSE 'max_entries' END
			USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF max_entries < 1 OR max_entries > 64 THEN
		RAISE EXCEPTION 'max_entries must be between 1 and 64'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = format('It is %s.', max_entries);
	END IF;
	SELECT p.* INTO k
	  FROM outbox.parked_keys p
	 WHERE p.consumer = parked_take_unchecked.consumer AND p.stream = parked_take_unchecked.stream
	   AND p.key_hash = sha256(of_key)
	   FOR UPDATE;
	IF NOT FOUND OR k.state <> 'draining' THEN
		kind := 'none';
		state := k.state;
		RETURN NEXT;
		RETURN;
	END IF;
	SELECT x.* INTO d
	  FROM outbox.dead_letters x
	 WHERE x.id = k.dead_letter_id AND x.replayed_at IS NULL AND x.skipped_at IS NULL;
	IF FOUND THEN
		kind := 'dead_letter';
		entry_id := d.entry_id;
		IF d.fields IS NOT NULL THEN
			event_id := outbox.entry_field(d.fields, 'event_id');
			topic := outbox.entry_field(d.fields, 'topic');
			key := outbox.entry_field(d.fields, 'key');
			payload := outbox.entry_field(d.fields, 'payload');
			headers := outbox.entry_field(d.fields, 'headers');
		ELSE
			event_id := convert_to(d.event_id::text, 'UTF8');
			topic := convert_to(d.topic, 'UTF8');
			key := convert_to(d.key, 'UTF8');
			payload := convert_to(d.payload::text, 'UTF8');
			headers := convert_to(d.headers::text, 'UTF8');
		END IF;
		deliveries := d.deliveries + 1;
		state := k.state;
		RETURN NEXT;
		RETURN;
	END IF;
	-- Planned at each call, for the table as it is now: a plan cached
	-- while few entries were parked (a scan and a sort) would stay in use
	-- once a key has a million, for every step of its drain.
	RETURN QUERY EXECUTE
		'SELECT ''entry''::text, e.entry_id, e.event_id, e.topic, e.key, e.payload, e.headers, e.deliveries + 1, $4
		   FROM outbox.parked_entries e
		  WHERE e.consumer = $1 AND e.stream = $2 AND e.key_hash = $3
		  ORDER BY e.pos_ms, e.pos_seq
		  LIMIT $5'
		USING k.consumer, k.stream, k.key_hash, k.state, max_entries;
END
$$;
COMMENT ON FUNCTION outbox.parked_take_unchecked(text, text, bytea, integer) IS
	'pg_outbox: body of outbox.parked_take(), called after its consumer check; granted to nobody';

-- Body of inbox_parked_keys(): the parked keys of a consumer (of the
-- streams given, or all), by stream and first failure. The key as text
-- where it decodes (a parked key normally does: its handler ran), NULL
-- where it does not; key_bytes as received, always.
CREATE FUNCTION outbox.inbox_parked_keys_unchecked(of_consumer text, streams text[])
RETURNS TABLE (consumer text, stream text, key text, key_bytes bytea, state text, first_failed_at timestamptz,
			   last_failed_at timestamptz, parked bigint, deliveries integer, reason text, sqlstate text,
			   head_entry_id text, dead_letter_id bigint, redrive_requested_at timestamptz, redrive_requested_by name)
LANGUAGE plpgsql STABLE PARALLEL RESTRICTED SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	decodes boolean := true;
	p outbox.parked_keys;
BEGIN
	-- Every key decodes, checked first (a subtransaction that writes
	-- nothing): the listing is then one query. Otherwise each key that
	-- does not is listed without its text, and the listing still answers
	-- (the relay's poll reads it).
	BEGIN
		PERFORM count(convert_from(x.key, 'UTF8'))
		   FROM outbox.parked_keys x
		  WHERE x.consumer = of_consumer AND (streams IS NULL OR x.stream = ANY (streams));
	EXCEPTION WHEN character_not_in_repertoire OR untranslatable_character THEN
		decodes := false;
	END;
	IF decodes THEN
		RETURN QUERY
			SELECT x.consumer::text, x.stream::text, convert_from(x.key, 'UTF8'), x.key, x.state, x.first_failed_at,
				   x.last_failed_at, x.parked, x.deliveries, x.reason, x.sqlstate, x.head_entry_id, x.dead_letter_id,
				   x.redrive_requested_at, x.redrive_requested_by
			  FROM outbox.parked_keys x
			 WHERE x.consumer = of_consumer AND (streams IS NULL OR x.stream = ANY (streams))
			 ORDER BY x.stream, x.first_failed_at, x.key_hash;
		RETURN;
	END IF;
	FOR p IN
		SELECT x.* FROM outbox.parked_keys x
		 WHERE x.consumer = of_consumer AND (streams IS NULL OR x.stream = ANY (streams))
		 ORDER BY x.stream, x.first_failed_at, x.key_hash
	LOOP
		BEGIN
			key := convert_from(p.key, 'UTF8');
		EXCEPTION WHEN character_not_in_repertoire OR untranslatable_character THEN
			key := NULL;
		END;
		consumer := p.consumer;
		stream := p.stream;
		key_bytes := p.key;
		state := p.state;
		first_failed_at := p.first_failed_at;
		last_failed_at := p.last_failed_at;
		parked := p.parked;
		deliveries := p.deliveries;
		reason := p.reason;
		sqlstate := p.sqlstate;
		head_entry_id := p.head_entry_id;
		dead_letter_id := p.dead_letter_id;
		redrive_requested_at := p.redrive_requested_at;
		redrive_requested_by := p.redrive_requested_by;
		RETURN NEXT;
	END LOOP;
END
$$;
COMMENT ON FUNCTION outbox.inbox_parked_keys_unchecked(text, text[]) IS
	'pg_outbox: body of inbox_parked_keys(), called after its consumer check; granted to nobody';

-- Body of inbox_redrive(): for each parked row of the key (of one stream,
-- or of every stream of the consumer), in stream order:
--   dead -> draining, with who asked and when ('requested'); but a head
--     whose dead letter holds no event (the stream lost the entry before
--     its fields were kept) cannot be applied: left dead ('no event:
--     inbox_skip it');
--   draining: 'already draining';
--   retrying: left as it is ('retrying'): the relay retries the head
--     itself, and the key drains when it applies.
-- A key parked nowhere gives one row, 'not parked': a no-op, not an error.
CREATE FUNCTION outbox.inbox_redrive_unchecked(consumer text, key text, of_stream text)
RETURNS TABLE (stream text, state text, parked bigint, result text)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	k outbox.parked_keys;
BEGIN
	IF key IS NULL THEN
		RAISE EXCEPTION 'key must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	FOR k IN
		SELECT p.* FROM outbox.parked_keys p
		 WHERE p.consumer = inbox_redrive_unchecked.consumer
		   AND p.key_hash = sha256(convert_to(inbox_redrive_unchecked.key, 'UTF8'))
		   AND (of_stream IS NULL OR p.stream = of_stream)
		 ORDER BY p.stream
		   FOR UPDATE
	LOOP
		stream := k.stream;
		state := k.state;
		parked := k.parked;
		IF k.state = 'dead' THEN
			IF EXISTS (SELECT 1 FROM outbox.dead_letters d
						WHERE d.id = k.dead_letter_id AND d.replayed_at IS NULL AND d.skipped_at IS NULL
						  AND d.fields IS NULL AND (d.event_id IS NULL OR d.payload IS NULL)) THEN
				result := 'no event: inbox_skip it';
			ELSE
				UPDATE outbox.parked_keys p
				   SET state = 'draining', redrive_requested_at = now(), redrive_requested_by = session_user
				 WHERE p.consumer = k.consumer AND p.stream = k.stream AND p.key_hash = k.key_hash;
				state := 'draining';
				result := 'requested';
			END IF;
		ELSIF k.state = 'draining' THEN
			result := 'already draining';
		ELSE
			result := 'retrying';
		END IF;
		RETURN NEXT;
	END LOOP;
	IF NOT FOUND THEN
		stream := of_stream;
		state := NULL;
		parked := 0;
		result := 'not parked';
		RETURN NEXT;
	END IF;
END
$$;
COMMENT ON FUNCTION outbox.inbox_redrive_unchecked(text, text, text) IS
	'pg_outbox: body of inbox_redrive(), called after its consumer check; granted to nobody';

-- Body of inbox_skip(): for each parked row of the key, in stream order:
--   dead or draining with its head's dead letter pending: the dead letter
--     is given up (skipped_at, skipped_by: the session user) and the key
--     drains the rest ('skipped');
--   dead with no dead letter pending (replayed by hand meanwhile): the key
--     drains ('requested');
--   draining with nothing to skip: 'already draining';
--   retrying: left as it is ('retrying'): its head is no dead letter yet.
-- A key parked nowhere gives one row, 'not parked'.
CREATE FUNCTION outbox.inbox_skip_unchecked(consumer text, key text, of_stream text)
RETURNS TABLE (stream text, state text, parked bigint, result text)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	k outbox.parked_keys;
	pending boolean;
BEGIN
	IF key IS NULL THEN
		RAISE EXCEPTION 'key must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	FOR k IN
		SELECT p.* FROM outbox.parked_keys p
		 WHERE p.consumer = inbox_skip_unchecked.consumer
		   AND p.key_hash = sha256(convert_to(inbox_skip_unchecked.key, 'UTF8'))
		   AND (of_stream IS NULL OR p.stream = of_stream)
		 ORDER BY p.stream
		   FOR UPDATE
	LOOP
		stream := k.stream;
		state := k.state;
		parked := k.parked;
		IF k.state = 'retrying' THEN
			result := 'retrying';
		ELSE
			UPDATE outbox.dead_letters d
			   SET skipped_at = now(), skipped_by = session_user
			 WHERE d.id = k.dead_letter_id AND d.replayed_at IS NULL AND d.skipped_at IS NULL;
			pending := FOUND;
			IF pending OR k.state = 'dead' THEN
				UPDATE outbox.parked_keys p
				   SET state = 'draining', redrive_requested_at = now(), redrive_requested_by = session_user
				 WHERE p.consumer = k.consumer AND p.stream = k.stream AND p.key_hash = k.key_hash;
				state := 'draining';
				result := CASE WHEN pending THEN 'skipped' ELSE 'requested' END;
			ELSE
				result := 'already draining';
			END IF;
		END IF;
		RETURN NEXT;
	END LOOP;
	IF NOT FOUND THEN
		stream := of_stream;
		state := NULL;
		parked := 0;
		result := 'not parked';
		RETURN NEXT;
	END IF;
END
$$;
COMMENT ON FUNCTION outbox.inbox_skip_unchecked(text, text, text) IS
	'pg_outbox: body of inbox_skip(), called after its consumer check; granted to nobody';

-- @engine redrive@

-- One drain step of a parked key, in the caller's transaction; one row.
-- outbox.parked_take() locks the key's row (a parker of the key waits for
-- the step's transaction) and says what to apply:
--   - the head's dead letter, alone, through inbox_consume(isolate);
--   - or the next entries (at most max_entries), in stream order: through
--     one inbox_consume() in one exception block, which is the common
--     case (one subtransaction for the step); if that raises, entry by
--     entry, each through inbox_consume(isolate) (a subtransaction each),
--     up to the first that fails.
-- An entry found malformed or in conflict is dead-lettered alone (no
-- handler fix could apply it) and the step goes on; one that fails stops
-- the step: it and the later ones stay parked. The entries done go from
-- outbox.parked_entries with outbox.parked_settle(), which un-parks the
-- key when nothing is left (key_state NULL). The failure is returned,
-- not recorded: the relay classifies it and records it with
-- inbox_park_key() (deliveries: the number of the delivery that failed).
-- The head's dead letter, when it fails (also as malformed or in
-- conflict), is such a failure: it stays the key's head.
--
-- applied counts the entries done through the inbox (applied, or
-- duplicates of events it had), dead_lettered those dead-lettered alone.
--
-- It runs as the caller, with the caller's search_path, as inbox_consume()
-- does, so that the handler runs with the consumer's own privileges and
-- names: no SET clause, every name it resolves itself is qualified.
CREATE FUNCTION @extschema@.inbox_redrive_step(consumer text, handler text, stream text, key bytea,
											   max_entries integer DEFAULT 64)
RETURNS TABLE (applied integer, dead_lettered integer, failed_entry_id text, error_code text, error_message text,
			   deliveries integer, key_state text)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
	names CONSTANT pg_catalog.text[] := '{event_id,topic,key,payload,headers}';
	kinds pg_catalog.text[];
	ids pg_catalog.text[];
	evs pg_catalog.bytea[];
	tops pg_catalog.bytea[];
	ks pg_catalog.bytea[];
	pays pg_catalog.bytea[];
	hdrs pg_catalog.bytea[];
	dels integer[];
	states pg_catalog.text[];
	n integer;
	i integer;
	f integer;
	batch boolean;
	st pg_catalog.text[];
	codes pg_catalog.text[];
	messages pg_catalog.text[];
	one record;
	settled pg_catalog.text[] := '{}';
	fields pg_catalog.bytea[];
	value pg_catalog.bytea;
BEGIN
	IF consumer IS NULL OR handler IS NULL OR stream IS NULL OR key IS NULL OR max_entries IS NULL THEN
		RAISE EXCEPTION '% must not be null',
			CASE WHEN consumer IS NULL THEN 'consumer' WHEN handler IS NULL THEN 'handler'
				 WHEN stream IS NULL THEN 'stream' WHEN key IS NULL THEN 'key' ELSE 'max_entries' END
			USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF handler OPERATOR(pg_catalog.=) '' THEN
		RAISE EXCEPTION 'handler must not be empty' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF max_entries OPERATOR(pg_catalog.<) 1 OR max_entries OPERATOR(pg_catalog.>) 64 THEN
		RAISE EXCEPTION 'max_entries must be between 1 and 64'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = pg_catalog.format('It is %s. A step applies its entries in one transaction, and after a failure each in a subtransaction of its own.', max_entries);
	END IF;
	applied := 0;
	dead_lettered := 0;

	SELECT pg_catalog.array_agg(t.kind ORDER BY t.o), pg_catalog.array_agg(t.entry_id ORDER BY t.o),
		   pg_catalog.array_agg(t.event_id ORDER BY t.o), pg_catalog.array_agg(t.topic ORDER BY t.o),
		   pg_catalog.array_agg(t.key ORDER BY t.o), pg_catalog.array_agg(t.payload ORDER BY t.o),
		   pg_catalog.array_agg(t.headers ORDER BY t.o), pg_catalog.array_agg(t.deliveries ORDER BY t.o),
		   pg_catalog.array_agg(t.state ORDER BY t.o)
	  INTO kinds, ids, evs, tops, ks, pays, hdrs, dels, states
	  FROM outbox.parked_take(consumer, stream, key, max_entries)
		   WITH ORDINALITY t(kind, entry_id, event_id, topic, key, payload, headers, deliveries, state, o);
	n := coalesce(pg_catalog.cardinality(kinds), 0);

	IF n OPERATOR(pg_catalog.>) 0 AND kinds[1] OPERATOR(pg_catalog.=) 'none' THEN
		key_state := states[1];
		RETURN NEXT;
		RETURN;
	END IF;

	IF n OPERATOR(pg_catalog.>) 0 AND kinds[1] OPERATOR(pg_catalog.=) 'dead_letter' THEN
		-- The head's dead letter, alone: in its own subtransaction, so that
		-- what it raises is its failure, reported.
		SELECT c.status, c.error_code, c.error_message INTO one
		  FROM @extschema@.inbox_consume(consumer, handler, ARRAY[evs[1]], ARRAY[tops[1]], ARRAY[ks[1]], ARRAY[pays[1]],
										 ARRAY[hdrs[1]], true) c;
		IF one.status OPERATOR(pg_catalog.=) ANY ('{applied,duplicate}'::pg_catalog.text[]) THEN
			applied := 1;
			key_state := outbox.parked_settle(consumer, stream, key, false, '{}'::pg_catalog.text[], true);
		ELSE
			failed_entry_id := ids[1];
			error_code := one.error_code;
			error_message := one.error_message;
			deliveries := dels[1];
			key_state := states[1];
		END IF;
		RETURN NEXT;
		RETURN;
	END IF;

	IF n OPERATOR(pg_catalog.>) 0 THEN
		-- The entries as one batch.
		BEGIN
			SELECT pg_catalog.array_agg(c.status ORDER BY c.ord), pg_catalog.array_agg(c.error_code ORDER BY c.ord),
				   pg_catalog.array_agg(c.error_message ORDER BY c.ord)
			  INTO st, codes, messages
			  FROM @extschema@.inbox_consume(consumer, handler, evs, tops, ks, pays, hdrs, false) c;
			batch := true;
		EXCEPTION WHEN OTHERS THEN
			batch := false;
		END;
		FOR i IN 1 .. n LOOP
			IF NOT batch THEN
				-- It raised: each entry in a subtransaction of its own, up
				-- to the first that fails.
				SELECT c.status, c.error_code, c.error_message INTO one
				  FROM @extschema@.inbox_consume(consumer, handler, ARRAY[evs[i]], ARRAY[tops[i]], ARRAY[ks[i]],
												 ARRAY[pays[i]], ARRAY[hdrs[i]], true) c;
				st[i] := one.status;
				codes[i] := one.error_code;
				messages[i] := one.error_message;
			END IF;
			IF st[i] OPERATOR(pg_catalog.=) ANY ('{applied,duplicate}'::pg_catalog.text[]) THEN
				applied := applied OPERATOR(pg_catalog.+) 1;
			ELSIF st[i] OPERATOR(pg_catalog.=) ANY ('{malformed,conflict}'::pg_catalog.text[]) THEN
				-- Dead-lettered alone, with its fields as received.
				fields := '{}';
				FOR f IN 1 .. 5 LOOP
					value := (ARRAY[evs[i], tops[i], ks[i], pays[i], hdrs[i]])[f];
					CONTINUE WHEN value IS NULL;
					fields := pg_catalog.array_cat(fields, ARRAY[pg_catalog.convert_to(names[f], 'UTF8'), value]);
				END LOOP;
				PERFORM @extschema@.inbox_dead_letter(consumer, stream, ids[i], fields, coalesce(messages[i], st[i]), codes[i],
													  dels[i]);
				dead_lettered := dead_lettered OPERATOR(pg_catalog.+) 1;
			ELSE
				failed_entry_id := ids[i];
				error_code := codes[i];
				error_message := messages[i];
				deliveries := dels[i];
				EXIT;
			END IF;
			settled := pg_catalog.array_append(settled, ids[i]);
		END LOOP;
	END IF;
	key_state := outbox.parked_settle(consumer, stream, key, false, settled, false);
	RETURN NEXT;
END
$$;
COMMENT ON FUNCTION @extschema@.inbox_redrive_step(text, text, text, bytea, integer) IS
	'pg_outbox: one drain step of a parked key, in the caller''s transaction: its dead letter alone, or up to max_entries parked entries in order, through the handler; returns what it applied and the failure that stopped it';

--
-- Privileges: consumers drain, list, redrive and skip the keys of the
-- consumers their roles own (each entry checks); the bodies are granted to
-- nobody.
--
REVOKE ALL ON FUNCTION
	outbox.parked_take_unchecked(text, text, bytea, integer),
	outbox.parked_take(text, text, bytea, integer),
	outbox.inbox_parked_keys_unchecked(text, text[]),
	@extschema@.inbox_parked_keys(text, text[]),
	outbox.inbox_redrive_unchecked(text, text, text),
	@extschema@.inbox_redrive(text, text, text),
	outbox.inbox_skip_unchecked(text, text, text),
	@extschema@.inbox_skip(text, text, text),
	@extschema@.inbox_redrive_step(text, text, text, bytea, integer)
FROM PUBLIC;

GRANT EXECUTE ON FUNCTION
	outbox.parked_take(text, text, bytea, integer),
	@extschema@.inbox_parked_keys(text, text[]),
	@extschema@.inbox_redrive(text, text, text),
	@extschema@.inbox_skip(text, text, text),
	@extschema@.inbox_redrive_step(text, text, text, bytea, integer)
TO outbox_consumer, outbox_admin;
