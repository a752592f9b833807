-- pg_outbox install script, part 50: maintenance.
-- (assembled with the other parts of sql/install/; see 00_schema_roles.sql).

--
-- Maintenance: partitions ahead of the transaction ids, rows out of the
-- default partition, retention, lagging groups.
--
CREATE TABLE outbox.maintenance (
	only_row boolean NOT NULL DEFAULT true,
	last_started_at timestamptz,
	last_finished_at timestamptz,
	last_summary jsonb,
	retired_ticket bigint NOT NULL DEFAULT 0,
	retired_txid xid8 NOT NULL DEFAULT '0',
	retired_seq bigint NOT NULL DEFAULT 0,
	CONSTRAINT maintenance_pkey PRIMARY KEY (only_row),
	CONSTRAINT maintenance_only_row CHECK (only_row)
);
COMMENT ON TABLE outbox.maintenance IS 'pg_outbox: when maintenance last ran, and what it did';
COMMENT ON COLUMN outbox.maintenance.retired_txid IS 'with retired_seq: position of the last event retention removed';
COMMENT ON COLUMN outbox.maintenance.retired_ticket IS 'highest commit ticket in a retired partition: tickets are never issued again at or below it';
INSERT INTO outbox.maintenance DEFAULT VALUES;

-- Why a partition may not be retired yet, or NULL when it may: it must be
-- entirely below the horizon, behind every live group's cursor, and its
-- last event (in feed order) older than the retention.
CREATE FUNCTION outbox.retire_blocker(part regclass, lower xid8, upper xid8)
RETURNS text
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
SET enable_sort = off
SET jit = off
AS $$
DECLARE
	g record;
	holders text[] := '{}';
	ahead boolean;
	markers regclass;
	last_ticket bigint;
	newest timestamptz;
	retention interval := (SELECT c.retention FROM outbox.config c);
BEGIN
	IF upper > outbox.horizon() THEN
		RETURN 'current or future transactions';
	END IF;
	markers := to_regclass(format('outbox.%I', outbox.commit_partition_name(lower)));
	IF markers IS NOT NULL THEN
		EXECUTE format('SELECT max(ticket) FROM %s', markers) INTO last_ticket;
	END IF;
	FOR g IN SELECT * FROM outbox.groups WHERE NOT stale ORDER BY name, shard LOOP
		IF g.ordering = 'commit' THEN
			-- Passed when nothing is left to publish up to the partition's
			-- last commit.
			-- last commit, of the group's topics and shard.
			ahead := last_ticket >= g.cursor_ticket
					 AND EXISTS (SELECT 1 FROM outbox.commit_backlog(g.cursor_ticket, g.cursor_seq, g.topics, last_ticket,
																	 NULL, g.shard, g.shards));
		ELSIF g.cursor_txid < upper THEN
			EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s WHERE (txid, seq) > ($1, $2)
							 AND ($3 IS NULL OR topic = ANY ($3))
							 AND ($5 = 1 OR outbox.shard_of(topic, key, $5) = $4))', part)
				INTO ahead USING g.cursor_txid, g.cursor_seq, g.topics, g.shard, g.shards;
		ELSE
			ahead := false;
		END IF;
		IF ahead THEN
			holders := holders || format('"%s"', g.name || CASE WHEN g.shards > 1 THEN '/' || g.shard ELSE '' END);
		END IF;
	END LOOP;
	IF cardinality(holders) > 0 THEN
		RETURN 'not yet passed by group ' || array_to_string(holders, ', ');
	END IF;
	EXECUTE format('SELECT created_at FROM %s ORDER BY txid DESC, seq DESC LIMIT 1', part) INTO newest;
	IF newest >= now() - retention THEN
		RETURN format('its last event is younger than the retention (%s)', retention);
	END IF;
	RETURN NULL;
END
$$;
COMMENT ON FUNCTION outbox.retire_blocker(regclass, xid8, xid8) IS 'pg_outbox: why an event partition may not be retired yet, or NULL';

-- @engine maintenance_lock@

