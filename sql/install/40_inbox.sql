-- pg_outbox install script, part 40: the inbox, its consumers, dead letters.
-- (assembled with the other parts of sql/install/; see 00_schema_roles.sql).

--
-- The inbox: what each consumer applied, to apply every event once.
--

-- Consumer names compare byte by byte, as in outbox.consumers: the unique
-- indexes are probed for every event applied.
-- outbox.inbox is range-partitioned by day of application, so retention
-- drops whole partitions. Uniqueness of (consumer, event_id) holds within a
-- partition by a unique index, and across partitions because inbox_apply()
-- serializes applies of one event and looks in every partition first.
CREATE TABLE outbox.inbox (
	consumer text COLLATE pg_catalog."C" NOT NULL,
	event_id uuid NOT NULL,
	payload jsonb NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT pg_catalog.now()
) PARTITION BY RANGE (applied_at);
COMMENT ON TABLE outbox.inbox IS 'pg_outbox inbox: events applied per consumer, with the payload applied; partitioned by day';
CREATE TABLE outbox.inbox_default PARTITION OF outbox.inbox DEFAULT;
COMMENT ON TABLE outbox.inbox_default IS 'pg_outbox: inbox rows beyond the premade partitions (normally empty)';
CREATE UNIQUE INDEX inbox_default_consumer_event_id_key ON outbox.inbox_default (consumer, event_id);

-- The day maintenance takes as today (UTC): the real one, or
-- pg_outbox.today when set (tests run maintenance across days with it), by
-- a superuser.
CREATE FUNCTION outbox.inbox_today()
RETURNS date
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
	SELECT coalesce(nullif(outbox.superuser_setting('pg_outbox.today'), '')::date,
					(now() AT TIME ZONE 'UTC')::date)
$$;
COMMENT ON FUNCTION outbox.inbox_today() IS 'pg_outbox: today for inbox maintenance (UTC), or pg_outbox.today when set';

-- Creates the daily inbox partitions from today to three days ahead, each
-- with its (consumer, event_id) unique index, moving the rows of its day
-- out of the default partition (where applies land when maintenance did
-- not run in time) in the same transaction: an apply sees its event in
-- one or the other. The partitions are not members of the extension, so
-- pg_dump carries them and their rows: the inbox's memory of what each
-- consumer applied survives a dump and restore. Returns how many it
-- created.
CREATE FUNCTION outbox.inbox_premake_partitions()
RETURNS integer
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	today date := outbox.inbox_today();
	day date;
	lower timestamptz;
	upper timestamptz;
	part name;
	created integer := 0;
