-- pg_outbox install script, part 45: parked keys (consume --on-failure park-key).
-- (assembled with the other parts of sql/install/; see 00_schema_roles.sql).

--
-- A key parks at the first entry fault of one of its entries (its head):
-- from then on every later entry of that (consumer, stream, key) that any
-- worker reads is stored here instead of applied, in the transaction of
-- its batch, and acknowledged in the stream only once that committed
-- (I-9). The head is retried as before (state retrying); when it applies
-- the key drains (draining) and un-parks; when it is dead-lettered the key
-- waits (dead) for inbox_redrive() or inbox_skip(). So no later entry of a
-- key is applied while an earlier one waits for a retry or lies in the
-- dead letters (I-20).
--
-- A key is the key field's bytes, per consumer and stream: two entries
-- with the same bytes have the same key, however they decode. The tables
-- are indexed by the key's SHA-256, so that a key of any length fits a
-- btree. They have no identity column (pg_dump needs no sequence value)
-- and maintenance never touches them: a parked entry was acknowledged in
-- the stream, so it lives here only, past any trimming of the stream.
--

CREATE TABLE outbox.parked_keys (
	consumer text COLLATE pg_catalog."C" NOT NULL,
	stream text COLLATE pg_catalog."C" NOT NULL,
	key bytea NOT NULL,
	key_hash bytea GENERATED ALWAYS AS (pg_catalog.sha256(key)) STORED,
	state text NOT NULL,
	head_entry_id text NOT NULL,
	head_fields bytea[],
	dead_letter_id bigint,
	parked bigint NOT NULL DEFAULT 0,
	deliveries integer NOT NULL DEFAULT 1,
	reason text NOT NULL,
	sqlstate text,
	first_failed_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
	last_failed_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
	redrive_requested_at timestamptz,
	redrive_requested_by name,
	CONSTRAINT parked_keys_pkey PRIMARY KEY (consumer, stream, key_hash),
	CONSTRAINT parked_keys_state_check CHECK (state IN ('retrying', 'draining', 'dead')),
	CONSTRAINT parked_keys_dead_check CHECK (state <> 'dead' OR dead_letter_id IS NOT NULL)
);
COMMENT ON TABLE outbox.parked_keys IS
	'pg_outbox: keys of a consumer''s streams whose later entries are parked, one row per (consumer, stream, key), with the state of the entry that failed first';
COMMENT ON COLUMN outbox.parked_keys.key IS 'the entry''s key field, as received (bytes)';
COMMENT ON COLUMN outbox.parked_keys.key_hash IS 'SHA-256 of the key: the key''s identity in the indexes, whatever its length';
COMMENT ON COLUMN outbox.parked_keys.state IS 'retrying: the head is pending in the stream and retried; draining: the parked entries are being applied in order; dead: the head is dead-lettered and waits for inbox_redrive() or inbox_skip()';
COMMENT ON COLUMN outbox.parked_keys.head_entry_id IS 'the stream entry of the key that failed first';
COMMENT ON COLUMN outbox.parked_keys.head_fields IS 'the head''s fields exactly as received while it is retrying (its dead letter is made from them if the stream loses it)';
COMMENT ON COLUMN outbox.parked_keys.dead_letter_id IS 'the head''s dead letter in outbox.dead_letters (no foreign key: the settings tables are dumped in no order)';
COMMENT ON COLUMN outbox.parked_keys.parked IS 'how many entries of the key are in outbox.parked_entries';
COMMENT ON COLUMN outbox.parked_keys.deliveries IS 'how many times the head was delivered and failed';
COMMENT ON COLUMN outbox.parked_keys.reason IS 'why the head failed last';
COMMENT ON COLUMN outbox.parked_keys.redrive_requested_at IS 'when inbox_redrive() or inbox_skip() last set the key draining';
COMMENT ON COLUMN outbox.parked_keys.redrive_requested_by IS 'the session user who called inbox_redrive() or inbox_skip() last';
SELECT pg_catalog.pg_extension_config_dump('outbox.parked_keys', '');

CREATE TABLE outbox.parked_entries (
	consumer text COLLATE pg_catalog."C" NOT NULL,
	stream text COLLATE pg_catalog."C" NOT NULL,
	entry_id text NOT NULL,
	pos_ms numeric GENERATED ALWAYS AS (pg_catalog.split_part(entry_id, '-'::pg_catalog.text, 1)::pg_catalog.numeric) STORED,
	pos_seq numeric GENERATED ALWAYS AS (pg_catalog.split_part(entry_id, '-'::pg_catalog.text, 2)::pg_catalog.numeric) STORED,
	event_id bytea,
	topic bytea,
	key bytea NOT NULL,
	payload bytea,
	headers bytea,
	key_hash bytea GENERATED ALWAYS AS (pg_catalog.sha256(key)) STORED,
	deliveries integer NOT NULL DEFAULT 0,
	reason text,
	sqlstate text,
	parked_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT parked_entries_pkey PRIMARY KEY (consumer, stream, entry_id)
);
CREATE INDEX parked_entries_order ON outbox.parked_entries (consumer, stream, key_hash, pos_ms, pos_seq);
COMMENT ON TABLE outbox.parked_entries IS
	'pg_outbox: stream entries held back because an earlier entry of their key failed, kept as received until their key drains';
COMMENT ON COLUMN outbox.parked_entries.entry_id IS 'the stream entry id, "<ms>-<seq>"';
COMMENT ON COLUMN outbox.parked_entries.pos_ms IS 'the entry id''s first number: with pos_seq, the entry''s order in its stream';
COMMENT ON COLUMN outbox.parked_entries.pos_seq IS 'the entry id''s second number';
COMMENT ON COLUMN outbox.parked_entries.event_id IS 'the entry''s event_id field, as received (bytes)';
COMMENT ON COLUMN outbox.parked_entries.topic IS 'the entry''s topic field, as received (bytes)';
COMMENT ON COLUMN outbox.parked_entries.key IS 'the entry''s key field, as received (bytes)';
COMMENT ON COLUMN outbox.parked_entries.payload IS 'the entry''s payload field, as received (bytes)';
COMMENT ON COLUMN outbox.parked_entries.headers IS 'the entry''s headers field, as received (bytes)';
COMMENT ON COLUMN outbox.parked_entries.deliveries IS 'how many times a drain applied the entry and it failed';
COMMENT ON COLUMN outbox.parked_entries.reason IS 'why the entry failed last in a drain';
SELECT pg_catalog.pg_extension_config_dump('outbox.parked_entries', '');