-- Runs everything maintenance does, once; idempotent. When another run
-- holds the maintenance lock it returns at once. Each step that takes a
-- lock does so with outbox.config.lock_timeout, in its own subtransaction:
-- one that cannot get its lock is reported as deferred and retried on the
-- next run, so emitters never wait on maintenance longer than that.
--
-- The steps, numbered the same in the body (each row it returns names the
-- step's action):
--   1. rows found in the default partitions get their partition ('moved');
--   2. premake: partitions up to premake ahead of the current transaction
--      id ('created'), and the index of each shard count in use;
--   3. retention: partitions every live group has passed and older than
--      the retention are dropped or detached (retire_mode);
--   4. the inbox: daily partitions ahead, and inbox_retention;
--   5. groups that lag more than max_group_lag are reported ('lagging').
-- The comments stay outside the body: the body is what pg_proc stores, and
-- the upgrade from 0.1.0 must make the same one.
-- The body calls only functions of the schema outbox, never one by the
-- extension's schema, whose owner could rename it and put another
-- function under that name (I-17).
-- Sorting is off so that the last event of a partition is read by index;
-- a query that must sort anyway then costs so much in the planner's eyes
-- that JIT compiles it, at half a second each (partition_bounds() is
-- called once per partition premade): JIT is off with it, here and in
-- retire_blocker().
CREATE FUNCTION @extschema@.outbox_maintain()
RETURNS TABLE (action text, object text, detail text)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '200ms'
SET enable_sort = off
SET jit = off
AS $$
DECLARE
	cfg outbox.config;
	x numeric;
	r record;
	b record;
	g record;
	n bigint;
	markers regclass;
	last_event record;
	started timestamptz := clock_timestamp();
	lagging_names text[];
	lagging_ages interval[];
	xid8_horizon xid8;
	ticket_horizon bigint;
	newest timestamptz;
	-- Each step that may fail alone runs in a subtransaction; a run takes
	-- at most this many in all (and the inbox's one), so that it never
	-- overflows its backend's cache of 64, which would slow every snapshot
	-- of the cluster. What is left waits for the next run.
	max_subxacts constant integer := 60;
	subxacts integer := 0;
BEGIN
	IF NOT outbox.try_maintenance_lock() THEN
		action := 'skipped'; detail := 'another maintenance run is in progress';
		RETURN NEXT;
		RETURN;
	END IF;
	SELECT * INTO cfg FROM outbox.config;
	PERFORM set_config('lock_timeout', (extract(epoch FROM cfg.lock_timeout) * 1000)::int || 'ms', true);
	-- The lag of each group (step 5) is read first, while the run has no
	-- transaction id, which would hold back the feed horizon of every group
	-- in xid8 order. The run writes only from here, mostly nothing.
	-- A group's lag is the age of the first event after its cursor, of any
	-- topic and shard: one index probe per partition ahead of the cursor,
	-- never a read of the backlog (a group of some topics or one shard
	-- would otherwise read every event of the others after its cursor).
	-- Such a group's cursor stays behind the others' events, so it counts
	-- only while no session leads it; its relay measures it while one does.
	xid8_horizon := outbox.horizon();
	IF EXISTS (SELECT 1 FROM outbox.groups gr WHERE gr.ordering OPERATOR(pg_catalog.=) 'commit'::text)
	   AND outbox.commit_order_available() THEN
		ticket_horizon := outbox.commit_horizon();
	END IF;
	SELECT pg_catalog.array_agg(w.name ORDER BY w.name), pg_catalog.array_agg(w.age ORDER BY w.name)
	  INTO lagging_names, lagging_ages
	  FROM (SELECT gr.name OPERATOR(pg_catalog.||) CASE WHEN gr.shards OPERATOR(pg_catalog.>) 1
													   THEN '/' OPERATOR(pg_catalog.||) gr.shard::text ELSE '' END AS name,
				   pg_catalog.now() OPERATOR(pg_catalog.-) coalesce(
					   (SELECT bl.created_at
						  FROM outbox.backlog(gr.cursor_txid, gr.cursor_seq, NULL::text[], xid8_horizon) bl
						 WHERE gr.ordering OPERATOR(pg_catalog.=) 'xid8'::text
						 ORDER BY bl.txid, bl.seq LIMIT 1),
					   (SELECT cb.created_at
						  FROM outbox.commit_backlog(gr.cursor_ticket, gr.cursor_seq, NULL::text[], ticket_horizon) cb
						 WHERE gr.ordering OPERATOR(pg_catalog.=) 'commit'::text
						 LIMIT 1)) AS age
			  FROM outbox.groups gr
			 WHERE NOT gr.stale
			   AND ((gr.topics IS NULL AND gr.shards OPERATOR(pg_catalog.=) 1)
					OR NOT coalesce(outbox.leader_live(gr.leader_pid, gr.leader_started, gr.lease_until), false))) w
	 WHERE w.age OPERATOR(pg_catalog.>) cfg.max_group_lag;

	-- 1. Rows that landed in the default partition: give each range its
	-- partition and move the rows there, a range per subtransaction.
	FOR r IN SELECT DISTINCT f.lower, f.upper
			   FROM (SELECT e.txid FROM outbox.event_default e
					 UNION SELECT c.txid FROM outbox.commit_log_default c) d,
					LATERAL outbox.free_range(d.txid) f
			  WHERE f.lower IS NOT NULL
			  ORDER BY 1
			  LIMIT 16
	LOOP
		subxacts := subxacts + 1;
		BEGIN
			n := outbox.attach_range(r.lower, r.upper);
			RAISE WARNING 'pg_outbox: % rows of outbox.event were in the default partition (and their commit markers); moved to %',
				n, outbox.partition_name(r.lower)
				USING HINT = 'Maintenance did not run often enough, or premake is too small for the transaction rate.';
			action := 'moved'; object := 'outbox.' || outbox.partition_name(r.lower);
			detail := format('%s rows out of the default partition, transactions %s to %s', n, r.lower, r.upper);
			RETURN NEXT;
		EXCEPTION WHEN lock_not_available OR check_violation OR duplicate_table THEN
			action := 'deferred'; object := 'outbox.' || outbox.partition_name(r.lower);
			detail := format('could not move rows out of the default partition: %s', sqlerrm);
			RETURN NEXT;
		END;
	END LOOP;

	-- 2. Premake: partitions from the current transaction id to the headroom.
	x := pg_snapshot_xmax(pg_current_snapshot())::text::numeric;
	FOR i IN 0 .. cfg.premake LOOP
		SELECT * INTO r FROM outbox.free_range((x + i * cfg.partition_width)::text::xid8);
		CONTINUE WHEN r.lower IS NULL;
		IF subxacts >= max_subxacts THEN
			action := 'deferred'; object := 'outbox.' || outbox.partition_name(r.lower);
			detail := format('the partitions from transaction %s on are made by the next run (a run takes at most %s subtransactions)',
							 r.lower, max_subxacts);
			RETURN NEXT;
			EXIT;
		END IF;
		subxacts := subxacts + 1;
		BEGIN
			n := outbox.attach_range(r.lower, r.upper);
			action := 'created'; object := 'outbox.' || outbox.partition_name(r.lower);
			detail := format('transactions %s to %s', r.lower, r.upper);
			RETURN NEXT;
		EXCEPTION WHEN lock_not_available OR check_violation OR duplicate_table THEN
			action := 'deferred'; object := 'outbox.' || outbox.partition_name(r.lower);
			detail := format('could not create the partition: %s', sqlerrm);
			RETURN NEXT;
		END;
	END LOOP;

	-- The index of each shard count in use (gone after a restore, which
	-- makes the extension's tables again without it).
	FOR n IN SELECT DISTINCT gs.shards FROM outbox.groups gs WHERE gs.shards > 1 ORDER BY 1 LOOP
		EXIT WHEN subxacts >= max_subxacts;
		subxacts := subxacts + 1;
		BEGIN
			IF outbox.ensure_shard_index(n::integer) THEN
				action := 'created'; object := 'outbox.' || outbox.shard_index_name(n::integer);
				detail := format('the index of groups with %s shards', n);
				RETURN NEXT;
			END IF;
		EXCEPTION WHEN lock_not_available THEN
			action := 'deferred'; object := 'outbox.' || outbox.shard_index_name(n::integer);
			detail := format('could not make the index of groups with %s shards: %s', n, sqlerrm);
			RETURN NEXT;
		END;
	END LOOP;

	-- 3. Retention: a partition leaves when every live group has passed all
	-- of it and its last event is older than the retention. What bounds
	-- alone decide comes first: the age of its last event (one index
	-- probe), then a live group of every topic and shard whose cursor is
	-- before the partition's events. Only a partition old enough that no
	-- such group holds is searched for the events of the other groups
	-- (retire_blocker()), and it is retired unless one is found.
	FOR b IN SELECT * FROM outbox.partition_bounds() p WHERE p.upper <= outbox.horizon() ORDER BY p.lower LOOP
		EXECUTE pg_catalog.format('SELECT created_at FROM %s ORDER BY txid DESC, seq DESC LIMIT 1', b.relid) INTO newest;
		CONTINUE WHEN newest OPERATOR(pg_catalog.>=) (pg_catalog.now() OPERATOR(pg_catalog.-) cfg.retention);
		CONTINUE WHEN newest IS NOT NULL
				  AND EXISTS (SELECT 1 FROM outbox.groups gr
							   WHERE NOT gr.stale AND gr.ordering OPERATOR(pg_catalog.=) 'xid8'::text
								 AND gr.topics IS NULL AND gr.shards OPERATOR(pg_catalog.=) 1
								 AND gr.cursor_txid OPERATOR(pg_catalog.<) b.lower);
		CONTINUE WHEN outbox.retire_blocker(b.relid, b.lower, b.upper) IS NOT NULL;
		IF subxacts >= max_subxacts THEN
			action := 'deferred'; object := 'outbox.' || b.name;
			detail := format('retired by the next run (a run takes at most %s subtransactions)', max_subxacts);
			RETURN NEXT;
			EXIT;
		END IF;
		subxacts := subxacts + 1;
		BEGIN
			-- Tickets of retired markers are never issued again (commit.c).
			UPDATE outbox.maintenance m
			   SET retired_ticket = greatest(m.retired_ticket,
											 (SELECT max(c.ticket) FROM outbox.commit_log c
											   WHERE c.txid >= b.lower AND c.txid < b.upper));
			-- Rewinds before the last event removed warn (outbox_rewind).
			EXECUTE format('SELECT txid, seq FROM %s ORDER BY txid DESC, seq DESC LIMIT 1', b.relid) INTO last_event;
			IF last_event.txid IS NOT NULL THEN
				UPDATE outbox.maintenance m SET retired_txid = last_event.txid, retired_seq = last_event.seq
				 WHERE (last_event.txid, last_event.seq) > (m.retired_txid, m.retired_seq);
			END IF;
			EXECUTE format('ALTER TABLE outbox.event DETACH PARTITION %s', b.relid);
			markers := to_regclass(format('outbox.%I', outbox.commit_partition_name(b.lower)));
			IF markers IS NOT NULL THEN
				EXECUTE format('ALTER TABLE outbox.commit_log DETACH PARTITION %s', markers);
			END IF;
			IF cfg.retire_mode = 'drop' THEN
				PERFORM outbox.set_member(b.relid, false);
				EXECUTE format('DROP TABLE %s', b.relid);
				IF markers IS NOT NULL THEN
					PERFORM outbox.set_member(markers, false);
					EXECUTE format('DROP TABLE %s', markers);
				END IF;
				action := 'dropped';
			ELSE
				-- Kept for inspection, and dropped with the extension.
				EXECUTE format('ALTER TABLE %s RENAME TO %I', b.relid, b.name || '_detached');
				PERFORM outbox.set_member(format('outbox.%I', b.name || '_detached')::regclass, true);
				IF markers IS NOT NULL THEN
					EXECUTE format('ALTER TABLE %s RENAME TO %I', markers, outbox.commit_partition_name(b.lower) || '_detached');
					PERFORM outbox.set_member(format('outbox.%I', outbox.commit_partition_name(b.lower) || '_detached')::regclass, true);
				END IF;
				action := 'detached';
			END IF;
			object := 'outbox.' || b.name;
			detail := format('transactions %s to %s', b.lower, b.upper);
			RETURN NEXT;
		EXCEPTION WHEN lock_not_available THEN
			action := 'deferred'; object := 'outbox.' || b.name;
			detail := format('could not retire the partition: %s', sqlerrm);
			RETURN NEXT;
		END;
	END LOOP;

	-- 4. The inbox: partitions ahead, and retention.
	BEGIN
		n := outbox.inbox_premake_partitions();
		IF n > 0 THEN
			action := 'created'; object := 'outbox.inbox'; detail := format('%s partitions', n);
			RETURN NEXT;
		END IF;
		n := outbox.inbox_retire_partitions();
		IF n > 0 THEN
			action := 'dropped'; object := 'outbox.inbox'; detail := format('%s partitions older than %s', n, (SELECT inbox_retention FROM outbox.config));
			RETURN NEXT;
		END IF;
	EXCEPTION WHEN lock_not_available THEN
		action := 'deferred'; object := 'outbox.inbox'; detail := sqlerrm;
		RETURN NEXT;
	END;

	-- 5. Groups that lag (read above): reported, never skipped.
	FOR g IN SELECT l.group_name, l.oldest_waiting_age
			   FROM unnest(lagging_names, lagging_ages) AS l(group_name, oldest_waiting_age)
	LOOP
		RAISE WARNING 'pg_outbox: group "%" lags: its oldest waiting event is % old', g.group_name, g.oldest_waiting_age
			USING HINT = 'Its events are kept until it passes them. Start its relay, or mark it stale with outbox_group_set_stale() so that it stops keeping storage.';
		action := 'lagging'; object := g.group_name; detail := format('oldest waiting event is %s old', g.oldest_waiting_age);
		RETURN NEXT;
	END LOOP;

	UPDATE outbox.maintenance SET last_started_at = started, last_finished_at = clock_timestamp();
END
$$;
COMMENT ON FUNCTION @extschema@.outbox_maintain() IS
	'pg_outbox: premakes partitions, moves rows out of the default partition, retires old partitions, reports lagging groups; one run at a time';

-- Drops the event partitions that hold no row, each locked first so that
-- no row can arrive meanwhile; the next outbox_maintain() makes the ones
-- needed again, at the current partition_width. After changing the width,
-- this reshapes the partitions made ahead. Returns how many it dropped.
CREATE FUNCTION @extschema@.outbox_drop_empty_partitions()
RETURNS integer
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '5s'
AS $$
DECLARE
	p record;
	parts regclass[];
	part regclass;
	has_rows boolean;
	found_rows boolean;
	dropped integer := 0;
BEGIN
	FOR p IN SELECT * FROM outbox.partition_bounds() LOOP
		-- The event partition and the commit marker partition of its range.
		parts := ARRAY[p.relid];
		IF to_regclass(format('outbox.%I', outbox.commit_partition_name(p.lower))) IS NOT NULL THEN
			parts := parts || to_regclass(format('outbox.%I', outbox.commit_partition_name(p.lower)));
		END IF;
		has_rows := false;
		FOREACH part IN ARRAY parts LOOP
			EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', part);
			EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s)', part) INTO found_rows;
			has_rows := has_rows OR found_rows;
		END LOOP;
		CONTINUE WHEN has_rows;
		FOREACH part IN ARRAY parts LOOP
			EXECUTE format('ALTER TABLE %s DETACH PARTITION %s',
						   CASE WHEN part = p.relid THEN 'outbox.event' ELSE 'outbox.commit_log' END, part);
			PERFORM outbox.set_member(part, false);
			EXECUTE format('DROP TABLE %s', part);
		END LOOP;
		dropped := dropped + 1;
	END LOOP;
	RETURN dropped;
END
$$;
COMMENT ON FUNCTION @extschema@.outbox_drop_empty_partitions() IS
	'pg_outbox: drops the empty event partitions, so that outbox_maintain() makes them again at the current partition_width';

-- Marks a group stale (it stops keeping events from retention) or live.
CREATE FUNCTION @extschema@.outbox_group_set_stale(group_name text, stale boolean DEFAULT true)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF stale IS NULL THEN
		RAISE EXCEPTION 'stale must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	-- A sharded group named without a shard: every shard.
	IF outbox.group_of(group_name) IS NULL AND EXISTS (SELECT 1 FROM outbox.groups g WHERE g.name = group_name AND g.shards > 1) THEN
		UPDATE outbox.groups g SET stale = outbox_group_set_stale.stale WHERE g.name = group_name;
	ELSE
		UPDATE outbox.groups SET stale = outbox_group_set_stale.stale WHERE id = (outbox.get_group(group_name)).id;
	END IF;
	RAISE LOG 'pg_outbox: group "%" marked %', group_name, CASE WHEN stale THEN 'stale' ELSE 'live' END;
END
$$;
COMMENT ON FUNCTION @extschema@.outbox_group_set_stale(text, boolean) IS
	'pg_outbox: marks a group stale (its cursor no longer keeps events from retention) or live again';

-- The event partitions: bounds, size, and whether retention may retire
-- them, or why not.
CREATE FUNCTION @extschema@.outbox_partitions()
RETURNS TABLE (partition_name name, lower xid8, upper xid8, rows_estimate bigint, total_bytes bigint,
			   retirable boolean, reason text)
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	b record;
BEGIN
	FOR b IN SELECT * FROM outbox.partition_bounds() LOOP
		partition_name := b.name; lower := b.lower; upper := b.upper;
		SELECT greatest(c.reltuples, 0)::bigint INTO rows_estimate FROM pg_class c WHERE c.oid = b.relid;
		total_bytes := pg_total_relation_size(b.relid);
		reason := outbox.retire_blocker(b.relid, b.lower, b.upper);
		retirable := reason IS NULL;
		RETURN NEXT;
	END LOOP;
	partition_name := 'event_default'; lower := NULL; upper := NULL;
	SELECT count(*) INTO rows_estimate FROM outbox.event_default;
	total_bytes := pg_total_relation_size('outbox.event_default');
	retirable := false;
	reason := CASE WHEN rows_estimate > 0 THEN 'holds rows beyond the premade partitions: run outbox_maintain()'
				   ELSE 'the default partition catches rows beyond the premade partitions' END;
	RETURN NEXT;
END
$$;
COMMENT ON FUNCTION @extschema@.outbox_partitions() IS
	'pg_outbox: the event partitions with bounds, size, and whether retention may retire them or why not; the default partition''s exact row count';


-- When the last maintenance run (outbox_maintain(), by the background
-- worker, a relay or a scheduler) started and finished; a run writes both
-- as it ends, so a run in progress shows only in pg_stat_activity.
CREATE FUNCTION @extschema@.outbox_maintenance_status()
RETURNS TABLE (last_started_at timestamptz, last_finished_at timestamptz)
LANGUAGE sql STABLE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
	SELECT m.last_started_at, m.last_finished_at FROM outbox.maintenance m
$$;
COMMENT ON FUNCTION @extschema@.outbox_maintenance_status() IS
	'pg_outbox: when maintenance last started and finished';

-- @engine maintenance_databases@


--
-- Privileges: relays (and admins) run maintenance; admins reshape it.
--
REVOKE ALL ON TABLE outbox.maintenance FROM PUBLIC;
REVOKE ALL ON FUNCTION
	outbox.retire_blocker(regclass, xid8, xid8),
	outbox.try_maintenance_lock(),
	@extschema@.outbox_maintain(),
	@extschema@.outbox_drop_empty_partitions(),
	@extschema@.outbox_group_set_stale(text, boolean),
	@extschema@.outbox_partitions(),
	@extschema@.outbox_maintenance_status(),
	@extschema@.outbox_maintenance_databases()
FROM PUBLIC;

GRANT EXECUTE ON FUNCTION
	@extschema@.outbox_maintain(),
	@extschema@.outbox_partitions(),
	@extschema@.outbox_maintenance_status()
TO outbox_relay, outbox_admin;
GRANT EXECUTE ON FUNCTION
	@extschema@.outbox_group_set_stale(text, boolean),
	@extschema@.outbox_drop_empty_partitions(),
	@extschema@.outbox_maintenance_databases()
TO outbox_admin;
GRANT SELECT ON outbox.maintenance TO outbox_admin;