BEGIN
	-- Days of rows already in the default partition, and the days ahead.
	FOR day IN
		SELECT d FROM (SELECT DISTINCT (applied_at AT TIME ZONE 'UTC')::date AS d FROM outbox.inbox_default
					   UNION SELECT today + i FROM generate_series(0, 3) i) days
		 ORDER BY d
	LOOP
		part := format('inbox_%s', to_char(day, 'YYYYMMDD'));
		CONTINUE WHEN EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
							   WHERE n.nspname = 'outbox' AND c.relname = part);
		lower := day::timestamp AT TIME ZONE 'UTC';
		upper := (day + 1)::timestamp AT TIME ZONE 'UTC';
		LOCK TABLE outbox.inbox_default IN ACCESS EXCLUSIVE MODE;
		EXECUTE format('CREATE TABLE outbox.%I (LIKE outbox.inbox INCLUDING DEFAULTS)', part);
		PERFORM outbox.set_member(format('outbox.%I', part)::regclass, false);
		EXECUTE format('WITH moved AS (DELETE FROM outbox.inbox_default WHERE applied_at >= %L AND applied_at < %L RETURNING *)
						INSERT INTO outbox.%I SELECT * FROM moved', lower, upper, part);
		EXECUTE format('CREATE UNIQUE INDEX %I ON outbox.%I (consumer, event_id)',
					   part || '_consumer_event_id_key', part);
		EXECUTE format('ALTER TABLE outbox.%I ADD CONSTRAINT %I CHECK (applied_at >= %L AND applied_at < %L)',
					   part, part || '_bounds', lower, upper);
		EXECUTE format('ALTER TABLE outbox.inbox ATTACH PARTITION outbox.%I FOR VALUES FROM (%L) TO (%L)',
					   part, lower, upper);
		EXECUTE format('ALTER TABLE outbox.%I DROP CONSTRAINT %I', part, part || '_bounds');
		created := created + 1;
	END LOOP;
	RETURN created;
END
$$;
COMMENT ON FUNCTION outbox.inbox_premake_partitions() IS
	'pg_outbox: creates the inbox partitions from today to three days ahead, and those of rows in the default partition, moving those rows';

-- Drops the inbox partitions that end before today - inbox_retention.
-- Returns how many it dropped.
CREATE FUNCTION outbox.inbox_retire_partitions()
RETURNS integer
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	p record;
	dropped integer := 0;
BEGIN
	FOR p IN
		SELECT c.oid::regclass AS rel, c.relname
		  FROM pg_inherits i
		  JOIN pg_class c ON c.oid = i.inhrelid
		 WHERE i.inhparent = 'outbox.inbox'::regclass
		   AND c.relname ~ '^inbox_[0-9]{8}$'
		   AND to_date(substr(c.relname, 7), 'YYYYMMDD') + 1
			   <= ((outbox.inbox_today()::timestamp - (SELECT inbox_retention FROM outbox.config)))::date
		 ORDER BY c.relname
	LOOP
		PERFORM outbox.set_member(p.rel, false);
		EXECUTE format('DROP TABLE outbox.%I', p.relname);
		RAISE LOG 'pg_outbox: dropped inbox partition %', p.relname;
		dropped := dropped + 1;
	END LOOP;
	RETURN dropped;
END
$$;
COMMENT ON FUNCTION outbox.inbox_retire_partitions() IS 'pg_outbox: drops the inbox partitions older than inbox_retention';


--
-- Consumers: each consumer name belongs to a role. Only members of that
-- role (and of outbox_admin) may apply, consume, dead-letter or replay for
-- it (extension/inbox.c checks, then runs the body). The registry is
-- managed by outbox_admin through the functions below.
--
CREATE TABLE outbox.consumers (
	name text COLLATE "C" NOT NULL,
	owner regrole NOT NULL,
	created_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT consumers_pkey PRIMARY KEY (name),
	-- The rules of outbox.consumer_name_check(), repeated.
	CONSTRAINT consumers_name_check CHECK (name <> '' AND pg_catalog.octet_length(name) <= 255
										   AND name !~ '[\x01-\x1f\x7f]')
);
COMMENT ON TABLE outbox.consumers IS 'pg_outbox: registered inbox consumers and the role whose members may act for each';
COMMENT ON COLUMN outbox.consumers.owner IS 'members of this role (and of outbox_admin) may apply, consume, dead-letter and replay for the consumer';
SELECT pg_catalog.pg_extension_config_dump('outbox.consumers', '');

-- @engine consumers@

-- Errors unless a consumer's owner is a role that exists.
CREATE FUNCTION outbox.consumer_owner_check(owner regrole)
RETURNS void
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF owner IS NULL THEN
		RAISE EXCEPTION 'owner must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.oid = owner) THEN
		RAISE EXCEPTION 'role with OID % does not exist', owner::oid USING ERRCODE = 'undefined_object';
	END IF;
END
$$;
COMMENT ON FUNCTION outbox.consumer_owner_check(regrole) IS 'pg_outbox: errors when a consumer''s owner role is NULL or does not exist';

-- Registers a consumer owned by a role.
CREATE FUNCTION @extschema@.inbox_consumer_create(consumer text, owner regrole)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM outbox.consumer_name_check(consumer);
	PERFORM outbox.consumer_owner_check(owner);
	INSERT INTO outbox.consumers (name, owner) VALUES (consumer, owner) ON CONFLICT ON CONSTRAINT consumers_pkey DO NOTHING;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'consumer "%" already exists', consumer
			USING ERRCODE = 'duplicate_object',
				  HINT = 'Change its owner with inbox_consumer_set_owner().';
	END IF;
	RAISE LOG 'pg_outbox: consumer "%" registered for role %', consumer, owner;
END
$$;
COMMENT ON FUNCTION @extschema@.inbox_consumer_create(text, regrole) IS
	'pg_outbox: registers an inbox consumer; members of the owner role may act for it';

-- Gives a consumer another owner (also one whose owner was dropped).
CREATE FUNCTION @extschema@.inbox_consumer_set_owner(consumer text, owner regrole)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM outbox.consumer_name_check(consumer);
	PERFORM outbox.consumer_owner_check(owner);
	UPDATE outbox.consumers c SET owner = inbox_consumer_set_owner.owner WHERE c.name = consumer;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'consumer "%" does not exist', consumer USING ERRCODE = 'undefined_object';
	END IF;
	RAISE LOG 'pg_outbox: consumer "%" now owned by role %', consumer, owner;
END
$$;
COMMENT ON FUNCTION @extschema@.inbox_consumer_set_owner(text, regrole) IS
	'pg_outbox: gives an inbox consumer another owner role';

-- Unregisters a consumer. Its inbox rows, dead letters and parked keys
-- would outlive it unseen and come back to whoever registers the name
-- again, so it must have none, or forget => true deletes them with it.
CREATE FUNCTION @extschema@.inbox_consumer_drop(consumer text, forget boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	applied bigint;
	dead bigint;
	keys bigint;
	entries bigint;
BEGIN
	PERFORM outbox.consumer_name_check(consumer);
	IF forget IS NULL THEN
		RAISE EXCEPTION 'forget must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	PERFORM 1 FROM outbox.consumers c WHERE c.name = consumer FOR UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'consumer "%" does not exist', consumer USING ERRCODE = 'undefined_object';
	END IF;
	-- Applies, parks and drains in progress finish first, so that the
	-- counts see them.
	LOCK TABLE outbox.inbox, outbox.dead_letters, outbox.parked_keys, outbox.parked_entries IN SHARE MODE;
	SELECT count(*) INTO applied FROM outbox.inbox i WHERE i.consumer = inbox_consumer_drop.consumer;
	SELECT count(*) INTO dead FROM outbox.dead_letters d WHERE d.consumer = inbox_consumer_drop.consumer;
	SELECT count(*) INTO keys FROM outbox.parked_keys k WHERE k.consumer = inbox_consumer_drop.consumer;
	SELECT count(*) INTO entries FROM outbox.parked_entries e WHERE e.consumer = inbox_consumer_drop.consumer;
	IF (applied > 0 OR dead > 0 OR keys > 0 OR entries > 0) AND NOT forget THEN
		RAISE EXCEPTION 'consumer "%" still has applied events, dead letters or parked keys', consumer
			USING ERRCODE = 'dependent_objects_still_exist',
				  DETAIL = format('The inbox holds %s events, %s dead letters and %s parked keys with %s parked entries of it.',
								  applied, dead, keys, entries),
				  HINT = 'Pass forget => true to delete them with it, or give it another owner with inbox_consumer_set_owner().';
	END IF;
	DELETE FROM outbox.inbox i WHERE i.consumer = inbox_consumer_drop.consumer;
	DELETE FROM outbox.dead_letters d WHERE d.consumer = inbox_consumer_drop.consumer;
	DELETE FROM outbox.parked_keys k WHERE k.consumer = inbox_consumer_drop.consumer;
	DELETE FROM outbox.parked_entries e WHERE e.consumer = inbox_consumer_drop.consumer;
	DELETE FROM outbox.consumers c WHERE c.name = consumer;
	RAISE LOG 'pg_outbox: consumer "%" dropped with % events, % dead letters and % parked keys (% parked entries)',
		consumer, applied, dead, keys, entries;
END
$$;
COMMENT ON FUNCTION @extschema@.inbox_consumer_drop(text, boolean) IS
	'pg_outbox: unregisters an inbox consumer; refused while it has inbox rows, dead letters or parked keys unless forget => true deletes them';

-- The registered consumers.
CREATE FUNCTION @extschema@.inbox_consumers()
RETURNS TABLE (consumer text, owner regrole, owner_exists boolean, created_at timestamptz)
LANGUAGE sql STABLE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
	SELECT c.name, c.owner, EXISTS (SELECT 1 FROM pg_roles r WHERE r.oid = c.owner), c.created_at
	  FROM outbox.consumers c
	 ORDER BY c.name
$$;
COMMENT ON FUNCTION @extschema@.inbox_consumers() IS
	'pg_outbox: the registered inbox consumers, their owner roles, and whether each owner still exists';

--
-- Stream entries. A consumer receives an entry's fields as bytes; each
-- field is decoded on its own, so that a malformed one fails its entry
-- alone. These casts define what a field must hold; inbox_consume()
-- checks the same rules in C first, without raising (consume.c).
--

-- A field as text: valid UTF-8 without NUL bytes (22021), representable
-- in the database's encoding (22P05).
CREATE FUNCTION outbox.entry_text(value bytea)
RETURNS text
LANGUAGE sql STABLE STRICT PARALLEL SAFE
AS $$ SELECT pg_catalog.convert_from(value, 'UTF8') $$;
COMMENT ON FUNCTION outbox.entry_text(bytea) IS 'pg_outbox: a stream entry''s field as text (UTF-8, no NUL)';

-- A field as a uuid (22P02 when it is none).
CREATE FUNCTION outbox.entry_uuid(value bytea)
RETURNS uuid
LANGUAGE sql STABLE STRICT PARALLEL SAFE
AS $$ SELECT outbox.entry_text(value)::pg_catalog.uuid $$;
COMMENT ON FUNCTION outbox.entry_uuid(bytea) IS 'pg_outbox: a stream entry''s field as a uuid';

-- A field as jsonb (22P02 for invalid JSON, 22P05 for \u0000, 54000 when
-- too large).
CREATE FUNCTION outbox.entry_json(value bytea)
RETURNS jsonb
LANGUAGE sql STABLE STRICT PARALLEL SAFE
AS $$ SELECT outbox.entry_text(value)::pg_catalog.jsonb $$;
COMMENT ON FUNCTION outbox.entry_json(bytea) IS 'pg_outbox: a stream entry''s field as jsonb';

-- The value of the first field called "name" of an entry's fields (names
-- and values in turn), NULL when there is none.
CREATE FUNCTION outbox.entry_field(fields bytea[], name text)
RETURNS bytea
LANGUAGE sql STABLE STRICT PARALLEL SAFE
AS $$
	SELECT fields[i + 1]
	  FROM pg_catalog.generate_subscripts(fields, 1) i
	 WHERE (i - pg_catalog.array_lower(fields, 1)) % 2 = 0
	   AND fields[i] = pg_catalog.convert_to(name, 'UTF8')
	 ORDER BY i
	 LIMIT 1
$$;
COMMENT ON FUNCTION outbox.entry_field(bytea[], text) IS 'pg_outbox: the value of a named field of a stream entry''s raw fields';

--
-- Applying.
--

-- @engine inbox_record@

-- The body of inbox_apply(), which checks the consumer first. Applies an
-- event for a consumer, once: true the first time (the caller applies its
-- effect in the same transaction), false for a redelivery with an equal
-- payload; the same id with another payload is an identity conflict,
-- SQLSTATE OB001.
CREATE FUNCTION outbox.inbox_apply_unchecked(consumer text, event_id uuid, payload jsonb)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	applied jsonb;
BEGIN
	IF event_id IS NULL OR payload IS NULL THEN
		RAISE EXCEPTION '% must not be null', CASE WHEN event_id IS NULL THEN 'event_id' ELSE 'payload' END
			USING ERRCODE = 'null_value_not_allowed';
	END IF;
	applied := (outbox.inbox_record(consumer, ARRAY[event_id], ARRAY[payload]))[1];
	IF applied IS NULL THEN
		RETURN true;
	ELSIF applied = payload THEN
		RETURN false;
	END IF;
	RAISE EXCEPTION 'event % was already applied by consumer "%" with another payload', event_id, consumer
		USING ERRCODE = 'OB001',
			  DETAIL = format('Applied payload: %s. Received payload: %s.', applied, payload),
			  HINT = 'Two different events carry the same event id. Nothing was applied; find the producer that reused the id.';
END
$$;
COMMENT ON FUNCTION outbox.inbox_apply_unchecked(text, uuid, jsonb) IS
	'pg_outbox: body of inbox_apply(), called after its consumer check; granted to nobody';

-- @engine inbox_apply@

--
-- Dead letters: entries a consumer gave up on, kept with why.
--
CREATE TABLE outbox.dead_letters (
	id bigint GENERATED ALWAYS AS IDENTITY,
	consumer text NOT NULL,
	event_id uuid,
	stream text NOT NULL,
	entry_id text NOT NULL,
	topic text,
	key text,
	payload jsonb,
	applied_payload jsonb,
	headers jsonb,
	fields bytea[],
	reason text NOT NULL,
	sqlstate text,
	deliveries integer NOT NULL DEFAULT 1,
	first_failed_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
	last_failed_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
	replayed_at timestamptz,
	skipped_at timestamptz,
	skipped_by name,
	CONSTRAINT dead_letters_pkey PRIMARY KEY (id),
	CONSTRAINT dead_letters_entry_key UNIQUE (consumer, stream, entry_id)
);
COMMENT ON TABLE outbox.dead_letters IS 'pg_outbox: stream entries a consumer gave up on, with the reason';
COMMENT ON COLUMN outbox.dead_letters.applied_payload IS 'for an identity conflict: the payload applied earlier under the same event id';
COMMENT ON COLUMN outbox.dead_letters.fields IS 'the stream entry''s fields exactly as received, names and values in turn (NULL when recorded from typed values)';
COMMENT ON COLUMN outbox.dead_letters.event_id IS 'the entry''s event_id field when it decodes';
COMMENT ON COLUMN outbox.dead_letters.payload IS 'the entry''s payload field when it decodes';
COMMENT ON COLUMN outbox.dead_letters.skipped_at IS 'when inbox_skip() gave the dead letter up, so that the later entries of its key could drain';
COMMENT ON COLUMN outbox.dead_letters.skipped_by IS 'the session user who gave the dead letter up with inbox_skip()';
SELECT pg_catalog.pg_extension_config_dump('outbox.dead_letters', '');

-- Records (or updates) a dead letter; returns its id.
CREATE FUNCTION outbox.dead_letter_record(consumer text, stream text, entry_id text, event_id uuid,
										  topic text, key text, payload jsonb, headers jsonb, fields bytea[],
										  reason text, sqlstate text, deliveries integer)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	dl_id bigint;
	applied jsonb;
BEGIN
	IF stream IS NULL OR entry_id IS NULL OR reason IS NULL THEN
		RAISE EXCEPTION 'consumer, stream, entry_id and reason must not be null'
			USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF event_id IS NOT NULL THEN
		SELECT i.payload INTO applied FROM outbox.inbox i
		 WHERE i.consumer = dead_letter_record.consumer AND i.event_id = dead_letter_record.event_id;
	END IF;
	INSERT INTO outbox.dead_letters AS d
		(consumer, event_id, stream, entry_id, topic, key, payload, applied_payload, headers, fields, reason,
		 sqlstate, deliveries)
	VALUES (consumer, event_id, stream, entry_id, topic, key, payload, applied, headers, fields, reason, sqlstate,
			greatest(coalesce(deliveries, 1), 1))
	ON CONFLICT ON CONSTRAINT dead_letters_entry_key DO UPDATE
		SET reason = excluded.reason, sqlstate = excluded.sqlstate,
			deliveries = greatest(d.deliveries, excluded.deliveries), last_failed_at = now(),
			applied_payload = coalesce(excluded.applied_payload, d.applied_payload),
			fields = coalesce(excluded.fields, d.fields)
	RETURNING d.id INTO dl_id;
	RETURN dl_id;
END
$$;
COMMENT ON FUNCTION outbox.dead_letter_record(text, text, text, uuid, text, text, jsonb, jsonb, bytea[], text, text, integer) IS
	'pg_outbox: records or updates a dead letter; granted to nobody';

-- Body of inbox_dead_letter() from typed values.
CREATE FUNCTION outbox.inbox_dead_letter_unchecked(consumer text, stream text, entry_id text, event_id uuid,
												   topic text, key text, payload jsonb, headers jsonb,
												   reason text, sqlstate text DEFAULT NULL, deliveries integer DEFAULT 1)
RETURNS bigint
LANGUAGE sql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
	SELECT outbox.dead_letter_record(consumer, stream, entry_id, event_id, topic, key, payload, headers, NULL,
									 reason, sqlstate, deliveries)
$$;
COMMENT ON FUNCTION outbox.inbox_dead_letter_unchecked(text, text, text, uuid, text, text, jsonb, jsonb, text, text, integer) IS
	'pg_outbox: body of inbox_dead_letter() from typed values, called after its consumer check; granted to nobody';

-- Body of inbox_dead_letter() from an entry's raw fields: kept as
-- received; each typed column filled when its field decodes.
CREATE FUNCTION outbox.inbox_dead_letter_unchecked(consumer text, stream text, entry_id text, fields bytea[],
												   reason text, sqlstate text DEFAULT NULL, deliveries integer DEFAULT 1)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	v_event_id uuid;
	v_topic text;
	v_key text;
	v_payload jsonb;
	v_headers jsonb;
BEGIN
	IF fields IS NOT NULL AND (array_ndims(fields) > 1 OR cardinality(fields) % 2 <> 0) THEN
		RAISE EXCEPTION 'fields must hold names and values in turn'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = format('The array has %s dimensions and %s elements.', array_ndims(fields), cardinality(fields));
	END IF;
	BEGIN
		v_event_id := outbox.entry_uuid(outbox.entry_field(fields, 'event_id'));
	EXCEPTION WHEN OTHERS THEN
		NULL;
	END;
	BEGIN
		v_topic := outbox.entry_text(outbox.entry_field(fields, 'topic'));
	EXCEPTION WHEN OTHERS THEN
		NULL;
	END;
	BEGIN
		v_key := outbox.entry_text(outbox.entry_field(fields, 'key'));
	EXCEPTION WHEN OTHERS THEN
		NULL;
	END;
	BEGIN
		v_payload := outbox.entry_json(outbox.entry_field(fields, 'payload'));
	EXCEPTION WHEN OTHERS THEN
		NULL;
	END;
	BEGIN
		v_headers := outbox.entry_json(outbox.entry_field(fields, 'headers'));
	EXCEPTION WHEN OTHERS THEN
		NULL;
	END;
	RETURN outbox.dead_letter_record(consumer, stream, entry_id, v_event_id, v_topic, v_key, v_payload, v_headers,
									 fields, reason, sqlstate, deliveries);
END
$$;
COMMENT ON FUNCTION outbox.inbox_dead_letter_unchecked(text, text, text, bytea[], text, text, integer) IS
	'pg_outbox: body of inbox_dead_letter() from raw fields, called after its consumer check; granted to nobody';

-- @engine inbox_consume@

-- Body of outbox.dead_letter_take(): locks a dead letter, marks it
-- replayed, and returns it.
CREATE FUNCTION outbox.dead_letter_take_unchecked(dead_letter_id bigint)
RETURNS outbox.dead_letters
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	d outbox.dead_letters;
BEGIN
	UPDATE outbox.dead_letters dl SET replayed_at = now() WHERE dl.id = dead_letter_id RETURNING dl.* INTO d;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'dead letter % does not exist', dead_letter_id USING ERRCODE = 'undefined_object';
	END IF;
	RETURN d;
END
$$;
COMMENT ON FUNCTION outbox.dead_letter_take_unchecked(bigint) IS
	'pg_outbox: body of outbox.dead_letter_take(), called after its consumer check; granted to nobody';

-- @engine dead_letter_take@

-- Applies a dead letter again with its original event id (so the inbox
-- still dedupes it), through a handler, in the caller's transaction.
-- Returns 'applied' or 'duplicate'; an identity conflict raises OB001.
-- Runs as the caller, so the handler runs with the caller's privileges.
CREATE FUNCTION @extschema@.inbox_replay(dead_letter_id bigint, handler text)
RETURNS text
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
	d outbox.dead_letters;
	result text;
	tp text;
	ts text;
	caller_tp text;
	caller_ts text;
BEGIN
	IF dead_letter_id IS NULL OR handler IS NULL THEN
		RAISE EXCEPTION 'dead_letter_id and handler must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	d := outbox.dead_letter_take(dead_letter_id);
	IF d.event_id IS NULL OR d.payload IS NULL THEN
		IF d.fields IS NULL THEN
			RAISE EXCEPTION 'dead letter % has no event to replay', dead_letter_id
				USING ERRCODE = 'object_not_in_prerequisite_state',
					  DETAIL = pg_catalog.format('Entry %s of stream "%s" was gone from the stream: %s', d.entry_id, d.stream, d.reason),
					  HINT = 'Republish the event from the producer''s outbox (outbox_rewind) instead.';
		END IF;
		RAISE EXCEPTION 'dead letter % has no event to replay', dead_letter_id
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  DETAIL = pg_catalog.format('Entry %s of stream "%s" could not be read: %s', d.entry_id, d.stream, d.reason),
				  HINT = 'Its fields are kept as received in outbox.dead_letters.fields. Republish a corrected event from the producer.';
	END IF;
	IF @extschema@.inbox_apply(d.consumer, d.event_id, d.payload) THEN
		-- As inbox_consume() runs a handler: $6 the event's valid
		-- traceparent, and its trace context in the settings while the
		-- handler runs (the caller's set again after).
		SELECT t.traceparent, t.tracestate INTO tp, ts FROM outbox.trace_context(d.headers) t;
		caller_tp := pg_catalog.current_setting('pg_outbox.traceparent', true);
		caller_ts := pg_catalog.current_setting('pg_outbox.tracestate', true);
		PERFORM pg_catalog.set_config('pg_outbox.traceparent', coalesce(tp, ''), true),
				pg_catalog.set_config('pg_outbox.tracestate', coalesce(ts, ''), true);
		EXECUTE handler USING d.topic, d.key, d.payload, d.headers, d.event_id, tp;
		PERFORM pg_catalog.set_config('pg_outbox.traceparent', coalesce(caller_tp, ''), true),
				pg_catalog.set_config('pg_outbox.tracestate', coalesce(caller_ts, ''), true);
		result := 'applied';
	ELSE
		result := 'duplicate';
	END IF;
	RETURN result;
END
$$;
COMMENT ON FUNCTION @extschema@.inbox_replay(bigint, text) IS
	'pg_outbox: applies a dead letter again with its original event id, through a handler; returns applied or duplicate';


--
-- Privileges: consumers act for the consumers their roles own; admins manage them.
--
REVOKE ALL ON TABLE outbox.inbox, outbox.inbox_default, outbox.consumers, outbox.dead_letters FROM PUBLIC;
REVOKE ALL ON FUNCTION
	outbox.inbox_today(),
	outbox.inbox_premake_partitions(),
	outbox.inbox_retire_partitions(),
	outbox.consumer_name_check(text),
	@extschema@.inbox_consumer_check(text),
	outbox.consumer_owner_check(regrole),
	@extschema@.inbox_consumer_create(text, regrole),
	@extschema@.inbox_consumer_set_owner(text, regrole),
	@extschema@.inbox_consumer_drop(text, boolean),
	@extschema@.inbox_consumers(),
	outbox.entry_text(bytea),
	outbox.entry_uuid(bytea),
	outbox.entry_json(bytea),
	outbox.entry_field(bytea[], text),
	outbox.inbox_record(text, uuid[], jsonb[]),
	outbox.inbox_apply_unchecked(text, uuid, jsonb),
	@extschema@.inbox_apply(text, uuid, jsonb),
	outbox.dead_letter_record(text, text, text, uuid, text, text, jsonb, jsonb, bytea[], text, text, integer),
	outbox.inbox_dead_letter_unchecked(text, text, text, uuid, text, text, jsonb, jsonb, text, text, integer),
	outbox.inbox_dead_letter_unchecked(text, text, text, bytea[], text, text, integer),
	@extschema@.inbox_dead_letter(text, text, text, uuid, text, text, jsonb, jsonb, text, text, integer),
	@extschema@.inbox_dead_letter(text, text, text, bytea[], text, text, integer),
	@extschema@.inbox_consume(text, text, bytea[], bytea[], bytea[], bytea[], bytea[], boolean),
	outbox.dead_letter_take_unchecked(bigint),
	outbox.dead_letter_take(bigint),
	@extschema@.inbox_replay(bigint, text)
FROM PUBLIC;

GRANT SELECT ON outbox.inbox, outbox.dead_letters, outbox.consumers TO outbox_admin;

-- Consumers act only for the consumers their roles own: each of these
-- checks the consumer before it touches the inbox (extension/inbox.c).
-- The *_unchecked bodies, outbox.inbox_record() and
-- outbox.dead_letter_record() are granted to nobody.
GRANT EXECUTE ON FUNCTION
	@extschema@.inbox_apply(text, uuid, jsonb),
	@extschema@.inbox_dead_letter(text, text, text, uuid, text, text, jsonb, jsonb, text, text, integer),
	@extschema@.inbox_dead_letter(text, text, text, bytea[], text, text, integer),
	@extschema@.inbox_consume(text, text, bytea[], bytea[], bytea[], bytea[], bytea[], boolean),
	@extschema@.inbox_replay(bigint, text),
	@extschema@.inbox_consumer_check(text),
	outbox.dead_letter_take(bigint),
	outbox.entry_text(bytea),
	outbox.entry_uuid(bytea),
	outbox.entry_json(bytea)
TO outbox_consumer, outbox_admin;

GRANT EXECUTE ON FUNCTION
	@extschema@.inbox_consumer_create(text, regrole),
	@extschema@.inbox_consumer_set_owner(text, regrole),
	@extschema@.inbox_consumer_drop(text, boolean),
	@extschema@.inbox_consumers()
TO outbox_admin;