--
-- The bodies of the engine-checked entries (sql/engine/<engine>/parked.sql):
-- each engine's entry checks that the caller may act for the consumer,
-- then calls outbox.<name>_unchecked with the same arguments. The bodies
-- are SECURITY DEFINER and granted to nobody, so the check cannot be
-- skipped by calling them. Lock order, everywhere: the key rows first, in
-- (stream, key_hash) order, then whatever the handler locks; so a worker
-- that parks and one that drains cannot deadlock.
--

-- Body of outbox.parked_match(): which entries of a batch belong to a
-- parked key, and what to do with each: "park" (store it), "head" (the
-- retrying head itself: apply it) or "acknowledge" (the head of a dead or
-- draining key, delivered again after its acknowledgement was lost: it is
-- settled already). Entries of keys that are not parked, and keyless
-- entries, are not returned. One index probe answers when no key of the
-- batch's streams is parked. Otherwise the matching key rows are locked
-- (FOR UPDATE, in (stream, key_hash) order) before the answer is read, so
-- that a drain that un-parks a key is seen whole: its entries were
-- drained and the row is gone, or it has not started.
CREATE FUNCTION outbox.parked_match_unchecked(consumer text, streams text[], keys bytea[], entry_ids text[])
RETURNS TABLE (ord integer, action text)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	n integer;
BEGIN
	IF streams IS NULL OR entry_ids IS NULL THEN
		RAISE EXCEPTION 'streams and entry_ids must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	n := cardinality(streams);
	IF cardinality(entry_ids) <> n OR (keys IS NOT NULL AND cardinality(keys) <> n) THEN
		RAISE EXCEPTION 'streams, keys and entry_ids must have the same length'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = format('streams has %s elements, keys %s, entry_ids %s.', n, cardinality(keys), cardinality(entry_ids)),
				  HINT = 'keys may also be NULL.';
	END IF;
	IF n > 0 AND (array_ndims(streams) > 1 OR array_lower(streams, 1) <> 1
				  OR array_ndims(entry_ids) > 1 OR array_lower(entry_ids, 1) <> 1
				  OR array_ndims(keys) > 1 OR array_lower(keys, 1) <> 1) THEN
		RAISE EXCEPTION 'streams, keys and entry_ids must be one-dimensional and start at 1'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF array_position(streams, NULL) IS NOT NULL OR array_position(entry_ids, NULL) IS NOT NULL THEN
		RAISE EXCEPTION 'streams and entry_ids must not hold NULL elements'
			USING ERRCODE = 'null_value_not_allowed',
				  DETAIL = format('Entry %s has no stream or no entry id.',
								  least(array_position(streams, NULL), array_position(entry_ids, NULL)));
	END IF;
	IF keys IS NULL OR NOT EXISTS (SELECT 1 FROM outbox.parked_keys p
									WHERE p.consumer = parked_match_unchecked.consumer AND p.stream = ANY (streams)) THEN
		RETURN;
	END IF;
	PERFORM 1
	   FROM outbox.parked_keys p
	  WHERE p.consumer = parked_match_unchecked.consumer
		AND (p.stream, p.key_hash) IN (SELECT u.s, sha256(u.k) FROM unnest(streams, keys) u(s, k) WHERE u.k IS NOT NULL)
	  ORDER BY p.stream, p.key_hash
		FOR UPDATE OF p;
	IF NOT FOUND THEN
		RETURN;
	END IF;
	RETURN QUERY
		SELECT u.o::integer,
			   CASE WHEN u.e <> p.head_entry_id THEN 'park'
					WHEN p.state = 'retrying' THEN 'head'
					ELSE 'acknowledge' END
		  FROM unnest(streams, keys, entry_ids) WITH ORDINALITY u(s, k, e, o)
		  JOIN outbox.parked_keys p
			ON p.consumer = parked_match_unchecked.consumer AND p.stream = u.s AND p.key_hash = sha256(u.k)
		 WHERE u.k IS NOT NULL
		 ORDER BY u.o;
END
$$;
COMMENT ON FUNCTION outbox.parked_match_unchecked(text, text[], bytea[], text[]) IS
	'pg_outbox: body of outbox.parked_match(), called after its consumer check; granted to nobody';

-- Errors unless every element of entry_ids is a stream entry id,
-- "<ms>-<seq>" (the parked entries are ordered by its two numbers).
CREATE FUNCTION outbox.entry_ids_check(entry_ids text[])
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	bad text;
BEGIN
	SELECT e INTO bad FROM unnest(entry_ids) e WHERE e !~ '^[0-9]{1,20}-[0-9]{1,20}$' LIMIT 1;
	IF FOUND THEN
		RAISE EXCEPTION 'entry_id must be a stream entry id'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = format('"%s" is not two numbers joined by "-" (<milliseconds>-<sequence>).',
								  CASE WHEN length(bad) > 64 THEN left(bad, 64) || '...' ELSE bad END);
	END IF;
END
$$;
COMMENT ON FUNCTION outbox.entry_ids_check(text[]) IS
	'pg_outbox: errors unless each element is a stream entry id, <ms>-<seq>';

-- Body of outbox.parked_add(): stores entries of parked keys, in the
-- caller's transaction (their acknowledgement in the stream waits for its
-- commit). Locks the key rows, in (stream, key_hash) order, and stores
-- the entries of the keys it locked; an entry stored already (a batch
-- delivered again after a lost acknowledgement) is left as it is, so
-- parking is idempotent. Returns the positions in the arrays of the
-- entries it did not store because their key is no longer parked (a drain
-- un-parked it meanwhile): the caller applies those, which are newer than
-- everything drained. OB005 when the consumer's parked entries would
-- exceed outbox.config.park_limit.
CREATE FUNCTION outbox.parked_add_unchecked(consumer text, streams text[], entry_ids text[], event_ids bytea[],
											topics bytea[], keys bytea[], payloads bytea[], headers bytea[])
