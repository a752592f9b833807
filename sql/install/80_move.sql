-- pg_outbox install script, part 80: moving a database to the other engine.
-- (assembled with the other parts of sql/install/; see 00_schema_roles.sql).

--
-- Moving between engines. Both engines keep their state in schema "outbox"
-- and a database has one of them, so a move is: copy the state aside,
-- DROP EXTENSION, CREATE EXTENSION of the other engine, copy the state
-- back; in one transaction (scripts/move-engine.sh), so that it happens
-- whole or not at all. Both engines ship these two functions, the same.
--
-- What moves: the settings, the groups (cursors, epochs, streams, stream
-- templates, shards, topics, stale flags), the consumers, the inbox (every
-- row: it is what dedupes redeliveries), the dead letters (with their ids,
-- which inbox_replay() and the parked keys take), the parked keys and
-- their parked entries (acknowledged in their streams: they are kept
-- nowhere else) and the skipped events. What does not: the events. The new engine's tables are new tables, and an event is only
-- safe to leave behind once every group published it; so the copy is
-- refused, naming the group, while any group has an event after its cursor
-- (committed, whether below the horizon or not), and while any relay leads
-- a group (it could be publishing). Transaction ids do not change within a
-- cluster: a drained xid8-ordered group keeps its cursor, and the events
-- written after the move come after it. Commit tickets are the engine's
-- own: a commit-ordered group is re-anchored on the new engine
-- (outbox_reanchor(): the cursor at its commit horizon, the epoch raised so
-- that its stream entry ids go on rising). A copy taken in another cluster
-- re-anchors every group.
--
-- The copy is a schema of plain tables (not members of the extension, so
-- DROP EXTENSION leaves them), created by outbox_export_state() and read by
-- outbox_import_state(): any size of inbox, and the operator can look at
-- it. Both run as the extension's owner, who alone owns the copy.
--

-- The cluster's system identifier, or NULL where this role may not read
-- it (some managed services revoke pg_control_system()).
CREATE FUNCTION outbox.system_identifier()
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	RETURN (SELECT s.system_identifier FROM pg_control_system() s);
EXCEPTION WHEN insufficient_privilege THEN
	RETURN NULL;
END
$$;
COMMENT ON FUNCTION outbox.system_identifier() IS 'pg_outbox: the cluster''s system identifier, or NULL when it cannot be read';

