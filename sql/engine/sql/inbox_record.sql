-- Records in the inbox the events a consumer applies now, once: for each
-- event, the payload applied before under its id (by an earlier
-- transaction or an earlier event of the same batch), NULL when it is new
-- and recorded now. Takes each event's inbox lock first, in the order of
-- their keys, so that two batches sharing events wait for each other
-- instead of deadlocking; at REPEATABLE READ and SERIALIZABLE, 40001 when
-- an apply committed after the transaction's snapshot (SQL engine).
-- Its lookups read the inbox by its unique indexes: a partition analyzed
-- while empty must not get a plan that scans it whole for every event of
-- every batch as it fills.
--
-- Where the C engine's inbox_consume() calls it through fmgr after its
-- consumer check, the SQL engine's runs as its caller (it must run the
-- handler as that role) and can only call what that role may call. So it
-- is granted to outbox_consumer and outbox_admin, and checks the consumer
-- itself: for a role that may not act for the consumer (the role the
-- session acts as: SET ROLE's, else the session user) it refuses as if it
-- were not granted. The extension's owner (and superusers) call it for
-- any consumer, as in the C engine.
--
-- The inbox lock is an advisory transaction lock on a bigint key (a hash of
-- "<consumer>/<event id>", as the C engine's), in the space of
-- pg_advisory_xact_lock(bigint): the C engine's own lock space is not
-- reachable from SQL.
CREATE FUNCTION outbox.inbox_record(consumer text, event_ids uuid[], payloads jsonb[])
RETURNS jsonb[]
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
	acting name;
	caller oid;
	owner oid;
	n integer;
	id_null integer;
	payload_null integer;
	-- The partition rows go to now holds [lo, hi) (both +infinity when
	-- rows go to the default partition); the other partitions that hold
	-- rows lie within [span_lo, span_hi).
	lo timestamptz := 'infinity';
	hi timestamptz := 'infinity';
	span_lo timestamptz := 'infinity';
	span_hi timestamptz := '-infinity';
	others boolean := false;
	-- A timestamp inside each other partition that holds rows, where a
	-- REPEATABLE READ transaction probes for applies it cannot see.
	probes timestamptz[] := '{}';
	default_holds boolean := false;
	minvalue boolean := false;
	maxvalue boolean := false;
	p record;
	m text[];
	lower timestamptz;
	upper timestamptz;
	at timestamptz;
	found_ids uuid[] := '{}';
	found_payloads jsonb[] := '{}';
	fresh_ids uuid[];
	fresh_payloads jsonb[];
	inserted uuid[];
	missing uuid[];
	tids tid[];
	culprit uuid;
	stray uuid;
	result jsonb[];
	xact_snapshot boolean;
	few boolean;
	one jsonb;
BEGIN
	IF consumer IS NULL OR event_ids IS NULL OR payloads IS NULL THEN
		RAISE EXCEPTION 'consumer, event_ids and payloads must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;

	-- Who may call it for this consumer.
	acting := CASE WHEN current_setting('role') = 'none' THEN session_user ELSE current_setting('role')::name END;
	caller := (SELECT r.oid FROM pg_roles r WHERE r.rolname = acting);
	IF pg_has_role(caller, current_user, 'MEMBER') IS NOT TRUE THEN
		SELECT c.owner INTO owner FROM outbox.consumers c WHERE c.name = inbox_record.consumer;
		IF owner IS NULL
		   OR (pg_has_role(caller, owner, 'MEMBER') IS NOT TRUE
			   AND pg_has_role(caller, (SELECT r.oid FROM pg_roles r WHERE r.rolname = 'outbox_admin'), 'MEMBER') IS NOT TRUE) THEN
			RAISE EXCEPTION 'permission denied for function inbox_record'
				USING ERRCODE = 'insufficient_privilege',
					  DETAIL = 'outbox.inbox_record() records only for a consumer the role may act for.';
		END IF;
	END IF;

	IF array_ndims(event_ids) > 1 OR array_ndims(payloads) > 1 THEN
		event_ids := ARRAY(SELECT unnest(event_ids));
		payloads := ARRAY(SELECT unnest(payloads));
	END IF;
	n := coalesce(cardinality(event_ids), 0);
	IF n <> coalesce(cardinality(payloads), 0) THEN
		RAISE EXCEPTION 'event_ids and payloads must have the same length' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF n = 0 THEN
		RETURN '{}';
	END IF;
	id_null := array_position(event_ids, NULL);
	payload_null := array_position(payloads, NULL);
	IF id_null IS NOT NULL OR payload_null IS NOT NULL THEN
		RAISE EXCEPTION '% must not be null',
			CASE WHEN payload_null IS NULL OR id_null <= payload_null THEN 'event_id' ELSE 'payload' END
			USING ERRCODE = 'null_value_not_allowed';
	END IF;

	xact_snapshot := current_setting('transaction_isolation') IN ('repeatable read', 'serializable');

	-- One event at READ COMMITTED (inbox_apply()): its lock, a look in
	-- every partition, the insert.
	IF n = 1 AND NOT xact_snapshot THEN
		PERFORM pg_advisory_xact_lock(hashtextextended(inbox_record.consumer || '/' || event_ids[1]::text, 0));
		SELECT i.payload INTO one FROM outbox.inbox i
		 WHERE i.consumer = inbox_record.consumer AND i.event_id = event_ids[1];
		IF FOUND THEN
			RETURN ARRAY[one];
		END IF;
		INSERT INTO outbox.inbox AS i (consumer, event_id, payload) VALUES (inbox_record.consumer, event_ids[1], payloads[1])
		ON CONFLICT DO NOTHING;
		IF FOUND THEN
			RETURN ARRAY[NULL::jsonb];
		END IF;
		SELECT i.payload INTO one FROM outbox.inbox i
		 WHERE i.consumer = inbox_record.consumer AND i.event_id = event_ids[1];
		IF NOT FOUND THEN
			RAISE EXCEPTION 'event % of consumer "%" is neither in the inbox nor added to it', event_ids[1], consumer
				USING ERRCODE = 'internal_error';
		END IF;
		RETURN ARRAY[one];
	END IF;

	-- The inbox lock of each event, in the order of the keys.
	PERFORM pg_advisory_xact_lock(l.key)
	   FROM (SELECT DISTINCT hashtextextended(inbox_record.consumer || '/' || e.id::text, 0) AS key
			   FROM unnest(event_ids) e(id)
			  ORDER BY 1) l;

	-- Where rows go now, and which other partitions hold any: those
	-- premade for the days ahead hold none, and a lookup need not probe
	-- their indexes for every event. A partition without a block holds
	-- no row, committed or not; one that gets the row of an event of this
	-- batch meanwhile must wait for the event's inbox lock, held already.
	-- For a few events at READ COMMITTED, probing every partition costs
	-- less than finding those bounds: the first lookup then reads them
	-- all.
	few := n <= 16 AND NOT xact_snapshot;
	IF NOT few THEN
		FOR p IN
			SELECT c.oid, c.relkind, pg_get_expr(c.relpartbound, c.oid) AS bound
			  FROM pg_inherits i
			  JOIN pg_class c ON c.oid = i.inhrelid
			 WHERE i.inhparent = 'outbox.inbox'::regclass
		LOOP
			IF p.bound = 'DEFAULT' THEN
				lower := '-infinity';
				upper := 'infinity';
			ELSE
				m := regexp_match(p.bound, '^FOR VALUES FROM \((.*)\) TO \((.*)\)$');
				IF m IS NULL THEN
					CONTINUE;
				END IF;
				minvalue := minvalue OR m[1] = 'MINVALUE';
				maxvalue := maxvalue OR m[2] = 'MAXVALUE';
				lower := CASE WHEN m[1] = 'MINVALUE' THEN '-infinity'::timestamptz ELSE btrim(m[1], '''')::timestamptz END;
				upper := CASE WHEN m[2] = 'MAXVALUE' THEN 'infinity'::timestamptz ELSE btrim(m[2], '''')::timestamptz END;
				IF now() >= lower AND now() < upper THEN
					lo := lower;
					hi := upper;
					CONTINUE;
				END IF;
			END IF;
			CONTINUE WHEN p.relkind = 'r' AND pg_relation_size(p.oid) = 0;
			others := true;
			span_lo := least(span_lo, lower);
			span_hi := greatest(span_hi, upper);
			IF p.bound = 'DEFAULT' THEN
				default_holds := true;
			ELSE
				probes := probes || lower;
			END IF;
		END LOOP;
	END IF;
	IF default_holds AND lo <> 'infinity' THEN
		-- A timestamp no range partition holds, for the default one.
		IF NOT minvalue THEN
			probes := probes || '-infinity'::timestamptz;
		ELSIF NOT maxvalue THEN
			probes := probes || 'infinity'::timestamptz;
		END IF;
	END IF;

	-- The other partitions that hold rows first, as the transaction sees
	-- them (at READ COMMITTED, with a new snapshot, taken after the locks).
	IF few THEN
		SELECT coalesce(array_agg(i.event_id), '{}'), coalesce(array_agg(i.payload), '{}')
		  INTO found_ids, found_payloads
		  FROM outbox.inbox i
		 WHERE i.consumer = inbox_record.consumer
		   AND i.event_id = ANY (event_ids);
	ELSIF others THEN
		SELECT coalesce(array_agg(i.event_id), '{}'), coalesce(array_agg(i.payload), '{}')
		  INTO found_ids, found_payloads
		  FROM outbox.inbox i
		 WHERE i.consumer = inbox_record.consumer
		   AND i.event_id = ANY (event_ids)
		   AND (i.applied_at < lo OR i.applied_at >= hi)
		   AND i.applied_at >= span_lo AND i.applied_at < span_hi;
	END IF;

	-- The first occurrence of each event not found, by id.
	SELECT array_agg(f.id ORDER BY f.id), array_agg(f.payload ORDER BY f.id)
	  INTO fresh_ids, fresh_payloads
	  FROM (SELECT DISTINCT ON (e.id) e.id, e.payload
			  FROM unnest(event_ids, payloads) WITH ORDINALITY e(id, payload, ord)
			 WHERE e.id <> ALL (found_ids)
			 ORDER BY e.id, e.ord) f;

	IF fresh_ids IS NOT NULL THEN
		IF xact_snapshot THEN
			-- The snapshot may predate an apply committed since: what is
			-- committed now is seen where a unique index is checked. So the
			-- new events are inserted into each other partition that holds
			-- rows, and deleted again (ON CONFLICT DO NOTHING raises 40001
			-- for a row this snapshot cannot see), and into the partition
			-- rows go to, which raises the same.
			BEGIN
				FOREACH at IN ARRAY probes LOOP
					WITH probe AS (
						INSERT INTO outbox.inbox AS i (consumer, event_id, payload, applied_at)
						SELECT inbox_record.consumer, f.id, f.payload, at
						  FROM unnest(fresh_ids, fresh_payloads) f(id, payload)
						ON CONFLICT DO NOTHING
						RETURNING i.ctid)
					SELECT array_agg(probe.ctid) INTO tids FROM probe;
					DELETE FROM outbox.inbox i WHERE i.applied_at = at AND i.ctid = ANY (tids);
				END LOOP;
				WITH added AS (
					INSERT INTO outbox.inbox AS i (consumer, event_id, payload)
					SELECT inbox_record.consumer, f.id, f.payload
					  FROM unnest(fresh_ids, fresh_payloads) f(id, payload)
					ON CONFLICT DO NOTHING
					RETURNING i.event_id)
				SELECT coalesce(array_agg(added.event_id), '{}') INTO inserted FROM added;
			EXCEPTION WHEN serialization_failure THEN
				-- Which event, the first of the batch: each alone again,
				-- undone by an error of the block.
				FOR culprit IN
					SELECT e.id FROM unnest(event_ids) WITH ORDINALITY e(id, ord)
					 WHERE e.id = ANY (fresh_ids) ORDER BY e.ord
				LOOP
					BEGIN
						FOREACH at IN ARRAY probes LOOP
							INSERT INTO outbox.inbox AS i (consumer, event_id, payload, applied_at)
							SELECT inbox_record.consumer, culprit, '{}', at
							ON CONFLICT DO NOTHING;
						END LOOP;
						INSERT INTO outbox.inbox AS i (consumer, event_id, payload)
						SELECT inbox_record.consumer, culprit, '{}'
						ON CONFLICT DO NOTHING;
						RAISE EXCEPTION USING ERRCODE = 'no_data_found';
					EXCEPTION
						WHEN no_data_found THEN
							NULL;
						WHEN serialization_failure THEN
							RAISE EXCEPTION 'could not serialize access to event % of consumer "%" due to a concurrent apply',
								culprit, consumer
								USING ERRCODE = 'serialization_failure',
									  DETAIL = 'A transaction that committed after this one took its snapshot applied the event.',
									  HINT = 'Retry the transaction: it will find the event applied.';
					END;
				END LOOP;
				RAISE;
			END;
		ELSE
			-- The partition rows go to now is looked at by the insert
			-- itself: the first occurrence of each event not found goes in
			-- unless that partition has it.
			WITH added AS (
				INSERT INTO outbox.inbox AS i (consumer, event_id, payload)
				SELECT inbox_record.consumer, f.id, f.payload
				  FROM unnest(fresh_ids, fresh_payloads) f(id, payload)
				ON CONFLICT DO NOTHING
				RETURNING i.event_id)
			SELECT coalesce(array_agg(added.event_id), '{}') INTO inserted FROM added;
		END IF;

		-- Only then is the payload of one that did not go in read.
		IF cardinality(inserted) < cardinality(fresh_ids) THEN
			missing := ARRAY(SELECT f.id FROM unnest(fresh_ids) f(id) WHERE f.id <> ALL (inserted));
			IF few THEN
				SELECT found_ids || coalesce(array_agg(i.event_id), '{}'), found_payloads || coalesce(array_agg(i.payload), '{}')
				  INTO found_ids, found_payloads
				  FROM outbox.inbox i
				 WHERE i.consumer = inbox_record.consumer
				   AND i.event_id = ANY (missing);
			ELSE
				SELECT found_ids || coalesce(array_agg(i.event_id), '{}'), found_payloads || coalesce(array_agg(i.payload), '{}')
				  INTO found_ids, found_payloads
				  FROM outbox.inbox i
				 WHERE i.consumer = inbox_record.consumer
				   AND i.event_id = ANY (missing)
				   AND i.applied_at >= lo AND i.applied_at < hi;
			END IF;
		END IF;
	END IF;
	inserted := coalesce(inserted, '{}');

	-- What each event had applied before: its row's payload; nothing for
	-- the first occurrence of one inserted now, whose repeats get its
	-- payload.
	SELECT array_agg(CASE WHEN f.payload IS NOT NULL THEN f.payload
						  WHEN e.ord = e.first_ord THEN NULL
						  ELSE e.first_payload END ORDER BY e.ord),
		   (array_agg(e.id ORDER BY e.ord) FILTER (WHERE f.payload IS NULL AND e.id <> ALL (inserted)))[1]
	  INTO result, stray
	  FROM (SELECT x.id, x.ord, first_value(x.ord) OVER w AS first_ord, first_value(x.payload) OVER w AS first_payload
			  FROM unnest(event_ids, payloads) WITH ORDINALITY x(id, payload, ord)
			WINDOW w AS (PARTITION BY x.id ORDER BY x.ord)) e
	  LEFT JOIN (SELECT DISTINCT ON (y.id) y.id, y.payload
				   FROM unnest(found_ids, found_payloads) y(id, payload)) f ON f.id = e.id;
	IF stray IS NOT NULL THEN
		RAISE EXCEPTION 'event % of consumer "%" is neither in the inbox nor added to it', stray, consumer
			USING ERRCODE = 'internal_error';
	END IF;
	RETURN result;
END
$$;
COMMENT ON FUNCTION outbox.inbox_record(text, uuid[], jsonb[]) IS
	'pg_outbox: records the events a consumer applies in the inbox, once; returns for each the payload applied before (NULL when new); refused for a consumer the role may not act for';
GRANT EXECUTE ON FUNCTION outbox.inbox_record(text, uuid[], jsonb[]) TO outbox_consumer, outbox_admin;