RETURNS integer[]
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	n integer;
	locked_streams text[];
	locked_hashes bytea[];
	added bigint;
	total numeric;
	lim bigint;
BEGIN
	IF streams IS NULL OR entry_ids IS NULL OR keys IS NULL THEN
		RAISE EXCEPTION 'streams, entry_ids and keys must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	n := cardinality(streams);
	IF cardinality(entry_ids) <> n OR cardinality(keys) <> n
	   OR (event_ids IS NOT NULL AND cardinality(event_ids) <> n) OR (topics IS NOT NULL AND cardinality(topics) <> n)
	   OR (payloads IS NOT NULL AND cardinality(payloads) <> n) OR (headers IS NOT NULL AND cardinality(headers) <> n) THEN
		RAISE EXCEPTION 'the arrays of outbox.parked_add() must have the same length'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = format('streams has %s elements, entry_ids %s, keys %s.', n, cardinality(entry_ids), cardinality(keys)),
				  HINT = 'event_ids, topics, payloads and headers may also be NULL.';
	END IF;
	IF n = 0 THEN
		RETURN '{}';
	END IF;
	IF array_ndims(streams) > 1 OR array_lower(streams, 1) <> 1 OR array_ndims(entry_ids) > 1 OR array_lower(entry_ids, 1) <> 1
	   OR array_ndims(keys) > 1 OR array_lower(keys, 1) <> 1
	   OR array_ndims(event_ids) > 1 OR array_lower(event_ids, 1) <> 1 OR array_ndims(topics) > 1 OR array_lower(topics, 1) <> 1
	   OR array_ndims(payloads) > 1 OR array_lower(payloads, 1) <> 1 OR array_ndims(headers) > 1 OR array_lower(headers, 1) <> 1 THEN
		RAISE EXCEPTION 'the arrays of outbox.parked_add() must be one-dimensional and start at 1'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF array_position(streams, NULL) IS NOT NULL OR array_position(entry_ids, NULL) IS NOT NULL
	   OR array_position(keys, NULL) IS NOT NULL THEN
		RAISE EXCEPTION 'streams, entry_ids and keys must not hold NULL elements'
			USING ERRCODE = 'null_value_not_allowed',
				  DETAIL = 'Only an entry with a key parks.';
	END IF;
	PERFORM outbox.entry_ids_check(entry_ids);

	SELECT array_agg(l.stream ORDER BY l.stream, l.key_hash), array_agg(l.key_hash ORDER BY l.stream, l.key_hash)
	  INTO locked_streams, locked_hashes
	  FROM (SELECT p.stream, p.key_hash
			  FROM outbox.parked_keys p
			 WHERE p.consumer = parked_add_unchecked.consumer
			   AND (p.stream, p.key_hash) IN (SELECT u.s, sha256(u.k) FROM unnest(streams, keys) u(s, k))
			 ORDER BY p.stream, p.key_hash
			   FOR UPDATE OF p) l;

	IF locked_streams IS NOT NULL THEN
		WITH stored AS (
			INSERT INTO outbox.parked_entries AS e (consumer, stream, entry_id, event_id, topic, key, payload, headers)
			SELECT parked_add_unchecked.consumer, u.s, u.e, u.ev, u.t, u.k, u.p, u.h
			  FROM unnest(streams, entry_ids, event_ids, topics, keys, payloads, headers) WITH ORDINALITY u(s, e, ev, t, k, p, h, o)
			  JOIN unnest(locked_streams, locked_hashes) l(s, h) ON l.s = u.s AND l.h = sha256(u.k)
			 ORDER BY u.o
			ON CONFLICT ON CONSTRAINT parked_entries_pkey DO NOTHING
			RETURNING e.stream, e.key_hash
		), counts AS (
			SELECT s.stream, s.key_hash, count(*) AS n FROM stored s GROUP BY s.stream, s.key_hash
		), bumped AS (
			UPDATE outbox.parked_keys p SET parked = p.parked + c.n
			  FROM counts c
			 WHERE p.consumer = parked_add_unchecked.consumer AND p.stream = c.stream AND p.key_hash = c.key_hash
			RETURNING c.n
		)
		SELECT coalesce(sum(b.n), 0) INTO added FROM bumped b;
		IF added > 0 THEN
			SELECT c.park_limit INTO lim FROM outbox.config c;
			SELECT sum(p.parked) INTO total FROM outbox.parked_keys p WHERE p.consumer = parked_add_unchecked.consumer;
			IF total > lim THEN
				RAISE EXCEPTION 'consumer "%" cannot park more entries: it would have % parked, over its limit of %',
						consumer, total, lim
					USING ERRCODE = 'OB005',
						  DETAIL = format('It has %s parked entries; this batch would park %s more. outbox.config.park_limit is %s.',
										  total - added, added, lim),
						  HINT = 'Redrive or skip its parked keys (inbox_parked_keys() lists them; inbox_redrive() and inbox_skip() release them), or raise outbox.config.park_limit. Nothing of the batch was parked or applied.';
			END IF;
		END IF;
	END IF;

	RETURN ARRAY(SELECT u.o::integer
				   FROM unnest(streams, keys) WITH ORDINALITY u(s, k, o)
				  WHERE NOT EXISTS (SELECT 1 FROM unnest(locked_streams, locked_hashes) l(s, h)
									 WHERE l.s = u.s AND l.h = sha256(u.k))
				  ORDER BY u.o);
END
$$;
COMMENT ON FUNCTION outbox.parked_add_unchecked(text, text[], text[], bytea[], bytea[], bytea[], bytea[], bytea[]) IS
	'pg_outbox: body of outbox.parked_add(), called after its consumer check; granted to nobody';