-- Copies the rows of "src" into "dst", by column name: every column of
-- "dst" that "src" has too (cast to its type: a consumer's owner is
-- copied as a role's name), but generated ones (computed again), with the
-- identity values kept (ids are what callers hold: inbox_replay() takes a
-- dead letter's), and each identity sequence moved past them. Returns the
-- rows copied.
CREATE FUNCTION outbox.copy_rows(src regclass, dst regclass)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	cols text;
	vals text;
	n bigint;
	ident record;
BEGIN
	SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum),
		   string_agg(format('%I::%s', a.attname, format_type(a.atttypid, a.atttypmod)), ', ' ORDER BY a.attnum)
	  INTO cols, vals
	  FROM pg_attribute a
	 WHERE a.attrelid = dst AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
	   AND EXISTS (SELECT 1 FROM pg_attribute s
					WHERE s.attrelid = src AND s.attname = a.attname AND s.attnum > 0 AND NOT s.attisdropped);
	EXECUTE format('INSERT INTO %s (%s) OVERRIDING SYSTEM VALUE SELECT %s FROM %s', dst, cols, vals, src);
	GET DIAGNOSTICS n = ROW_COUNT;
	FOR ident IN SELECT a.attname FROM pg_attribute a
				  WHERE a.attrelid = dst AND a.attnum > 0 AND NOT a.attisdropped AND a.attidentity <> ''
	LOOP
		EXECUTE format('SELECT setval(%L, m) FROM (SELECT max(%I) AS m FROM %s) x WHERE m IS NOT NULL',
					   pg_get_serial_sequence(dst::text, ident.attname), ident.attname, dst);
	END LOOP;
	RETURN n;
END
$$;
COMMENT ON FUNCTION outbox.copy_rows(regclass, regclass) IS
	'pg_outbox: copies rows between tables by column name, keeping identity values; returns the rows copied';

-- Copies the state of pg_outbox into a new schema, for
-- outbox_import_state() on the other engine, in the same transaction (or
-- after, with writers stopped). Waits for the transactions that emitted,
-- applied or maintain to end, and keeps new ones waiting until the
-- transaction ends; refuses while a prepared transaction holds a lock on
-- the state, while a relay leads a group, and while a group has an event
-- it has not published.
CREATE FUNCTION @extschema@.outbox_export_state(into_schema name DEFAULT 'outbox_move')
RETURNS TABLE (object text, copied bigint)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	g record;
	first record;
	live record;
	last_event record;
	last_ticket bigint;
	prepared text;
	t text;
BEGIN
	IF into_schema IS NULL THEN
		RAISE EXCEPTION 'into_schema must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF EXISTS (SELECT 1 FROM pg_namespace n WHERE n.nspname OPERATOR(pg_catalog.=) into_schema) THEN
		RAISE EXCEPTION 'schema "%" already exists', into_schema
			USING ERRCODE = 'duplicate_schema',
				  DETAIL = 'outbox_export_state() copies the state into a new schema, so that it never mixes with another copy.',
				  HINT = 'Import the copy it holds with outbox_import_state(), or drop it, or name another schema.';
	END IF;
	-- A prepared transaction that wrote to the state would keep the locks
	-- below waiting until someone ends it: refused at once, by name. (Its
	-- locks are those of the virtual transaction that holds its
	-- transaction id, with no backend.)
	SELECT p.gid INTO prepared
	  FROM pg_prepared_xacts p
	 WHERE p.database OPERATOR(pg_catalog.=) current_database()
	   AND EXISTS (SELECT 1
					 FROM pg_locks x
					 JOIN pg_locks l ON l.virtualtransaction OPERATOR(pg_catalog.=) x.virtualtransaction
					 JOIN pg_class c ON c.oid = l.relation
					WHERE x.locktype OPERATOR(pg_catalog.=) 'transactionid' AND x.pid IS NULL
					  AND x.transactionid = p.transaction
					  AND l.locktype OPERATOR(pg_catalog.=) 'relation' AND l.pid IS NULL
					  AND l.mode OPERATOR(pg_catalog.<>) 'AccessShareLock'
					  AND c.relnamespace = 'outbox'::regnamespace)
	 ORDER BY p.prepared
	 LIMIT 1;
	IF FOUND THEN
		RAISE EXCEPTION 'prepared transaction "%" holds locks on the tables of pg_outbox', prepared
			USING ERRCODE = 'object_in_use',
				  DETAIL = 'It emitted, applied or changed the state in another way; the state is copied only once it has ended.',
				  HINT = 'COMMIT PREPARED or ROLLBACK PREPARED it (its events are then published, or gone), then move again.';
	END IF;
	-- Emitters, relays, consumers and maintenance wait from here to the end
	-- of the transaction; the transactions that wrote before finish first.
	LOCK TABLE outbox.event, outbox.commit_log, outbox.groups, outbox.consumers, outbox.inbox, outbox.dead_letters,
		outbox.parked_keys, outbox.parked_entries, outbox.skipped_events, outbox.config, outbox.maintenance
		IN EXCLUSIVE MODE;
	SELECT x.name, x.shard, x.shards, x.leader_pid INTO live
	  FROM outbox.groups x
	 WHERE outbox.leader_live(x.leader_pid, x.leader_started, x.lease_until)
	 ORDER BY x.name, x.shard
	 LIMIT 1;
	IF FOUND THEN
		RAISE EXCEPTION 'group "%" is being published: its state cannot be copied now',
			live.name OPERATOR(pg_catalog.||) CASE WHEN live.shards OPERATOR(pg_catalog.>) 1
												   THEN '/' OPERATOR(pg_catalog.||) live.shard::text ELSE '' END
			USING ERRCODE = 'object_in_use',
				  DETAIL = format('Backend pid %s leads it.', live.leader_pid),
				  HINT = 'Stop every relay of the database, let none start until the move is over, then move again.';
	END IF;
	-- Every group has published all it has: the events stay behind.
	FOR g IN SELECT * FROM outbox.groups x ORDER BY x.name, x.shard LOOP
		IF g.ordering OPERATOR(pg_catalog.=) 'commit' THEN
			SELECT b.ticket::numeric AS major, b.seq INTO first
			  FROM outbox.commit_backlog(g.cursor_ticket, g.cursor_seq, g.topics, 9223372036854775807::bigint,
										 NULL::xid8, g.shard, g.shards) b
			 LIMIT 1;
		ELSE
			SELECT b.txid::text::numeric AS major, b.seq INTO first
			  FROM outbox.backlog(g.cursor_txid, g.cursor_seq, g.topics, '18446744073709551615'::xid8,
								  g.shard, g.shards) b
			 ORDER BY b.txid, b.seq
			 LIMIT 1;
		END IF;
		IF FOUND THEN
			RAISE EXCEPTION 'group "%" has events it has not published',
				g.name OPERATOR(pg_catalog.||) CASE WHEN g.shards OPERATOR(pg_catalog.>) 1
													THEN '/' OPERATOR(pg_catalog.||) g.shard::text ELSE '' END
				USING ERRCODE = 'object_not_in_prerequisite_state',
					  DETAIL = format('Its cursor is at %s and its next event at %s. Events do not move to the other engine: they would be lost.',
									  g.cursor, concat(first.major OPERATOR(pg_catalog.+) g.epoch::numeric, '-', first.seq)),
					  HINT = format('Let its relay publish them (outbox_group_stats() shows what is left), stop the relay and move again; if the group is not to publish them, move it past them with outbox_rewind(%L, ''now'') or drop it.',
									g.name);
		END IF;
	END LOOP;
	SELECT e.txid, e.seq INTO last_event FROM outbox.event e ORDER BY e.txid DESC, e.seq DESC LIMIT 1;
	SELECT max(c.ticket) INTO last_ticket FROM outbox.commit_log c;

	EXECUTE format('CREATE SCHEMA %I', into_schema);
	EXECUTE format('COMMENT ON SCHEMA %I IS %L', into_schema,
				   'pg_outbox: the state of a database copied by outbox_export_state(), for outbox_import_state()');
	EXECUTE format('CREATE TABLE %I.meta AS SELECT 1 AS format, e.engine, e.version, current_database() AS database,
						   outbox.system_identifier() AS system_identifier, pg_current_xact_id() AS exported_xid,
						   now() AS exported_at
					  FROM outbox.engine() e', into_schema);
	EXECUTE format('CREATE TABLE %I.config AS SELECT * FROM outbox.config', into_schema);
	-- All the events are left behind: as far as the new engine's
	-- outbox_rewind() knows, retention removed them.
	EXECUTE format('CREATE TABLE %I.maintenance AS
					SELECT CASE WHEN $1 IS NOT NULL AND ($1, $2) > (m.retired_txid, m.retired_seq) THEN $1
								ELSE m.retired_txid END AS retired_txid,
						   CASE WHEN $1 IS NOT NULL AND ($1, $2) > (m.retired_txid, m.retired_seq) THEN $2
								ELSE m.retired_seq END AS retired_seq,
						   greatest(m.retired_ticket, $3) AS retired_ticket
					  FROM outbox.maintenance m', into_schema)
		USING last_event.txid, last_event.seq, last_ticket;
	-- Nobody leads a group any more; the new generation fences any
	-- session that still thinks it does.
	EXECUTE format('CREATE TABLE %I.groups AS SELECT * FROM outbox.groups', into_schema);
	EXECUTE format('ALTER TABLE %1$I.groups DROP COLUMN leader_pid, DROP COLUMN leader_started,
						DROP COLUMN lease_renewed, DROP COLUMN lease_until', into_schema);
	EXECUTE format('UPDATE %I.groups SET generation = generation + 1', into_schema);
	-- A role by name, which another cluster resolves to its own.
	EXECUTE format('CREATE TABLE %I.consumers AS SELECT c.name, c.owner::text AS owner, c.created_at
					  FROM outbox.consumers c', into_schema);
	EXECUTE format('CREATE TABLE %I.inbox AS SELECT * FROM outbox.inbox', into_schema);
	EXECUTE format('CREATE TABLE %I.dead_letters AS SELECT * FROM outbox.dead_letters', into_schema);
	EXECUTE format('CREATE TABLE %I.parked_keys AS SELECT * FROM outbox.parked_keys', into_schema);
	EXECUTE format('CREATE TABLE %I.parked_entries AS SELECT * FROM outbox.parked_entries', into_schema);
	EXECUTE format('CREATE TABLE %I.skipped_events AS SELECT * FROM outbox.skipped_events', into_schema);
	FOREACH t IN ARRAY ARRAY['config', 'groups', 'consumers', 'inbox', 'dead_letters', 'parked_keys', 'parked_entries',
							 'skipped_events'] LOOP
		object := t;
		EXECUTE format('SELECT count(*) FROM %I.%I', into_schema, t) INTO copied;
		RETURN NEXT;
	END LOOP;
	RAISE LOG 'pg_outbox: state of database "%" copied into schema "%"', current_database(), into_schema;
END
$$;
COMMENT ON FUNCTION @extschema@.outbox_export_state(name) IS
	'pg_outbox: copies the state (settings, groups, consumers, inbox, dead letters, parked keys) into a new schema, to move to the other engine; refused while a group has events to publish or a relay leads one';

-- Restores the state outbox_export_state() copied, into a database where
-- pg_outbox (either engine) was just installed: the rows with their ids,
-- the inbox rows into their day partitions, the index of each shard count.
-- A copy made before keys could park has no parked keys, and dead letters
-- without the columns of inbox_skip(): it is imported as it is (a column
-- the copy lacks takes its default).
-- Re-anchors the commit-ordered groups (tickets are the engine's own), and
-- every group when "reanchor" is true, or when it is NULL and the copy
-- comes from another cluster. Returns what it did, a row per step.
CREATE FUNCTION @extschema@.outbox_import_state(from_schema name DEFAULT 'outbox_move', reanchor boolean DEFAULT NULL)
RETURNS TABLE (action text, object text, detail text)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	meta record;
	owner name;
	have record;
	g record;
	n bigint;
	t text;
	other_cluster boolean;
	commit_group text;
	was text;
BEGIN
	IF from_schema IS NULL THEN
		RAISE EXCEPTION 'from_schema must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	SELECT r.rolname INTO owner
	  FROM pg_namespace s JOIN pg_roles r ON r.oid = s.nspowner
	 WHERE s.nspname OPERATOR(pg_catalog.=) from_schema;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'schema "%" does not exist', from_schema
			USING ERRCODE = 'invalid_schema_name',
				  HINT = 'Copy the state with outbox_export_state() first, in the database on the other engine.';
	END IF;
	-- Only the copy outbox_export_state() made: the owner of pg_outbox
	-- writes these rows, which no other role could write itself.
	IF owner OPERATOR(pg_catalog.<>) CURRENT_USER THEN
		RAISE EXCEPTION 'schema "%" is not owned by role "%", which owns pg_outbox', from_schema, CURRENT_USER
			USING ERRCODE = 'insufficient_privilege',
				  DETAIL = format('It is owned by role "%s". The state is imported only from a copy its owner made.', owner),
				  HINT = format('Check what it holds, then ALTER SCHEMA %I OWNER TO %I (and its tables).', from_schema, CURRENT_USER);
	END IF;
	IF to_regclass(format('%I.meta', from_schema)) IS NULL THEN
		RAISE EXCEPTION 'schema "%" holds no state copied by outbox_export_state()', from_schema
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	EXECUTE format('SELECT * FROM %I.meta', from_schema) INTO meta;
	IF meta.format IS DISTINCT FROM 1 THEN
		RAISE EXCEPTION 'schema "%" holds a copy of format %, which this version cannot import', from_schema, meta.format
			USING ERRCODE = 'feature_not_supported',
				  HINT = 'Import it with the version of pg_outbox that copied it, or a later one.';
	END IF;
	LOCK TABLE outbox.event, outbox.commit_log, outbox.groups, outbox.consumers, outbox.inbox, outbox.dead_letters,
		outbox.parked_keys, outbox.parked_entries, outbox.skipped_events, outbox.config, outbox.maintenance
		IN EXCLUSIVE MODE;
	SELECT (SELECT count(*) FROM outbox.groups) AS groups, (SELECT count(*) FROM outbox.consumers) AS consumers,
		   (SELECT count(*) FROM outbox.inbox) AS inbox, (SELECT count(*) FROM outbox.dead_letters) AS dead_letters,
		   (SELECT count(*) FROM outbox.parked_keys) AS parked_keys,
		   (SELECT count(*) FROM outbox.parked_entries) AS parked_entries,
		   (SELECT count(*) FROM outbox.skipped_events) AS skipped
	  INTO have;
	IF have.groups OPERATOR(pg_catalog.>) 0 OR have.consumers OPERATOR(pg_catalog.>) 0
	   OR have.inbox OPERATOR(pg_catalog.>) 0 OR have.dead_letters OPERATOR(pg_catalog.>) 0
	   OR have.parked_keys OPERATOR(pg_catalog.>) 0 OR have.parked_entries OPERATOR(pg_catalog.>) 0
	   OR have.skipped OPERATOR(pg_catalog.>) 0 THEN
		RAISE EXCEPTION 'pg_outbox in database "%" has a state of its own already', current_database()
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  DETAIL = format('It has %s groups, %s consumers, %s inbox rows, %s dead letters, %s parked keys, %s parked entries and %s skipped events.',
								  have.groups, have.consumers, have.inbox, have.dead_letters, have.parked_keys,
								  have.parked_entries, have.skipped),
				  HINT = 'Import into a database where pg_outbox was just installed.';
	END IF;
	-- Commit-ordered groups need the new engine's commit tickets.
	EXECUTE format('SELECT name FROM %I.groups WHERE ordering = %L ORDER BY name LIMIT 1', from_schema, 'commit')
		INTO commit_group;
	IF commit_group IS NOT NULL AND NOT outbox.commit_order_available() THEN
		RAISE EXCEPTION 'group "%" is in commit order, which this server does not provide', commit_group
			USING ERRCODE = 'feature_not_supported',
				  DETAIL = CASE WHEN (outbox.engine()).engine OPERATOR(pg_catalog.=) 'sql'
								THEN 'The SQL engine of pg_outbox has no commit order.'
								ELSE 'The C engine orders commits only where pg_outbox is preloaded, on a primary.' END,
				  HINT = 'Import where commits are ordered, or drop the group before the copy and create it again in xid8 order.';
	END IF;

	FOREACH t IN ARRAY ARRAY['config', 'groups', 'consumers', 'inbox', 'dead_letters', 'parked_keys', 'parked_entries',
							 'skipped_events'] LOOP
		-- The parked keys are not in a copy made before keys could park.
		CONTINUE WHEN t OPERATOR(pg_catalog.=) ANY (ARRAY['parked_keys', 'parked_entries'])
			AND to_regclass(format('%I.%I', from_schema, t)) IS NULL;
		n := outbox.copy_rows(format('%I.%I', from_schema, t)::regclass, format('outbox.%I', t)::regclass);
		action := 'restored'; object := t;
		detail := format('%s %s', n, CASE WHEN n OPERATOR(pg_catalog.=) 1 THEN 'row' ELSE 'rows' END);
		RETURN NEXT;
	END LOOP;
	EXECUTE format('UPDATE outbox.maintenance m
					   SET retired_txid = greatest(m.retired_txid, c.retired_txid),
						   retired_seq = CASE WHEN c.retired_txid > m.retired_txid THEN c.retired_seq
											  WHEN c.retired_txid = m.retired_txid THEN greatest(m.retired_seq, c.retired_seq)
											  ELSE m.retired_seq END,
						   retired_ticket = greatest(m.retired_ticket, c.retired_ticket)
					  FROM %I.maintenance c', from_schema);
	-- The index of each shard count in use; the inbox rows out of the
	-- default partition, into their days'.
	FOR g IN SELECT DISTINCT x.shards FROM outbox.groups x WHERE x.shards OPERATOR(pg_catalog.>) 1 ORDER BY 1 LOOP
		IF outbox.ensure_shard_index(g.shards) THEN
			action := 'created'; object := format('outbox.%I', outbox.shard_index_name(g.shards)); detail := NULL;
			RETURN NEXT;
		END IF;
	END LOOP;
	n := outbox.inbox_premake_partitions();
	IF n OPERATOR(pg_catalog.>) 0 THEN
		action := 'created'; object := 'outbox.inbox'; detail := format('%s day partitions', n);
		RETURN NEXT;
	END IF;

	other_cluster := (meta.system_identifier IS NOT NULL AND outbox.system_identifier() IS NOT NULL
					  AND meta.system_identifier OPERATOR(pg_catalog.<>) outbox.system_identifier())
					 OR meta.exported_xid OPERATOR(pg_catalog.>) pg_current_xact_id();
	FOR g IN SELECT x.name, x.shard, x.shards, x.ordering, x.cursor FROM outbox.groups x ORDER BY x.name, x.shard LOOP
		CONTINUE WHEN g.ordering OPERATOR(pg_catalog.=) 'xid8' AND NOT coalesce(reanchor, other_cluster);
		was := g.cursor;
		object := g.name OPERATOR(pg_catalog.||) CASE WHEN g.shards OPERATOR(pg_catalog.>) 1
													  THEN '/' OPERATOR(pg_catalog.||) g.shard::text ELSE '' END;
		action := 'reanchored';
		detail := format('cursor %s (was %s)', outbox.reanchor(object), was);
		RETURN NEXT;
	END LOOP;
	RAISE LOG 'pg_outbox: state copied from database "%" (engine %, %) imported from schema "%"',
		meta.database, meta.engine, meta.exported_at, from_schema;
END
$$;
COMMENT ON FUNCTION @extschema@.outbox_import_state(name, boolean) IS
	'pg_outbox: restores the state outbox_export_state() copied into a database where pg_outbox was just installed; re-anchors the groups that need it';

--
-- Privileges: admins move.
--
REVOKE ALL ON FUNCTION
	outbox.system_identifier(),
	outbox.copy_rows(regclass, regclass),
	@extschema@.outbox_export_state(name),
	@extschema@.outbox_import_state(name, boolean)
FROM PUBLIC;

GRANT EXECUTE ON FUNCTION
	@extschema@.outbox_export_state(name),
	@extschema@.outbox_import_state(name, boolean)
TO outbox_admin;