-- Body of outbox.parked_settle(): records what was done for a parked key,
-- under the lock of its row. head_done: the retrying head applied (or was
-- settled otherwise), so the key drains. settled: parked entries applied
-- (or dead-lettered alone), removed. dead_letter_replayed: the head's
-- dead letter applied, marked replayed. A draining key with nothing
-- parked and no dead letter waiting (none, replayed or skipped) is
-- un-parked: its row is deleted. Returns the key's state, NULL when it is
-- not parked (any more).
CREATE FUNCTION outbox.parked_settle_unchecked(consumer text, stream text, key bytea, head_done boolean, settled text[],
											   dead_letter_replayed boolean)
RETURNS text
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	k outbox.parked_keys;
	removed bigint := 0;
BEGIN
	IF stream IS NULL OR key IS NULL OR head_done IS NULL OR settled IS NULL OR dead_letter_replayed IS NULL THEN
		RAISE EXCEPTION 'stream, key, head_done, settled and dead_letter_replayed must not be null'
			USING ERRCODE = 'null_value_not_allowed';
	END IF;
	SELECT * INTO k FROM outbox.parked_keys p
	 WHERE p.consumer = parked_settle_unchecked.consumer AND p.stream = parked_settle_unchecked.stream
	   AND p.key_hash = sha256(parked_settle_unchecked.key)
	   FOR UPDATE;
	IF NOT FOUND THEN
		RETURN NULL;
	END IF;
	IF head_done AND k.state = 'retrying' THEN
		k.state := 'draining';
		k.head_fields := NULL;
	END IF;
	IF cardinality(settled) > 0 THEN
		-- The settled entries are the first ones of the key (a drain step
		-- settles a prefix): they are found in the key's order and the scan
		-- stops once it has them all, whichever index the plan takes. Not
		-- "entry_id = ANY (settled)" alone: the plan cached for it while
		-- the table has no statistics can take parked_entries_order with the
		-- ids as a mere filter, and every step then reads every entry still
		-- parked of the key (a drain quadratic in the entries parked).
		DELETE FROM outbox.parked_entries e
		 WHERE e.ctid = ANY (ARRAY(
				SELECT x.ctid FROM outbox.parked_entries x
				 WHERE x.consumer = k.consumer AND x.stream = k.stream AND x.key_hash = k.key_hash
				   AND x.entry_id = ANY (settled)
				 ORDER BY x.pos_ms, x.pos_seq
				 LIMIT cardinality(settled)));
		GET DIAGNOSTICS removed = ROW_COUNT;
		k.parked := greatest(k.parked - removed, 0);
	END IF;
	IF dead_letter_replayed AND k.dead_letter_id IS NOT NULL THEN
		UPDATE outbox.dead_letters d SET replayed_at = now() WHERE d.id = k.dead_letter_id;
	END IF;
	IF k.state = 'draining' AND k.parked = 0
	   AND NOT EXISTS (SELECT 1 FROM outbox.dead_letters d
					    WHERE d.id = k.dead_letter_id AND d.replayed_at IS NULL AND d.skipped_at IS NULL) THEN
		DELETE FROM outbox.parked_keys p WHERE p.consumer = k.consumer AND p.stream = k.stream AND p.key_hash = k.key_hash;
		RETURN NULL;
	END IF;
	UPDATE outbox.parked_keys p SET state = k.state, head_fields = k.head_fields, parked = k.parked
	 WHERE p.consumer = k.consumer AND p.stream = k.stream AND p.key_hash = k.key_hash;
	RETURN k.state;
END
$$;
COMMENT ON FUNCTION outbox.parked_settle_unchecked(text, text, bytea, boolean, text[], boolean) IS
	'pg_outbox: body of outbox.parked_settle(), called after its consumer check; granted to nobody';

-- A parked entry's fields as a stream entry's, names and values in turn
-- (the fields it has; the other fields of the entry were not kept).
CREATE FUNCTION outbox.parked_entry_fields(e outbox.parked_entries)
RETURNS bytea[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
	SELECT ARRAY(SELECT y.v
				   FROM unnest(ARRAY['event_id', 'topic', 'key', 'payload', 'headers']::bytea[],
							   ARRAY[e.event_id, e.topic, e.key, e.payload, e.headers]) WITH ORDINALITY x(name, value, o),
						unnest(ARRAY[x.name, x.value]) WITH ORDINALITY y(v, p)
				  WHERE x.value IS NOT NULL
				  ORDER BY x.o, y.p)
$$;
COMMENT ON FUNCTION outbox.parked_entry_fields(outbox.parked_entries) IS
	'pg_outbox: a parked entry''s fields, names and values in turn, as a dead letter keeps them';

-- Body of inbox_park_key(): the relay's record of an entry's failure, for
-- the entry's key.
--   - A keyed entry with its fields: not dead, its key parks (retrying,
--     with the entry as head and its fields kept); dead, the entry is
--     dead-lettered and its key parks dead. An entry of a key parked with
--     another head is parked itself.
--   - A keyless entry: dead-lettered if dead, else nothing (state NULL).
--   - fields NULL (a failure in a drain, or an entry gone from the
--     stream): a parked entry counts a failed delivery, or when dead
--     becomes its key's dead letter and head (the key goes dead); a head
--     failing again in a redrive updates its dead letter, and goes back to
--     dead when dead; a retrying head gone from the stream is
--     dead-lettered from the fields kept; any other entry is dead-lettered
--     alone when dead.
-- Returns the key's state (NULL when not parked) and the dead letter made
-- or updated, if any.
CREATE FUNCTION outbox.inbox_park_key_unchecked(consumer text, stream text, entry_id text, fields bytea[], reason text,
												sqlstate text, deliveries integer, dead boolean)
RETURNS TABLE (state text, dead_letter_id bigint)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	tries integer;
	k bytea;
	h bytea;
	is_parked boolean := false;
	pk outbox.parked_keys;
	e outbox.parked_entries;
	f bytea[];
	dl bigint;
BEGIN
	IF stream IS NULL OR entry_id IS NULL OR reason IS NULL OR deliveries IS NULL OR dead IS NULL THEN
		RAISE EXCEPTION 'stream, entry_id, reason, deliveries and dead must not be null'
			USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF fields IS NOT NULL AND (array_ndims(fields) > 1 OR cardinality(fields) % 2 <> 0) THEN
		RAISE EXCEPTION 'fields must hold names and values in turn'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = format('The array has %s dimensions and %s elements.', array_ndims(fields), cardinality(fields));
	END IF;
	PERFORM outbox.entry_ids_check(ARRAY[entry_id]);
	tries := greatest(deliveries, 1);

	-- The key: a parked entry's, the key field's, or the one whose head
	-- the entry is.
	SELECT pe.key INTO k FROM outbox.parked_entries pe
	 WHERE pe.consumer = inbox_park_key_unchecked.consumer AND pe.stream = inbox_park_key_unchecked.stream
	   AND pe.entry_id = inbox_park_key_unchecked.entry_id;
	is_parked := FOUND;
	IF NOT is_parked THEN
		IF fields IS NOT NULL THEN
			k := outbox.entry_field(fields, 'key');
		ELSE
			SELECT p.key INTO k FROM outbox.parked_keys p
			 WHERE p.consumer = inbox_park_key_unchecked.consumer AND p.stream = inbox_park_key_unchecked.stream
			   AND p.head_entry_id = inbox_park_key_unchecked.entry_id
			 LIMIT 1;
		END IF;
	END IF;
	IF k IS NOT NULL THEN
		h := sha256(k);
		LOOP
			SELECT * INTO pk FROM outbox.parked_keys p
			 WHERE p.consumer = inbox_park_key_unchecked.consumer AND p.stream = inbox_park_key_unchecked.stream
			   AND p.key_hash = h
			   FOR UPDATE;
			EXIT WHEN FOUND OR fields IS NULL OR is_parked;
			-- The key parks, with this entry as its head.
			INSERT INTO outbox.parked_keys AS p (consumer, stream, key, state, head_entry_id, head_fields, deliveries,
												 reason, sqlstate)
			VALUES (consumer, stream, k, 'retrying', entry_id, fields, tries, reason, sqlstate)
			ON CONFLICT ON CONSTRAINT parked_keys_pkey DO NOTHING;
		END LOOP;
	END IF;
	IF pk.key IS NULL THEN
		-- No key, or its key is not parked (any more): a plain dead letter.
		state := NULL;
		dead_letter_id := NULL;
		IF dead THEN
			IF is_parked THEN
				SELECT * INTO e FROM outbox.parked_entries pe
				 WHERE pe.consumer = inbox_park_key_unchecked.consumer AND pe.stream = inbox_park_key_unchecked.stream
				   AND pe.entry_id = inbox_park_key_unchecked.entry_id;
				f := outbox.parked_entry_fields(e);
			END IF;
			dead_letter_id := outbox.inbox_dead_letter_unchecked(consumer, stream, entry_id, coalesce(fields, f), reason,
																 sqlstate, tries);
		END IF;
		RETURN NEXT;
		RETURN;
	END IF;

	IF is_parked THEN
		SELECT * INTO e FROM outbox.parked_entries pe
		 WHERE pe.consumer = inbox_park_key_unchecked.consumer AND pe.stream = inbox_park_key_unchecked.stream
		   AND pe.entry_id = inbox_park_key_unchecked.entry_id;
		IF NOT FOUND THEN
			-- Drained meanwhile: the failure reported is past.
			state := pk.state;
			dead_letter_id := NULL;
		ELSIF dead THEN
			-- It becomes its key's dead letter and head; the key waits.
			dl := outbox.inbox_dead_letter_unchecked(consumer, stream, entry_id, outbox.parked_entry_fields(e), reason,
													 sqlstate, tries);
			DELETE FROM outbox.parked_entries pe
			 WHERE pe.consumer = e.consumer AND pe.stream = e.stream AND pe.entry_id = e.entry_id;
			UPDATE outbox.parked_keys p
			   SET state = 'dead', head_entry_id = e.entry_id, head_fields = NULL, dead_letter_id = dl,
				   parked = greatest(p.parked - 1, 0), deliveries = tries, reason = inbox_park_key_unchecked.reason,
				   sqlstate = inbox_park_key_unchecked.sqlstate, last_failed_at = now()
			 WHERE p.consumer = pk.consumer AND p.stream = pk.stream AND p.key_hash = pk.key_hash;
			state := 'dead';
			dead_letter_id := dl;
		ELSE
			UPDATE outbox.parked_entries pe
			   SET deliveries = greatest(pe.deliveries + 1, inbox_park_key_unchecked.deliveries),
				   reason = inbox_park_key_unchecked.reason, sqlstate = inbox_park_key_unchecked.sqlstate
			 WHERE pe.consumer = e.consumer AND pe.stream = e.stream AND pe.entry_id = e.entry_id;
			UPDATE outbox.parked_keys p SET last_failed_at = now()
			 WHERE p.consumer = pk.consumer AND p.stream = pk.stream AND p.key_hash = pk.key_hash;
			state := pk.state;
			dead_letter_id := NULL;
		END IF;
	ELSIF pk.head_entry_id = entry_id THEN
		-- The head itself.
		IF dead OR pk.dead_letter_id IS NOT NULL THEN
			-- Dead-lettered (from the fields kept when the stream lost
			-- it), or its dead letter updated.
			dl := outbox.inbox_dead_letter_unchecked(consumer, stream, entry_id, coalesce(fields, pk.head_fields), reason,
													 sqlstate, tries);
		END IF;
		UPDATE outbox.parked_keys p
		   SET state = CASE WHEN dead THEN 'dead' ELSE p.state END,
			   head_fields = CASE WHEN dead OR p.state <> 'retrying' THEN NULL ELSE coalesce(fields, p.head_fields) END,
			   dead_letter_id = coalesce(dl, p.dead_letter_id),
			   deliveries = greatest(p.deliveries, tries), reason = inbox_park_key_unchecked.reason,
			   sqlstate = inbox_park_key_unchecked.sqlstate, last_failed_at = now()
		 WHERE p.consumer = pk.consumer AND p.stream = pk.stream AND p.key_hash = pk.key_hash
		RETURNING p.state, p.dead_letter_id INTO state, dead_letter_id;
	ELSIF fields IS NOT NULL THEN
		-- Another entry of a key parked with another head: it parks too.
		PERFORM outbox.parked_add_unchecked(consumer, ARRAY[stream], ARRAY[entry_id],
											ARRAY[outbox.entry_field(fields, 'event_id')], ARRAY[outbox.entry_field(fields, 'topic')],
											ARRAY[k], ARRAY[outbox.entry_field(fields, 'payload')],
											ARRAY[outbox.entry_field(fields, 'headers')]);
		state := pk.state;
		dead_letter_id := NULL;
	ELSE
		-- Its key has another head now: the failure reported is past.
		state := pk.state;
		dead_letter_id := NULL;
	END IF;
	RETURN NEXT;
END
$$;
COMMENT ON FUNCTION outbox.inbox_park_key_unchecked(text, text, text, bytea[], text, text, integer, boolean) IS
	'pg_outbox: body of inbox_park_key(), called after its consumer check; granted to nobody';

-- @engine parked@

-- The relay's consume call: inbox_consume() for a batch of stream entries,
-- with their keys' parks honoured (I-20). Each entry comes with its stream
-- and entry id. An entry of a parked key is stored instead of applied
-- (status "parked": acknowledge it once the transaction commits); the
-- retrying head of a parked key is applied, and its key drains when it
-- applies; the head of a dead or draining key delivered again (its
-- acknowledgement was lost) is "parked" too, settled already. Every other
-- entry is applied by inbox_consume(), unchanged, in the order of the
-- batch. With isolate and park, a keyed entry that fails blocks the later
-- entries of its (stream, key) in the batch: they are not touched and come
-- back "blocked", for the caller to park the key and send them again.
-- When none of the batch's keys is parked (one index probe) and, under
-- isolate and park, no (stream, key) comes twice, it is one call of
-- inbox_consume() with the arrays as given.
--
-- Runs as the caller, in the caller's transaction, so that the handler
-- runs with the consumer's own privileges and names: no SET clause, and
-- every name it resolves itself is qualified (I-17). Parked entries and
-- the keys' rows are reached through outbox.parked_match(),
-- outbox.parked_add() and outbox.parked_settle(), which check the
-- consumer. At most 64 subtransactions (I-19): with isolate, one per
-- entry applied, as in inbox_consume().
--
-- This is the body of the entry point inbox_consume_keyed(), each
-- engine's (sql/engine/<engine>/consume_keyed.sql): the SQL engine's calls
-- it; the C engine's takes the fast path itself, in C, when no key of the
-- batch's streams is parked (extension/keyed.c), and calls it otherwise.
CREATE FUNCTION outbox.inbox_consume_keyed_body(consumer text, handler text, streams text[], entry_ids text[],
												event_ids bytea[], topics bytea[], keys bytea[], payloads bytea[],
												headers bytea[], isolate boolean DEFAULT false, park boolean DEFAULT true)
RETURNS TABLE (ord integer, status text, error_code text, error_message text)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
#variable_conflict use_variable
DECLARE
	n integer := COALESCE(pg_catalog.cardinality(payloads), 0);
	m_ords integer[];
	m_actions text[];
	-- Per entry: the result, and the first entry of its (stream, key).
	st text[];
	codes text[];
	messages text[];
	grp integer[];
	parks integer[] := '{}';
	heads integer[] := '{}';
	back integer[];
	todo integer[];
	seg integer[];
	seg_grps integer[];
	failed_grps integer[] := '{}';
	pos integer;
	i integer;
	j integer;
	res record;
BEGIN
	IF handler IS NULL OR handler OPERATOR(pg_catalog.=) '' THEN
		RAISE EXCEPTION 'handler must not be empty' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF isolate IS NULL OR park IS NULL THEN
		RAISE EXCEPTION '% must not be null', CASE WHEN isolate IS NULL THEN 'isolate' ELSE 'park' END
			USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF streams IS NULL OR entry_ids IS NULL THEN
		RAISE EXCEPTION 'streams and entry_ids must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF pg_catalog.cardinality(streams) OPERATOR(pg_catalog.<>) n OR pg_catalog.cardinality(entry_ids) OPERATOR(pg_catalog.<>) n
	   OR COALESCE(pg_catalog.cardinality(event_ids), 0) OPERATOR(pg_catalog.<>) n
	   OR COALESCE(pg_catalog.cardinality(topics), 0) OPERATOR(pg_catalog.<>) n
	   OR pg_catalog.cardinality(keys) OPERATOR(pg_catalog.<>) n OR pg_catalog.cardinality(headers) OPERATOR(pg_catalog.<>) n THEN
		RAISE EXCEPTION 'the arrays of inbox_consume_keyed() must have the same length'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = pg_catalog.format('payloads has %s elements, streams %s, entry_ids %s.', n,
											 pg_catalog.cardinality(streams), pg_catalog.cardinality(entry_ids)),
				  HINT = 'keys and headers may also be NULL.';
	END IF;
	IF n OPERATOR(pg_catalog.>) 0
	   AND (pg_catalog.array_ndims(streams) OPERATOR(pg_catalog.>) 1 OR pg_catalog.array_lower(streams, 1) OPERATOR(pg_catalog.<>) 1
			OR pg_catalog.array_ndims(entry_ids) OPERATOR(pg_catalog.>) 1 OR pg_catalog.array_lower(entry_ids, 1) OPERATOR(pg_catalog.<>) 1
			OR pg_catalog.array_ndims(event_ids) OPERATOR(pg_catalog.>) 1 OR pg_catalog.array_lower(event_ids, 1) OPERATOR(pg_catalog.<>) 1
			OR pg_catalog.array_ndims(topics) OPERATOR(pg_catalog.>) 1 OR pg_catalog.array_lower(topics, 1) OPERATOR(pg_catalog.<>) 1
			OR pg_catalog.array_ndims(keys) OPERATOR(pg_catalog.>) 1 OR pg_catalog.array_lower(keys, 1) OPERATOR(pg_catalog.<>) 1
			OR pg_catalog.array_ndims(payloads) OPERATOR(pg_catalog.>) 1 OR pg_catalog.array_lower(payloads, 1) OPERATOR(pg_catalog.<>) 1
			OR pg_catalog.array_ndims(headers) OPERATOR(pg_catalog.>) 1 OR pg_catalog.array_lower(headers, 1) OPERATOR(pg_catalog.<>) 1) THEN
		RAISE EXCEPTION 'the arrays of inbox_consume_keyed() must be one-dimensional and start at 1'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	i := COALESCE(pg_catalog.array_position(streams, NULL), pg_catalog.array_position(entry_ids, NULL));
	IF i IS NOT NULL THEN
		RAISE EXCEPTION 'streams and entry_ids must not hold NULL elements'
			USING ERRCODE = 'null_value_not_allowed',
				  DETAIL = pg_catalog.format('Entry %s has no stream or no entry id.', i);
	END IF;
	IF isolate AND n OPERATOR(pg_catalog.>) 64 THEN
		RAISE EXCEPTION 'inbox_consume_keyed() applies at most 64 entries with isolate => true'
			USING ERRCODE = 'program_limit_exceeded',
				  DETAIL = pg_catalog.format('The batch has %s entries. Each applies in a subtransaction, and a transaction with more than 64 overflows its backend''s subtransaction cache, which slows every snapshot of the cluster.', n),
				  HINT = 'Pass the entries in parts of at most 64, each in a transaction of its own.';
	END IF;

	-- The entries of parked keys (checks the consumer).
	SELECT pg_catalog.array_agg(m.ord ORDER BY m.ord), pg_catalog.array_agg(m.action ORDER BY m.ord)
	  INTO m_ords, m_actions
	  FROM outbox.parked_match(consumer, streams, keys, entry_ids) m;
	-- Under isolate and park, the first entry of each keyed entry's
	-- (stream, key): a later entry of a key that fails is blocked.
	IF isolate AND park AND n OPERATOR(pg_catalog.>) 1 AND keys IS NOT NULL THEN
		grp := ARRAY(SELECT CASE WHEN u.k IS NULL THEN NULL
								 ELSE pg_catalog.min(u.o) OVER (PARTITION BY u.s, u.k) END::integer
					   FROM ROWS FROM (pg_catalog.unnest(streams), pg_catalog.unnest(keys)) WITH ORDINALITY u(s, k, o)
					  ORDER BY u.o);
		IF NOT EXISTS (SELECT 1 FROM pg_catalog.unnest(grp) WITH ORDINALITY g(f, o)
						WHERE g.f OPERATOR(pg_catalog.<>) g.o) THEN
			grp := NULL;
		END IF;
	END IF;
	IF m_ords IS NULL AND grp IS NULL THEN
		RETURN QUERY SELECT r.ord, r.status, r.error_code, r.error_message
					   FROM @extschema@.inbox_consume(consumer, handler, event_ids, topics, keys, payloads, headers, isolate) r;
		RETURN;
	END IF;

	st := pg_catalog.array_fill(NULL::text, ARRAY[n]);
	codes := st;
	messages := st;
	FOR j IN 1 .. COALESCE(pg_catalog.cardinality(m_ords), 0) LOOP
		i := m_ords[j];
		IF m_actions[j] OPERATOR(pg_catalog.=) 'park' THEN
			parks := parks OPERATOR(pg_catalog.||) i;
		ELSIF m_actions[j] OPERATOR(pg_catalog.=) 'head' THEN
			heads := heads OPERATOR(pg_catalog.||) i;
		ELSE
			st[i] := 'parked';
		END IF;
	END LOOP;
	IF pg_catalog.cardinality(parks) OPERATOR(pg_catalog.>) 0 THEN
		back := outbox.parked_add(consumer,
								  ARRAY(SELECT streams[x.w] FROM pg_catalog.unnest(parks) WITH ORDINALITY x(w, o) ORDER BY x.o),
								  ARRAY(SELECT entry_ids[x.w] FROM pg_catalog.unnest(parks) WITH ORDINALITY x(w, o) ORDER BY x.o),
								  ARRAY(SELECT event_ids[x.w] FROM pg_catalog.unnest(parks) WITH ORDINALITY x(w, o) ORDER BY x.o),
								  ARRAY(SELECT topics[x.w] FROM pg_catalog.unnest(parks) WITH ORDINALITY x(w, o) ORDER BY x.o),
								  ARRAY(SELECT keys[x.w] FROM pg_catalog.unnest(parks) WITH ORDINALITY x(w, o) ORDER BY x.o),
								  ARRAY(SELECT payloads[x.w] FROM pg_catalog.unnest(parks) WITH ORDINALITY x(w, o) ORDER BY x.o),
								  ARRAY(SELECT headers[x.w] FROM pg_catalog.unnest(parks) WITH ORDINALITY x(w, o) ORDER BY x.o));
		FOR j IN 1 .. pg_catalog.cardinality(parks) LOOP
			CONTINUE WHEN j OPERATOR(pg_catalog.=) ANY (back);
			st[parks[j]] := 'parked';
		END LOOP;
	END IF;

	-- The rest applies, in the order of the batch: as one call, or under
	-- isolate and park in runs where no (stream, key) comes twice, each
	-- entry of a key that failed before it blocked.
	todo := ARRAY(SELECT x.o::integer FROM pg_catalog.unnest(st) WITH ORDINALITY x(s, o) WHERE x.s IS NULL ORDER BY x.o);
	pos := 1;
	WHILE pos OPERATOR(pg_catalog.<=) pg_catalog.cardinality(todo) LOOP
		IF grp IS NULL THEN
			seg := todo;
			pos := pg_catalog.cardinality(todo) OPERATOR(pg_catalog.+) 1;
		ELSE
			seg := '{}';
			seg_grps := '{}';
			WHILE pos OPERATOR(pg_catalog.<=) pg_catalog.cardinality(todo) LOOP
				i := todo[pos];
				IF grp[i] OPERATOR(pg_catalog.=) ANY (failed_grps) THEN
					st[i] := 'blocked';
				ELSIF grp[i] OPERATOR(pg_catalog.=) ANY (seg_grps) THEN
					EXIT;
				ELSE
					seg := seg OPERATOR(pg_catalog.||) i;
					IF grp[i] IS NOT NULL THEN
						seg_grps := seg_grps OPERATOR(pg_catalog.||) grp[i];
					END IF;
				END IF;
				pos := pos OPERATOR(pg_catalog.+) 1;
			END LOOP;
			CONTINUE WHEN pg_catalog.cardinality(seg) OPERATOR(pg_catalog.=) 0;
		END IF;
		FOR res IN
			SELECT r.ord, r.status, r.error_code, r.error_message
			  FROM @extschema@.inbox_consume(consumer, handler,
											 ARRAY(SELECT event_ids[x.w] FROM pg_catalog.unnest(seg) WITH ORDINALITY x(w, o) ORDER BY x.o),
											 ARRAY(SELECT topics[x.w] FROM pg_catalog.unnest(seg) WITH ORDINALITY x(w, o) ORDER BY x.o),
											 ARRAY(SELECT keys[x.w] FROM pg_catalog.unnest(seg) WITH ORDINALITY x(w, o) ORDER BY x.o),
											 ARRAY(SELECT payloads[x.w] FROM pg_catalog.unnest(seg) WITH ORDINALITY x(w, o) ORDER BY x.o),
											 ARRAY(SELECT headers[x.w] FROM pg_catalog.unnest(seg) WITH ORDINALITY x(w, o) ORDER BY x.o),
											 isolate) r
		LOOP
			i := seg[res.ord];
			st[i] := res.status;
			codes[i] := res.error_code;
			messages[i] := res.error_message;
			IF grp IS NOT NULL AND grp[i] IS NOT NULL AND res.status OPERATOR(pg_catalog.=) 'failed' THEN
				failed_grps := failed_grps OPERATOR(pg_catalog.||) grp[i];
			END IF;
		END LOOP;
	END LOOP;

	-- A retrying head that applied (or was found a duplicate, a conflict
	-- or malformed, which the caller dead-letters alone): its key drains.
	FOREACH i IN ARRAY heads LOOP
		CONTINUE WHEN st[i] IS NULL OR NOT st[i] OPERATOR(pg_catalog.=) ANY ('{applied,duplicate,conflict,malformed}');
		PERFORM outbox.parked_settle(consumer, streams[i], keys[i], true, '{}', false);
	END LOOP;

	RETURN QUERY
		SELECT x.o::integer, x.s, x.c, x.m
		  FROM ROWS FROM (pg_catalog.unnest(st), pg_catalog.unnest(codes), pg_catalog.unnest(messages)) WITH ORDINALITY x(s, c, m, o)
		 ORDER BY x.o;
END
$$;
COMMENT ON FUNCTION outbox.inbox_consume_keyed_body(text, text, text[], text[], bytea[], bytea[], bytea[], bytea[], bytea[], boolean, boolean) IS
	'pg_outbox: body of inbox_consume_keyed(): inbox_consume() with parked keys honoured, as the caller';

-- @engine consume_keyed@

--
-- Privileges: the tables are read by outbox_admin; consumers act on them
-- only through the functions, for the consumers their roles own (each
-- checks the consumer: extension/inbox.c, or outbox.consumer_check() on
-- the SQL engine). The *_unchecked bodies are granted to nobody.
--
REVOKE ALL ON TABLE outbox.parked_keys, outbox.parked_entries FROM PUBLIC;
REVOKE ALL ON FUNCTION
	outbox.parked_match_unchecked(text, text[], bytea[], text[]),
	outbox.entry_ids_check(text[]),
	outbox.parked_add_unchecked(text, text[], text[], bytea[], bytea[], bytea[], bytea[], bytea[]),
	outbox.parked_settle_unchecked(text, text, bytea, boolean, text[], boolean),
	outbox.parked_entry_fields(outbox.parked_entries),
	outbox.inbox_park_key_unchecked(text, text, text, bytea[], text, text, integer, boolean),
	outbox.parked_match(text, text[], bytea[], text[]),
	outbox.parked_add(text, text[], text[], bytea[], bytea[], bytea[], bytea[], bytea[]),
	outbox.parked_settle(text, text, bytea, boolean, text[], boolean),
	@extschema@.inbox_park_key(text, text, text, bytea[], text, text, integer, boolean),
	outbox.inbox_consume_keyed_body(text, text, text[], text[], bytea[], bytea[], bytea[], bytea[], bytea[], boolean, boolean),
	@extschema@.inbox_consume_keyed(text, text, text[], text[], bytea[], bytea[], bytea[], bytea[], bytea[], boolean, boolean)
FROM PUBLIC;

GRANT SELECT ON outbox.parked_keys, outbox.parked_entries TO outbox_admin;

GRANT EXECUTE ON FUNCTION
	outbox.parked_match(text, text[], bytea[], text[]),
	outbox.parked_add(text, text[], text[], bytea[], bytea[], bytea[], bytea[], bytea[]),
	outbox.parked_settle(text, text, bytea, boolean, text[], boolean),
	@extschema@.inbox_park_key(text, text, text, bytea[], text, text, integer, boolean),
	outbox.inbox_consume_keyed_body(text, text, text[], text[], bytea[], bytea[], bytea[], bytea[], bytea[], boolean, boolean),
	@extschema@.inbox_consume_keyed(text, text, text[], text[], bytea[], bytea[], bytea[], bytea[], bytea[], boolean, boolean)
TO outbox_consumer, outbox_admin;
