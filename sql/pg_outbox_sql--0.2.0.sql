-- pg_outbox install script, part 00: schema, roles and settings.
--
-- The install script is assembled from the parts in sql/install/, which the
-- Makefile concatenates in name order into sql/pg_outbox--<version>.sql.
-- Each part may use what the parts before it define (a SQL-language
-- function's tables and types, a view's functions), and ends with the
-- privileges on its own objects: nothing for PUBLIC, then the grants to
-- outbox_writer, outbox_relay, outbox_consumer and outbox_admin.
--
-- Layout: storage and internals live in schema "outbox"; the functions that
-- applications and relays call live in the extension's schema (by default
-- the first schema of search_path, usually "public"), so that
-- outbox_emit() works with the default search_path.

-- SQLSTATEs of pg_outbox's own, class OB (the same table as
-- extension/sqlstates.h and relay/include/pg_outbox/sqlstates.hpp, which
-- test/layout.sh compares; a SQL part names a code only in a RAISE's
-- ERRCODE, and only a code of this table):
--
--   SQLSTATE  name                condition
--   OB001     identity_conflict   an event id applied before with another payload (the inbox)
--   OB002     rewound             the leader's group's cursor was moved by outbox_rewind() or outbox_skip()
--   OB003     not_leader          this session does not lead the group (any more)
--   OB004     event_too_large     the group's next event is too large to publish

\echo Use "CREATE EXTENSION pg_outbox_sql" to load this file. \quit
-- The preamble of every script of pg_outbox, the install script and each
-- upgrade script: make puts it right after the script's \echo guard
-- (Makefile). It is written once, here. ALTER EXTENSION UPDATE runs with
-- the search_path CREATE EXTENSION would use, so what follows holds for
-- both.
--
-- What the script resolves (I-17). It runs as a superuser, with
-- search_path set by CREATE EXTENSION to the extension's schema and
-- pg_temp: an operator or function planted there (or in any schema named
-- later) that matches an expression's argument types better than
-- pg_catalog's own would be bound into a generated column, a default, a
-- check or a view, or run at once by a DO block. So the script resolves
-- names in pg_catalog alone, until its end (CREATE EXTENSION then restores
-- the search_path it set), and creates every object with its schema
-- named. On top of that, every function is called qualified, and an
-- operator applied to operands of two types is written
-- OPERATOR(pg_catalog.op) with the operands cast to the types of the
-- operator meant. test/ops/install_traps.sh plants a trap for each
-- operator and function name the scripts use and checks that none fires.
--
SET LOCAL search_path = pg_catalog, pg_temp;

-- The owner of the extension's schema can drop and rename what is in it:
-- it could move the extension's functions aside and put its own under
-- their names, which other roles and the extension's own code then call,
-- or drop the extension with the schema (and every event with it). Only a
-- role that could do as much anyway may own it: a superuser, the
-- installing role, or the database's owner (who can drop the database).
-- The same check runs on ALTER EXTENSION UPDATE.
DO $owner$
DECLARE
	s record;
BEGIN
	SELECT n.nspname, o.rolname, o.rolsuper OR o.rolname = CURRENT_USER
			   OR o.oid IN ('pg_database_owner'::pg_catalog.regrole::pg_catalog.oid, d.datdba) AS trusted
	  INTO s
	  FROM pg_catalog.pg_extension e
	  JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
	  JOIN pg_catalog.pg_roles o ON o.oid = n.nspowner
	  JOIN pg_catalog.pg_database d ON d.datname = pg_catalog.current_database()
	 WHERE e.extname IN ('pg_outbox', 'pg_outbox_sql');
	IF NOT s.trusted THEN
		RAISE EXCEPTION 'pg_outbox cannot be installed in schema "%": it is owned by role "%"', s.nspname, s.rolname
			USING ERRCODE = 'insufficient_privilege',
				  DETAIL = 'The owner of the extension''s schema could drop or rename the extension''s functions and put its own in their place, which the extension and its roles would then call; only a superuser, the installing role or the database''s owner may own it.',
				  HINT = pg_catalog.format('Install pg_outbox in a schema owned by one of them, or change the owner of schema %I first (ALTER SCHEMA %I OWNER TO ...).', s.nspname, s.nspname);
	END IF;
END
$owner$;

-- (make puts sql/preamble.sql right after the \echo guard above: what the
-- script resolves, and who may own the extension's schema.)

-- One engine per database: both keep their state in schema "outbox".
DO $installed$
BEGIN
	IF pg_catalog.to_regnamespace('outbox') IS NOT NULL THEN
		RAISE EXCEPTION 'pg_outbox is installed in database "%" already, or another schema is named "outbox"',
				pg_catalog.current_database()
			USING ERRCODE = 'duplicate_schema',
				  DETAIL = 'pg_outbox keeps its events, groups and inbox in schema "outbox"; its C engine (pg_outbox) and its SQL engine (pg_outbox_sql) both do, so a database has one of them.',
				  HINT = 'SELECT * FROM outbox.engine() names the engine installed; to change engines, follow "Moving between engines" in the README.';
	END IF;
END
$installed$;

CREATE SCHEMA outbox;
COMMENT ON SCHEMA outbox IS 'pg_outbox storage and internals';
REVOKE ALL ON SCHEMA outbox FROM PUBLIC;

-- Which engine this is (SQL: SQL and PL/pgSQL only), the version of its
-- scripts and the schema of the API: what a relay reads first, from the
-- fixed schema "outbox", to know where the API is and what it has.
CREATE FUNCTION outbox.engine(OUT engine text, OUT version text, OUT api_schema name)
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 'sql'::pg_catalog.text, '0.2.0'::pg_catalog.text, '@extschema@'::pg_catalog.name $$;
COMMENT ON FUNCTION outbox.engine() IS 'pg_outbox: the engine installed (sql: SQL and PL/pgSQL only), its version and the schema of its API';

--
-- Roles. Roles are cluster-wide: the first database to install the
-- extension creates them, later ones reuse them, whoever created them. DROP
-- EXTENSION leaves them. A role that is not a superuser (the SQL engine's
-- plain script on a managed service, an extension of pg_tle) creates them
-- with CREATEROLE; without it, the roles must exist, and the install stops
-- here, saying which are missing, before CREATE ROLE would fail with less.
--
DO $roles$
DECLARE
	missing text[];
	r text;
BEGIN
	SELECT pg_catalog.array_agg(w.r ORDER BY w.n) INTO missing
	  FROM pg_catalog.unnest(ARRAY['outbox_writer', 'outbox_relay', 'outbox_consumer', 'outbox_admin']) WITH ORDINALITY AS w (r, n)
	 WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles o WHERE o.rolname OPERATOR(pg_catalog.=) w.r);
	IF missing IS NOT NULL AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles o
											WHERE o.rolname OPERATOR(pg_catalog.=) CURRENT_USER
											  AND (o.rolsuper OR o.rolcreaterole)) THEN
		RAISE EXCEPTION 'role "%" cannot install pg_outbox: it may not create the missing roles %',
				CURRENT_USER, pg_catalog.array_to_string(missing, ', ')
			USING ERRCODE = 'insufficient_privilege',
				  DETAIL = 'pg_outbox grants its privileges to the roles outbox_writer, outbox_relay, outbox_consumer and outbox_admin, which the databases of a cluster share; the first install creates those that do not exist, which takes CREATEROLE.',
				  HINT = pg_catalog.format('Install pg_outbox as a role with CREATEROLE, or have such a role create the missing roles first: %s',
										   (SELECT pg_catalog.string_agg(pg_catalog.format('CREATE ROLE %I NOLOGIN;', m), ' ')
											  FROM pg_catalog.unnest(missing) AS m));
	END IF;
	FOREACH r IN ARRAY COALESCE(missing, ARRAY[]::text[])
	LOOP
		EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', r);
	END LOOP;
END
$roles$;

--
-- Settings, one row. Registered for pg_dump.
--
CREATE TABLE outbox.config (
	only_row boolean NOT NULL DEFAULT true,
	partition_width bigint NOT NULL DEFAULT 10000000,
	premake integer NOT NULL DEFAULT 4,
	retention interval NOT NULL DEFAULT '3 days',
	retire_mode text NOT NULL DEFAULT 'drop',
	lock_timeout interval NOT NULL DEFAULT '200 milliseconds',
	max_group_lag interval NOT NULL DEFAULT '1 day',
	inbox_retention interval NOT NULL DEFAULT '7 days',
	CONSTRAINT config_pkey PRIMARY KEY (only_row),
	CONSTRAINT config_only_row CHECK (only_row),
	CONSTRAINT config_partition_width_range CHECK (partition_width BETWEEN 100 AND 1000000000000),
	CONSTRAINT config_premake_range CHECK (premake BETWEEN 1 AND 1000),
	CONSTRAINT config_retention_check CHECK (retention >= interval '0'),
	CONSTRAINT config_retire_mode_check CHECK (retire_mode IN ('drop', 'detach')),
	CONSTRAINT config_lock_timeout_check CHECK (lock_timeout BETWEEN interval '1 millisecond' AND interval '1 minute'),
	CONSTRAINT config_max_group_lag_check CHECK (max_group_lag > interval '0'),
	CONSTRAINT config_inbox_retention_check CHECK (inbox_retention >= interval '1 day')
);
COMMENT ON TABLE outbox.config IS 'pg_outbox settings (one row)';
COMMENT ON COLUMN outbox.config.partition_width IS 'transaction ids covered by one event partition';
COMMENT ON COLUMN outbox.config.premake IS 'partitions kept ready ahead of the current transaction id';
COMMENT ON COLUMN outbox.config.retention IS 'how long events are kept after every live group passed them';
COMMENT ON COLUMN outbox.config.retire_mode IS 'drop: retired partitions are dropped; detach: kept as tables outside the feed';
COMMENT ON COLUMN outbox.config.lock_timeout IS 'longest wait of maintenance DDL for a lock before it retries on a later run';
COMMENT ON COLUMN outbox.config.max_group_lag IS 'a group whose oldest waiting event is older than this is reported as lagging';
COMMENT ON COLUMN outbox.config.inbox_retention IS 'how long the inbox remembers applied events; must cover the broker''s retention and any replay window';
INSERT INTO outbox.config DEFAULT VALUES;
SELECT pg_catalog.pg_extension_config_dump('outbox.config', '');

-- pg_dump copies the settings row; CREATE EXTENSION in the restored
-- database has inserted the defaults already. The restored row replaces
-- them (an insert replaces the row: there is only one).
CREATE FUNCTION outbox.config_replace()
RETURNS trigger
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	DELETE FROM outbox.config;
	RETURN NEW;
END
$$;
COMMENT ON FUNCTION outbox.config_replace() IS 'pg_outbox: an inserted settings row replaces the existing one (restores)';
CREATE TRIGGER config_replace BEFORE INSERT ON outbox.config
	FOR EACH ROW EXECUTE FUNCTION outbox.config_replace();

--
-- Privileges: the settings are read and changed by outbox_admin only.
--
REVOKE ALL ON TABLE outbox.config FROM PUBLIC;
REVOKE ALL ON FUNCTION
	outbox.engine(),
	outbox.config_replace()
FROM PUBLIC;

GRANT USAGE ON SCHEMA outbox TO outbox_writer, outbox_relay, outbox_consumer, outbox_admin;
GRANT EXECUTE ON FUNCTION outbox.engine() TO outbox_writer, outbox_relay, outbox_consumer, outbox_admin;
GRANT SELECT, UPDATE ON outbox.config TO outbox_admin;
-- pg_outbox install script, part 10: events, partitions, horizons, emission.
-- (assembled with the other parts of sql/install/; see 00_schema_roles.sql).

--
-- The event table: insert-only, range-partitioned on the emitting
-- transaction's top-level id. (txid, seq) is the feed position: txid orders
-- transactions, seq orders the events within one transaction.
--
CREATE TABLE outbox.event (
	txid xid8 NOT NULL,
	seq bigint NOT NULL,
	event_id uuid NOT NULL,
	topic text NOT NULL,
	key text,
	payload jsonb NOT NULL,
	headers jsonb,
	created_at timestamptz NOT NULL,
	CONSTRAINT event_pkey PRIMARY KEY (txid, seq)
) PARTITION BY RANGE (txid);
COMMENT ON TABLE outbox.event IS 'pg_outbox events: insert-only, partitioned by transaction id; write with outbox_emit()';
COMMENT ON COLUMN outbox.event.txid IS 'top-level transaction id of the emitting transaction';
COMMENT ON COLUMN outbox.event.seq IS 'order of the event within its transaction';

-- Catches any row beyond the premade partitions, so that emission never
-- fails for want of a partition.
CREATE TABLE outbox.event_default PARTITION OF outbox.event DEFAULT;
COMMENT ON TABLE outbox.event_default IS 'pg_outbox: events beyond the premade partitions (normally empty)';

--
-- Commit order: one marker per committed transaction that emitted, written
-- at its pre-commit with the ticket that orders commits (extension/commit.c;
-- only when pg_outbox is preloaded). Partitioned like outbox.event with the
-- same bounds: the markers of a range of transactions are made and retired
-- with their events.
--
-- Readers scan markers in ticket order, by the one index (txid included, so
-- that the scan reads no heap). There is no key on txid: the commit callback
-- writes one marker per transaction and nothing looks one up by its
-- transaction, and a second index would cost every emitting transaction
-- about a third of its marker's instructions.
--
CREATE TABLE outbox.commit_log (
	txid xid8 NOT NULL,
	ticket bigint NOT NULL
) PARTITION BY RANGE (txid);
CREATE INDEX commit_log_ticket_idx ON outbox.commit_log (ticket) INCLUDE (txid);
COMMENT ON TABLE outbox.commit_log IS 'pg_outbox: commit ticket of each committed transaction that emitted; orders commit-ordered groups';
COMMENT ON COLUMN outbox.commit_log.ticket IS 'commit ticket: tickets grow in the order in which transactions committed';
CREATE TABLE outbox.commit_log_default PARTITION OF outbox.commit_log DEFAULT;
COMMENT ON TABLE outbox.commit_log_default IS 'pg_outbox: commit markers beyond the premade partitions (normally empty)';

-- Name of the partition that starts at "lower".
CREATE FUNCTION outbox.partition_name(lower xid8)
RETURNS name
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT pg_catalog.format('event_%s', lower)::name $$;
COMMENT ON FUNCTION outbox.partition_name(xid8) IS 'pg_outbox: name of the event partition starting at a transaction id';

-- Name of the commit marker partition that starts at "lower".
CREATE FUNCTION outbox.commit_partition_name(lower xid8)
RETURNS name
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT pg_catalog.format('commit_log_%s', lower)::name $$;
COMMENT ON FUNCTION outbox.commit_partition_name(xid8) IS 'pg_outbox: name of the commit marker partition starting at a transaction id';

-- The range partitions of outbox.event with their bounds.
CREATE FUNCTION outbox.partition_bounds(OUT relid regclass, OUT name name, OUT lower xid8, OUT upper xid8)
RETURNS SETOF record
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
	SELECT c.oid::regclass, c.relname, b[1]::xid8, b[2]::xid8
	  FROM pg_inherits i
	  JOIN pg_class c ON c.oid = i.inhrelid
	 CROSS JOIN LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid),
									 'FROM \(''(\d+)''\) TO \(''(\d+)''\)') b
	 WHERE i.inhparent = 'outbox.event'::regclass
	   AND b IS NOT NULL
	 ORDER BY 3
$$;
COMMENT ON FUNCTION outbox.partition_bounds() IS 'pg_outbox: the range partitions of outbox.event and their bounds';

-- The range a new partition for transaction id "x" gets: partition_width
-- wide and aligned, clipped so as not to overlap the partitions around it
-- (they may have another width). NULL when a partition holds "x" already.
CREATE FUNCTION outbox.free_range(x xid8, OUT lower xid8, OUT upper xid8)
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	width numeric := (SELECT partition_width FROM outbox.config);
	lo numeric := div(x::text::numeric, width) * width;
	hi numeric := lo + width;
	b record;
BEGIN
	FOR b IN SELECT * FROM outbox.partition_bounds() LOOP
		IF b.lower <= x AND x < b.upper THEN
			RETURN;
		END IF;
		IF b.upper <= x AND b.upper::text::numeric > lo THEN
			lo := b.upper::text::numeric;
		END IF;
		IF b.lower > x AND b.lower::text::numeric < hi THEN
			hi := b.lower::text::numeric;
		END IF;
	END LOOP;
	lower := lo::text::xid8;
	upper := hi::text::xid8;
END
$$;
COMMENT ON FUNCTION outbox.free_range(xid8) IS 'pg_outbox: the bounds a new event partition holding a transaction id gets';

-- Creates the partitions [lower, upper) of outbox.event and of
-- outbox.commit_log and attaches them, moving into each the rows of its
-- default partition that belong to it, all in the caller's
-- (sub)transaction: readers see the rows in the default partition or in
-- the new one, never in neither. The default partition is locked first:
-- the attach scans it. Returns the events moved.
-- Makes a table pg_outbox created a member of the extension, or no longer
-- one, whichever it is not yet (during CREATE EXTENSION tables are members
-- already). Event and marker partitions are members: pg_dump leaves them
-- out, with their events, which another cluster's transaction ids could not
-- order. Inbox partitions are not: they are dumped, rows and all.
CREATE FUNCTION outbox.set_member(rel regclass, member boolean)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	ext name;
BEGIN
	-- pg_outbox, pg_outbox_sql, or none: the SQL engine installed by a plain
	-- script (sql/pg_outbox_sql.sql) has no extension to be a member of.
	SELECT x.extname INTO ext
	  FROM pg_depend d JOIN pg_extension x ON x.oid = d.refobjid
	 WHERE d.classid = 'pg_class'::regclass AND d.objid = 'outbox.config'::regclass
	   AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e';
	IF ext IS NOT NULL AND member <> EXISTS (SELECT 1 FROM pg_depend d
											  WHERE d.classid = 'pg_class'::regclass AND d.objid = rel
												AND d.deptype = 'e') THEN
		EXECUTE format('ALTER EXTENSION %I %s TABLE %s', ext, CASE WHEN member THEN 'ADD' ELSE 'DROP' END, rel);
	END IF;
END
$$;
COMMENT ON FUNCTION outbox.set_member(regclass, boolean) IS 'pg_outbox: makes a table a member of the extension, or no longer one';

CREATE FUNCTION outbox.attach_range(lower xid8, upper xid8)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	parent text;
	part name;
	n bigint;
	moved bigint;
BEGIN
	-- The events' partition, then the commit markers' partition of the same
	-- transactions.
	FOREACH parent IN ARRAY ARRAY['event', 'commit_log'] LOOP
		part := CASE parent WHEN 'event' THEN outbox.partition_name(lower) ELSE outbox.commit_partition_name(lower) END;
		EXECUTE format('LOCK TABLE outbox.%I IN ACCESS EXCLUSIVE MODE', parent || '_default');
		EXECUTE format('CREATE TABLE outbox.%I (LIKE outbox.%I INCLUDING DEFAULTS)', part, parent);
		PERFORM outbox.set_member(format('outbox.%I', part)::regclass, true);
		EXECUTE format('WITH moved AS (DELETE FROM outbox.%I WHERE txid >= %L AND txid < %L RETURNING *)
						INSERT INTO outbox.%I SELECT * FROM moved', parent || '_default', lower, upper, part);
		GET DIAGNOSTICS n = ROW_COUNT;
		moved := coalesce(moved, n);
		-- A valid constraint spares the attach a scan of the new table.
		EXECUTE format('ALTER TABLE outbox.%I ADD CONSTRAINT %I CHECK (txid >= %L AND txid < %L)',
					   part, part || '_bounds', lower, upper);
		EXECUTE format('ALTER TABLE outbox.%I ATTACH PARTITION outbox.%I FOR VALUES FROM (%L) TO (%L)',
					   parent, part, lower, upper);
		EXECUTE format('ALTER TABLE outbox.%I DROP CONSTRAINT %I', part, part || '_bounds');
	END LOOP;
	RETURN moved;
END
$$;
COMMENT ON FUNCTION outbox.attach_range(xid8, xid8) IS 'pg_outbox: creates and attaches an event partition and its commit marker partition, moving their rows out of the default partitions';

-- Install: the partitions from the current transaction id to the headroom.
DO $install$
DECLARE
	x numeric := pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text::numeric;
	width numeric := (SELECT c.partition_width::numeric FROM outbox.config c);
	r record;
BEGIN
	FOR i IN 0 .. (SELECT c.premake FROM outbox.config c) LOOP
		SELECT * INTO r
		  FROM outbox.free_range((x OPERATOR(pg_catalog.+) (i::numeric OPERATOR(pg_catalog.*) width))::text::xid8);
		IF r.lower IS NOT NULL THEN
			PERFORM outbox.attach_range(r.lower, r.upper);
		END IF;
	END LOOP;
END
$install$;

--
-- The feed horizon: every transaction id below it has finished, so the
-- committed events below it are final and no event can still appear there.
-- This is the single definition of the xid8 feed's horizon; the view and the
-- fetch function inline it.
--
CREATE FUNCTION outbox.horizon()
RETURNS xid8
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT pg_catalog.pg_snapshot_xmin(pg_catalog.pg_current_snapshot()) $$;
COMMENT ON FUNCTION outbox.horizon() IS 'pg_outbox: xid8 feed horizon; all events of transactions below it are final';

CREATE VIEW outbox.feed AS
	SELECT e.txid, e.seq, e.event_id, e.topic, e.key, e.payload, e.headers, e.created_at
	  FROM outbox.event e
	 WHERE e.txid < outbox.horizon()
	 ORDER BY e.txid, e.seq;
COMMENT ON VIEW outbox.feed IS 'pg_outbox: committed events below the horizon, in feed order';

-- The commit horizon: every commit ticket at or below it is final. Read it
-- before the snapshot that reads the markers, in an earlier statement.
CREATE FUNCTION outbox.commit_horizon()
RETURNS bigint
AS '$libdir/pg_outbox', 'outbox_commit_horizon'
LANGUAGE C VOLATILE STRICT PARALLEL RESTRICTED;
COMMENT ON FUNCTION outbox.commit_horizon() IS 'pg_outbox: commit horizon; every commit ticket at or below it is final (needs preloading)';

CREATE FUNCTION outbox.commit_order_available()
RETURNS boolean
AS '$libdir/pg_outbox', 'outbox_commit_order_available'
LANGUAGE C VOLATILE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION outbox.commit_order_available() IS 'pg_outbox: whether this server orders commits (pg_outbox preloaded, not a standby)';

-- Waits until no prepared transaction that emitted is pending, and keeps
-- new ones out until the end of the transaction.
CREATE FUNCTION outbox.commit_order_lock()
RETURNS void
AS '$libdir/pg_outbox', 'outbox_commit_order_lock'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.commit_order_lock() IS 'pg_outbox: waits for prepared transactions that emitted, and keeps new ones out';

--
-- Emission (C).
--
CREATE FUNCTION @extschema@.outbox_emit(topic text, key text, payload jsonb,
										headers jsonb DEFAULT NULL, event_id uuid DEFAULT NULL)
RETURNS uuid
AS '$libdir/pg_outbox', 'outbox_emit'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION @extschema@.outbox_emit(text, text, jsonb, jsonb, uuid) IS
	'pg_outbox: writes one event in the current transaction and returns its event id';

CREATE FUNCTION @extschema@.outbox_emit_many(topic text, keys text[], payloads jsonb[],
											 headers jsonb[] DEFAULT NULL, event_ids uuid[] DEFAULT NULL)
RETURNS SETOF uuid
AS '$libdir/pg_outbox', 'outbox_emit_many'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1000;
COMMENT ON FUNCTION @extschema@.outbox_emit_many(text, text[], jsonb[], jsonb[], uuid[]) IS
	'pg_outbox: writes one event per array element in the current transaction and returns their event ids in order';

--
-- Privileges: writers emit; relays read the feed and its horizons.
--
REVOKE ALL ON TABLE outbox.event, outbox.event_default, outbox.commit_log, outbox.commit_log_default, outbox.feed
FROM PUBLIC;
-- The partitions made at install, like the tables they belong to.
DO $revoke$
DECLARE
	p regclass;
BEGIN
	FOR p IN SELECT inhrelid::regclass FROM pg_catalog.pg_inherits
			  WHERE inhparent IN ('outbox.event'::regclass, 'outbox.commit_log'::regclass)
	LOOP
		EXECUTE pg_catalog.format('REVOKE ALL ON TABLE %s FROM PUBLIC', p);
	END LOOP;
END
$revoke$;
REVOKE ALL ON FUNCTION
	outbox.partition_name(xid8),
	outbox.commit_partition_name(xid8),
	outbox.partition_bounds(),
	outbox.free_range(xid8),
	outbox.set_member(regclass, boolean),
	outbox.attach_range(xid8, xid8),
	outbox.horizon(),
	outbox.commit_horizon(),
	outbox.commit_order_available(),
	outbox.commit_order_lock(),
	@extschema@.outbox_emit(text, text, jsonb, jsonb, uuid),
	@extschema@.outbox_emit_many(text, text[], jsonb[], jsonb[], uuid[])
FROM PUBLIC;

GRANT EXECUTE ON FUNCTION
	@extschema@.outbox_emit(text, text, jsonb, jsonb, uuid),
	@extschema@.outbox_emit_many(text, text[], jsonb[], jsonb[], uuid[])
TO outbox_writer, outbox_admin;
GRANT EXECUTE ON FUNCTION outbox.horizon(), outbox.commit_horizon() TO outbox_relay, outbox_admin;
GRANT SELECT ON outbox.feed TO outbox_relay, outbox_admin;
GRANT SELECT ON outbox.event, outbox.commit_log TO outbox_admin;
-- pg_outbox install script, part 20: feed positions.
-- (assembled with the other parts of sql/install/; see 00_schema_roles.sql).

--
-- Positions: "<txid>-<seq>", the same text as the Redis stream entry id a
-- relay gives the event ("<ticket>-<seq>" in commit order), plus the
-- group's epoch. One parser, in C (position.c), which outbox_fetch() uses
-- too: the same text is refused with the same message everywhere.
--
-- The internal helpers that run on every advance (parse_position,
-- parse_commit_position, unshift_position, get_group) pin no search_path
-- of their own: the functions that call them do, and a role that calls
-- them directly runs them with its own privileges. Each SET clause costs a
-- save and restore of settings per call.
CREATE FUNCTION outbox.parse_position(pos text, OUT txid xid8, OUT seq bigint)
AS '$libdir/pg_outbox', 'outbox_parse_position'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION outbox.parse_position(text) IS 'pg_outbox: splits a feed position "<txid>-<seq>"';

-- Splits a commit-order position "<ticket>-<seq>".
CREATE FUNCTION outbox.parse_commit_position(pos text, OUT ticket bigint, OUT seq bigint)
AS '$libdir/pg_outbox', 'outbox_parse_commit_position'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION outbox.parse_commit_position(text) IS 'pg_outbox: splits a commit-order position "<ticket>-<seq>"';

-- A group's position as this server's: a group re-anchored in another
-- cluster (outbox_reanchor) adds an epoch to the transaction id or ticket
-- of its positions; this takes it off. Text that is no position is
-- returned as is, for the parser to refuse.
CREATE FUNCTION outbox.unshift_position(pos text, epoch bigint)
RETURNS text
AS '$libdir/pg_outbox', 'outbox_unshift_position'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION outbox.unshift_position(text, bigint) IS 'pg_outbox: a re-anchored group''s position as this server''s (the epoch taken off)';

--
-- Privileges: internal helpers, granted to nobody.
--
REVOKE ALL ON FUNCTION
	outbox.parse_position(text),
	outbox.parse_commit_position(text),
	outbox.unshift_position(text, bigint)
FROM PUBLIC;
-- pg_outbox install script, part 30: groups and their leadership.
-- (assembled with the other parts of sql/install/; see 00_schema_roles.sql).

--
-- Groups: one cursor over the feed each. Only the cursor functions change
-- a cursor.
--
CREATE TABLE outbox.groups (
	id integer GENERATED ALWAYS AS IDENTITY,
	name text NOT NULL,
	topics text[],
	ordering text NOT NULL DEFAULT 'xid8',
	cursor_txid xid8,
	cursor_ticket bigint,
	cursor_seq bigint NOT NULL,
	epoch bigint NOT NULL DEFAULT 0,
	-- Every operand cast to the exact type of the operator meant, and every
	-- operator qualified: the expression is bound at creation and runs as
	-- the table's owner on every write (see 00_schema_roles.sql).
	cursor text GENERATED ALWAYS AS (
		(coalesce(cursor_txid::text::numeric, cursor_ticket::numeric) OPERATOR(pg_catalog.+) epoch::numeric)::text
		OPERATOR(pg_catalog.||) '-'::text OPERATOR(pg_catalog.||) cursor_seq::text) STORED,
	created_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
	advanced_at timestamptz,
	streams jsonb NOT NULL DEFAULT '{}',
	stale boolean NOT NULL DEFAULT false,
	generation bigint NOT NULL DEFAULT 1,
	leader_pid integer,
	leader_started timestamptz,
	lease_renewed timestamptz,
	lease_until timestamptz,
	shard integer NOT NULL DEFAULT 0,
	shards integer NOT NULL DEFAULT 1,
	stream_template text,
	CONSTRAINT groups_pkey PRIMARY KEY (id),
	CONSTRAINT groups_name_key UNIQUE (name, shard),
	CONSTRAINT groups_shard_check CHECK (shards BETWEEN 1 AND 256 AND shard >= 0 AND shard < shards),
	CONSTRAINT groups_name_check CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$'),
	CONSTRAINT groups_topics_check CHECK (topics IS NULL OR pg_catalog.cardinality(topics) > 0),
	CONSTRAINT groups_ordering_check CHECK (ordering IN ('xid8', 'commit')),
	CONSTRAINT groups_stream_template_check CHECK (pg_catalog.length(stream_template) BETWEEN 1 AND 1024),
	CONSTRAINT groups_epoch_check CHECK (epoch >= 0),
	CONSTRAINT groups_cursor_check CHECK (CASE ordering WHEN 'xid8' THEN cursor_txid IS NOT NULL AND cursor_ticket IS NULL
														 ELSE cursor_ticket IS NOT NULL AND cursor_txid IS NULL END)
);
COMMENT ON TABLE outbox.groups IS 'pg_outbox groups: one cursor over the feed each';
COMMENT ON COLUMN outbox.groups.ordering IS 'xid8: feed order of transaction ids; commit: order in which the transactions committed (needs preloading)';
COMMENT ON COLUMN outbox.groups.cursor IS 'the cursor as a position: "<txid>-<seq>" (xid8 order) or "<ticket>-<seq>" (commit order), plus the epoch';
COMMENT ON COLUMN outbox.groups.epoch IS 'added to the transaction id or ticket of the group''s positions (stream entry ids); set by outbox_reanchor() so that ids keep increasing in another cluster';
COMMENT ON COLUMN outbox.groups.stale IS 'a stale group no longer keeps events from retention (outbox_group_set_stale)';
COMMENT ON COLUMN outbox.groups.generation IS 'fencing generation, bumped by every change of leader and every outbox_rewind(): a leader that sees another one stops or starts again from the cursor';
COMMENT ON COLUMN outbox.groups.leader_pid IS 'backend pid of the session that leads the group (with leader_started), or null';
COMMENT ON COLUMN outbox.groups.leader_started IS 'start time of the leading backend: with leader_pid, names the session';
COMMENT ON COLUMN outbox.groups.lease_renewed IS 'when the leader last renewed its lease (by fetching or advancing)';
COMMENT ON COLUMN outbox.groups.lease_until IS 'until when the leader holds the group without renewing; a standby may take it over after';
COMMENT ON COLUMN outbox.groups.shard IS 'which shard of the group this row is: events with outbox.shard_of(topic, key, shards) = shard (0 when the group has one)';
COMMENT ON COLUMN outbox.groups.shards IS 'how many shards the group has: a row, a cursor and a leader each';
COMMENT ON COLUMN outbox.groups.streams IS 'last position the group''s relay published to each stream, as reported to outbox_advance(): the most recently written ones (pg_outbox.max_group_streams)';
COMMENT ON COLUMN outbox.groups.stream_template IS 'the relay''s --stream template the group publishes with, recorded by its first leader (outbox_stream_template()); changed with outbox_group_set_stream_template()';
SELECT pg_catalog.pg_extension_config_dump('outbox.groups', '');

--
-- Leadership: the leading session is written in the group's row (pid and
-- backend start), with a lease that its fetches and advances renew. A
-- standby takes the group over when the leader's session ended, at once,
-- or when its lease ran out: a relay that is stopped, paused or stuck
-- keeps its connection, but not the group. See lead.c.
--
CREATE FUNCTION outbox.lock_class()
RETURNS oid
AS '$libdir/pg_outbox', 'outbox_lock_class'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION outbox.lock_class() IS 'pg_outbox: classid of pg_outbox''s advisory locks (pg_locks.classid)';

CREATE FUNCTION outbox.session_started()
RETURNS timestamptz
AS '$libdir/pg_outbox', 'outbox_session_started'
LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION outbox.session_started() IS 'pg_outbox: when this backend started; with its pid, names the session';

CREATE FUNCTION outbox.session_alive(pid integer, started timestamptz)
RETURNS boolean
AS '$libdir/pg_outbox', 'outbox_session_alive'
LANGUAGE C VOLATILE STRICT PARALLEL RESTRICTED;
COMMENT ON FUNCTION outbox.session_alive(integer, timestamptz) IS
	'pg_outbox: true while the backend with this pid that started then runs';

CREATE FUNCTION outbox.lease()
RETURNS interval
AS '$libdir/pg_outbox', 'outbox_lease'
LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION outbox.lease() IS 'pg_outbox: this session''s lease of a group''s leadership (pg_outbox.lease)';

CREATE FUNCTION outbox.max_group_streams()
RETURNS integer
AS '$libdir/pg_outbox', 'outbox_max_group_streams'
LANGUAGE C STABLE PARALLEL SAFE;
COMMENT ON FUNCTION outbox.max_group_streams() IS 'pg_outbox: how many streams a group records the last position of (pg_outbox.max_group_streams)';

CREATE FUNCTION outbox.forget_leadership(group_id integer)
RETURNS boolean
AS '$libdir/pg_outbox', 'outbox_forget_leadership'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.forget_leadership(integer) IS
	'pg_outbox: forgets that this session took the lead of a group; true when it had';

CREATE FUNCTION outbox.note_generation(group_id integer, generation bigint)
RETURNS bigint
AS '$libdir/pg_outbox', 'outbox_note_generation'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.note_generation(integer, bigint) IS
	'pg_outbox: notes a led group''s generation for this session; returns the one noted before';

-- Takes or keeps the group's leadership for this session; true when it
-- leads (group.c: the rule of a live leader, the takeover with its
-- fencing generation, the refusal OB003 of a session whose leadership
-- passed to another).
CREATE FUNCTION outbox.lead(group_id integer)
RETURNS boolean
AS '$libdir/pg_outbox', 'outbox_lead_group'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.lead(integer) IS
	'pg_outbox: takes (when free, its leader gone or its lease run out) or keeps the leadership of a group for this session; true when it leads';

-- The rule of a live leader, which a standby does not take the group
-- from: its lease has not run out and its session runs.
CREATE FUNCTION outbox.leader_live(pid integer, started timestamptz, lease_until timestamptz)
RETURNS boolean
AS '$libdir/pg_outbox', 'outbox_leader_live'
LANGUAGE C VOLATILE STRICT PARALLEL RESTRICTED;
COMMENT ON FUNCTION outbox.leader_live(integer, timestamptz, timestamptz) IS
	'pg_outbox: true while a group''s leader holds a lease that has not run out, in a session that runs';

CREATE FUNCTION outbox.is_leader(group_id integer)
RETURNS boolean
LANGUAGE sql VOLATILE STRICT PARALLEL UNSAFE
AS $$
	SELECT coalesce((SELECT leader_pid = pg_catalog.pg_backend_pid() AND leader_started = outbox.session_started()
					   FROM outbox.groups WHERE id = group_id), false)
$$;
COMMENT ON FUNCTION outbox.is_leader(integer) IS 'pg_outbox: true when this session leads the group';

CREATE FUNCTION outbox.resign(group_id integer)
RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT PARALLEL UNSAFE
AS $$
BEGIN
	PERFORM outbox.forget_leadership(group_id);
	UPDATE outbox.groups
	   SET leader_pid = NULL, leader_started = NULL, lease_renewed = NULL, lease_until = NULL
	 WHERE id = group_id AND leader_pid = pg_catalog.pg_backend_pid() AND leader_started = outbox.session_started();
	RETURN FOUND;
END
$$;
COMMENT ON FUNCTION outbox.resign(integer) IS 'pg_outbox: gives up the leadership of a group; true when this session held it';

--
-- Shards: a group created with N shards has N rows, one per shard, each
-- with its own cursor, leader and streams; an event belongs to shard
-- outbox.shard_of(topic, key, N) (shard.c defines the hash). A shard is
-- named "<group>/<shard>" wherever a group name is taken; a group of one
-- shard is also "<group>/0".
--
CREATE FUNCTION outbox.shard_of(topic text, key text, shards integer)
RETURNS integer
AS '$libdir/pg_outbox', 'outbox_shard_of'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION outbox.shard_of(text, text, integer) IS
	'pg_outbox: the shard of an event among "shards": CRC-32C of the topic, a zero byte and the key (the topic alone without a key), modulo shards';

-- Splits "<group>" or "<group>/<shard>" into the name and the shard (NULL
-- when none is named); raises 22023 for a shard that is no number. The one
-- parser of the grammar (group.c), which the SQL functions call.
CREATE FUNCTION outbox.split_group_name(group_name text, OUT name text, OUT shard integer)
AS '$libdir/pg_outbox', 'outbox_split_group_name'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION outbox.split_group_name(text) IS 'pg_outbox: "<group>" or "<group>/<shard>" as the name and the shard';

-- The group a shard name names, whether or not its shard is a number;
-- NULL for a name without a shard. For the calls that take a whole group
-- only, to name it when they refuse a shard.
CREATE FUNCTION outbox.group_of(group_name text)
RETURNS text
AS '$libdir/pg_outbox', 'outbox_group_of'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION outbox.group_of(text) IS 'pg_outbox: the group of a shard name "<group>/<shard>", or NULL';

-- Looks up a group, or one shard of a sharded group ("<group>/<shard>"),
-- by name, locking its row when asked; raises 42704 when it does not
-- exist, 22023 for a sharded group named without its shard (group.c).
CREATE FUNCTION outbox.get_group(group_name text, for_update boolean DEFAULT false)
RETURNS outbox.groups
AS '$libdir/pg_outbox', 'outbox_get_group'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.get_group(text, boolean) IS 'pg_outbox: a group, or a shard of one ("<group>/<shard>"), by name, or error 42704';

-- The index that reads the events of each shard of groups with "shards"
-- shards in order: (shard, txid, seq) over every partition of
-- outbox.event. Made by outbox_group_create() and, after a restore,
-- by maintenance; dropped with the last group that needs it.
CREATE FUNCTION outbox.shard_index_name(shards integer)
RETURNS name
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
	SELECT format('event_shards_%s_idx', shards)::name
$$;
COMMENT ON FUNCTION outbox.shard_index_name(integer) IS 'pg_outbox: name of the index that reads the shards of groups with this many';

-- Makes the shard index for "shards" when it is missing; true when it did.
CREATE FUNCTION outbox.ensure_shard_index(shards integer)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF shards <= 1 OR to_regclass(format('outbox.%I', outbox.shard_index_name(shards))) IS NOT NULL THEN
		RETURN false;
	END IF;
	EXECUTE format('CREATE INDEX %I ON outbox.event (outbox.shard_of(topic, key, %s), txid, seq)',
				   outbox.shard_index_name(shards), shards);
	RETURN true;
END
$$;
COMMENT ON FUNCTION outbox.ensure_shard_index(integer) IS 'pg_outbox: makes the index of the shards of groups with this many, when missing';

--
-- Group management (admin).
--
CREATE FUNCTION @extschema@.outbox_group_create(group_name text, topics text[] DEFAULT NULL,
												start_at text DEFAULT 'now', ordering text DEFAULT NULL,
												shards integer DEFAULT 1)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	c_txid xid8;
	c_ticket bigint;
	ord text := coalesce(ordering, CASE WHEN outbox.commit_order_available() THEN 'commit' ELSE 'xid8' END);
BEGIN
	IF group_name IS NULL THEN
		RAISE EXCEPTION 'group name must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF ord NOT IN ('xid8', 'commit') THEN
		RAISE EXCEPTION 'invalid ordering "%"', ord
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Use ''commit'' (the order in which transactions committed) or ''xid8'' (the order of transaction ids).';
	END IF;
	IF ord = 'commit' THEN
		-- Prepared transactions that emitted have no ticket: wait for them.
		PERFORM outbox.commit_order_lock();
	END IF;
	IF group_name !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$' THEN
		RAISE EXCEPTION 'invalid group name "%"', group_name
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'A group name has 1 to 63 characters: letters, digits, "_", ".", ":" and "-", starting with a letter or digit.';
	END IF;
	IF shards IS NULL OR shards < 1 OR shards > 256 THEN
		RAISE EXCEPTION 'a group has 1 to 256 shards, not %', coalesce(shards::text, 'NULL')
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF topics IS NOT NULL AND (cardinality(topics) = 0 OR array_position(topics, NULL) IS NOT NULL
							   OR array_position(topics, '') IS NOT NULL) THEN
		RAISE EXCEPTION 'topics of group "%" must be NULL (all topics) or a non-empty array of non-empty topics', group_name
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF start_at IS NULL THEN
		RAISE EXCEPTION 'start_at must not be null' USING ERRCODE = 'null_value_not_allowed';
	ELSIF start_at = 'now' THEN
		-- Everything below the horizon is final now; events of transactions at
		-- or above it, running or future, belong to the group.
		IF ord = 'commit' THEN
			c_ticket := outbox.commit_horizon() + 1;
		ELSE
			c_txid := outbox.horizon();
		END IF;
	ELSIF start_at = 'beginning' THEN
		IF ord = 'commit' THEN
			c_ticket := 0;
		ELSE
			c_txid := '0'::xid8;
		END IF;
	ELSE
		RAISE EXCEPTION 'invalid start_at "%"', start_at
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Use ''now'' (events committed from now on) or ''beginning'' (every retained event).';
	END IF;
	IF EXISTS (SELECT 1 FROM outbox.groups g WHERE g.name = group_name) THEN
		RAISE EXCEPTION 'group "%" already exists', group_name USING ERRCODE = 'duplicate_object';
	END IF;
	PERFORM outbox.ensure_shard_index(shards);
	BEGIN
		INSERT INTO outbox.groups (name, topics, ordering, cursor_txid, cursor_ticket, cursor_seq, shard, shards)
		SELECT group_name, topics, ord, c_txid, c_ticket, 0, s, shards FROM generate_series(0, shards - 1) s;
	EXCEPTION WHEN unique_violation THEN
		RAISE EXCEPTION 'group "%" already exists', group_name USING ERRCODE = 'duplicate_object';
	END;
END
$$;
COMMENT ON FUNCTION @extschema@.outbox_group_create(text, text[], text, text, integer) IS
	'pg_outbox: creates a group (a cursor over the feed, or one per shard), for all topics or some, starting now or at the beginning, in commit or xid8 order';

CREATE FUNCTION @extschema@.outbox_group_drop(group_name text, if_exists boolean DEFAULT false)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	n integer;
BEGIN
	IF group_name IS NULL THEN
		RAISE EXCEPTION 'group name must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF outbox.group_of(group_name) IS NOT NULL THEN
		RAISE EXCEPTION 'a shard cannot be dropped alone: drop group "%"', outbox.group_of(group_name)
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	SELECT max(g.shards) INTO n FROM outbox.groups g WHERE g.name = group_name;
	DELETE FROM outbox.groups g WHERE g.name = group_name;
	IF NOT FOUND THEN
		IF coalesce(if_exists, false) THEN
			RETURN false;
		END IF;
		RAISE EXCEPTION 'group "%" does not exist', group_name USING ERRCODE = 'undefined_object';
	END IF;
	-- The last group with this many shards takes their index with it.
	IF n > 1 AND NOT EXISTS (SELECT 1 FROM outbox.groups g WHERE g.shards = n) THEN
		EXECUTE format('DROP INDEX IF EXISTS outbox.%I', outbox.shard_index_name(n));
	END IF;
	RETURN true;
END
$$;
COMMENT ON FUNCTION @extschema@.outbox_group_drop(text, boolean) IS 'pg_outbox: drops a group and its cursor (every shard''s)';

-- Whether the row of group "name", shard "shard", is one that "for_group"
-- names in the listing functions: every row when NULL, a group's every
-- shard by its name, one shard as "<group>/<shard>".
CREATE FUNCTION outbox.group_named(name text, shard integer, for_group text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT for_group IS NULL OR name = for_group OR name || '/' || shard::text = for_group $$;
COMMENT ON FUNCTION outbox.group_named(text, integer, text) IS
	'pg_outbox: whether a listing function''s for_group names the row of a group''s shard';

-- The groups as a relay or a tool reads them: a row per group, or per
-- shard of a sharded group, without the backlog count that makes
-- outbox_group_stats() a scan. for_group names a group (all its shards)
-- or one shard ("<group>/<shard>"); a name that matches nothing gives no
-- rows.
CREATE FUNCTION @extschema@.outbox_groups(for_group text DEFAULT NULL)
RETURNS TABLE (group_name text, shard integer, shards integer, ordering text, topics text[],
			   cursor_position text, streams jsonb, stale boolean, generation bigint,
			   stream_template text)
LANGUAGE sql STABLE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
	SELECT g.name, g.shard, g.shards, g.ordering, g.topics, g.cursor, g.streams, g.stale, g.generation,
		   g.stream_template
	  FROM outbox.groups g
	 WHERE outbox.group_named(g.name, g.shard, for_group)
	 ORDER BY g.name, g.shard
$$;
COMMENT ON FUNCTION @extschema@.outbox_groups(text) IS
	'pg_outbox: the groups (or one, or one shard): shards, order, topics, cursor, the last position per stream, stale, generation, stream template';

--
-- Stream templates: the streams a group's entries are in. Two relays of
-- one group with two --stream templates would split the group between two
-- sets of streams, each set missing what the other relay published. The
-- first leader records its template for every shard of the group before
-- it publishes; a relay with another template is refused (it exits, naming
-- both). Changing the template is an admin's step, with every relay of the
-- group stopped.
--

-- Raises 22004 for a null template, 22023 for an empty or too long one.
CREATE FUNCTION outbox.check_stream_template(stream_template text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF stream_template IS NULL THEN
		RAISE EXCEPTION 'stream template must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF length(stream_template) NOT BETWEEN 1 AND 1024 THEN
		RAISE EXCEPTION 'invalid stream template'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = format('A stream template has 1 to 1024 characters; this one has %s.', length(stream_template));
	END IF;
END
$$;
COMMENT ON FUNCTION outbox.check_stream_template(text) IS 'pg_outbox: raises an error for a stream template no group may record';

-- Records the leader's template when the group has none, and returns the
-- group's (the caller's, or the one recorded before). The relay calls it
-- when it takes the lead, before it publishes, and refuses to go on when
-- the template returned is not its own. Every shard's row of a sharded
-- group records the same template, in one update that takes the rows in
-- index order (two shards' leaders recording at once wait for each other
-- instead of deadlocking; the second one finds the first one's template).
CREATE FUNCTION @extschema@.outbox_stream_template(group_name text, stream_template text)
RETURNS text
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	g outbox.groups;
	recorded text;
BEGIN
	PERFORM outbox.check_stream_template(stream_template);
	g := outbox.get_group(group_name);
	IF NOT outbox.is_leader(g.id) THEN
		RAISE EXCEPTION 'this session does not lead group "%"', group_name
			USING ERRCODE = 'OB003',
				  HINT = 'The leader records the group''s stream template: take the lead with outbox_lead() first.';
	END IF;
	UPDATE outbox.groups x
	   SET stream_template = outbox_stream_template.stream_template
	 WHERE x.name OPERATOR(pg_catalog.=) g.name AND x.stream_template IS NULL;
	IF FOUND THEN
		RAISE LOG 'pg_outbox: group "%" publishes with stream template "%"', g.name, stream_template;
	END IF;
	SELECT x.stream_template INTO recorded FROM outbox.groups x WHERE x.id OPERATOR(pg_catalog.=) g.id;
	RETURN recorded;
END
$$;
COMMENT ON FUNCTION @extschema@.outbox_stream_template(text, text) IS
	'pg_outbox: records the leader''s --stream template when the group has none; returns the group''s template';

-- Changes (or, with NULL, forgets) the template of every shard of a
-- group, while no relay leads it: the next leader publishes with the new
-- one (or records its own). The last positions recorded per stream are
-- forgotten with the old template: they are the old streams', which the
-- group no longer writes (and whose loss no relay should repair). Returns
-- the template recorded before.
CREATE FUNCTION @extschema@.outbox_group_set_stream_template(group_name text, stream_template text)
RETURNS text
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	previous text;
	live record;
BEGIN
	IF group_name IS NULL THEN
		RAISE EXCEPTION 'group name must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF outbox.group_of(group_name) IS NOT NULL THEN
		RAISE EXCEPTION 'the stream template of a shard cannot be changed alone: name group "%"',
			outbox.group_of(group_name)
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'Every shard of a group publishes with the group''s template.';
	END IF;
	IF stream_template IS NOT NULL THEN
		PERFORM outbox.check_stream_template(stream_template);
	END IF;
	-- Every shard's row, in index order, as outbox_stream_template() takes
	-- them: no leader records or takes the group over meanwhile.
	PERFORM 1 FROM outbox.groups x WHERE x.name OPERATOR(pg_catalog.=) group_name
	 ORDER BY x.shard FOR NO KEY UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'group "%" does not exist', group_name
			USING ERRCODE = 'undefined_object',
				  HINT = 'Create it with outbox_group_create().';
	END IF;
	SELECT x.shard, x.shards, x.leader_pid INTO live
	  FROM outbox.groups x
	 WHERE x.name OPERATOR(pg_catalog.=) group_name
	   AND outbox.leader_live(x.leader_pid, x.leader_started, x.lease_until)
	 ORDER BY x.shard
	 LIMIT 1;
	IF FOUND THEN
		RAISE EXCEPTION 'group "%" is being published: its stream template cannot change now', group_name
			USING ERRCODE = 'object_in_use',
				  DETAIL = format('Backend pid %s leads %s.', live.leader_pid,
								  CASE WHEN live.shards > 1 THEN format('shard %s/%s', group_name, live.shard)
									   ELSE 'it' END),
				  HINT = 'Stop every relay of the group, change the template, then start the relays with the new --stream.';
	END IF;
	SELECT x.stream_template INTO previous FROM outbox.groups x
	 WHERE x.name OPERATOR(pg_catalog.=) group_name AND x.shard OPERATOR(pg_catalog.=) 0;
	UPDATE outbox.groups x
	   SET stream_template = outbox_group_set_stream_template.stream_template, streams = '{}'
	 WHERE x.name OPERATOR(pg_catalog.=) group_name;
	RAISE LOG 'pg_outbox: stream template of group "%" changed from % to %', group_name,
		coalesce(quote_literal(previous), 'none'), coalesce(quote_literal(stream_template), 'none');
	RETURN previous;
END
$$;
COMMENT ON FUNCTION @extschema@.outbox_group_set_stream_template(text, text) IS
	'pg_outbox: changes (or forgets, with NULL) the --stream template of a group no relay leads; returns the previous one';

--
-- Privileges: relays read the groups through outbox_groups(); admins
-- manage them, and read the table.
--
REVOKE ALL ON TABLE outbox.groups FROM PUBLIC;
REVOKE ALL ON FUNCTION
	outbox.lock_class(),
	outbox.session_started(),
	outbox.session_alive(integer, timestamptz),
	outbox.lease(),
	outbox.max_group_streams(),
	outbox.forget_leadership(integer),
	outbox.note_generation(integer, bigint),
	outbox.lead(integer),
	outbox.leader_live(integer, timestamptz, timestamptz),
	outbox.is_leader(integer),
	outbox.resign(integer),
	outbox.split_group_name(text),
	outbox.group_of(text),
	outbox.group_named(text, integer, text),
	outbox.get_group(text, boolean),
	outbox.shard_index_name(integer),
	outbox.ensure_shard_index(integer),
	@extschema@.outbox_group_create(text, text[], text, text, integer),
	@extschema@.outbox_group_drop(text, boolean),
	@extschema@.outbox_groups(text),
	outbox.check_stream_template(text),
	@extschema@.outbox_stream_template(text, text),
	@extschema@.outbox_group_set_stream_template(text, text)
FROM PUBLIC;

-- Writers evaluate it in the shard indexes' expressions.
GRANT EXECUTE ON FUNCTION outbox.shard_of(text, text, integer) TO PUBLIC;

GRANT SELECT ON outbox.groups TO outbox_admin;
GRANT EXECUTE ON FUNCTION @extschema@.outbox_groups(text) TO outbox_relay, outbox_admin;
GRANT EXECUTE ON FUNCTION @extschema@.outbox_stream_template(text, text) TO outbox_relay, outbox_admin;
GRANT EXECUTE ON FUNCTION
	@extschema@.outbox_group_create(text, text[], text, text, integer),
	@extschema@.outbox_group_drop(text, boolean),
	@extschema@.outbox_group_set_stream_template(text, text)
TO outbox_admin;
-- pg_outbox install script, part 35: the relay's calls (fetch, advance, rewind...).
-- (assembled with the other parts of sql/install/; see 00_schema_roles.sql).

--
-- The relay's calls.
--

-- A group's backlog in the xid8 feed: the events after a cursor and below
-- the horizon, of some topics or all (topics NULL). The one definition of
-- what a group has still to publish; a plain SQL function, so that the
-- planner inlines it into each query. "txid >= cursor_txid" lets it prune
-- partitions behind the cursor; the row comparison keeps the scan an index
-- range scan on (txid, seq). "below", when given, is a horizon read before
-- the query's snapshot (any earlier horizon is a valid one): as a constant
-- it also prunes the partitions beyond it while the query is planned.
-- "shard" of "shards" narrows it to one shard of a sharded group.
CREATE FUNCTION outbox.backlog(cursor_txid xid8, cursor_seq bigint, topics text[], below xid8 DEFAULT NULL,
							   shard integer DEFAULT 0, shards integer DEFAULT 1)
RETURNS SETOF outbox.event
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
	SELECT e.*
	  FROM outbox.event e
	 WHERE e.txid >= cursor_txid AND (e.txid, e.seq) > (cursor_txid, cursor_seq)
	   AND e.txid < coalesce(below, outbox.horizon())
	   AND (topics IS NULL OR e.topic = ANY (topics))
	   AND (shards = 1 OR outbox.shard_of(e.topic, e.key, shards) = shard)
$$;
COMMENT ON FUNCTION outbox.backlog(xid8, bigint, text[], xid8, integer, integer) IS
	'pg_outbox: the events after a cursor and below the horizon (or an earlier one), of some topics or all, of one shard or all';

-- A group's backlog in commit order: the events of the transactions whose
-- commit tickets are after a cursor and at most a horizon (read with
-- outbox.commit_horizon() before the snapshot this runs in), of some topics
-- or all, in commit order. The one definition of what a commit-ordered
-- group has still to publish; inlined into each query. "below", when
-- given, is a transaction id above every transaction whose ticket is at or
-- below the horizon (the next one, read after the horizon): as a constant
-- it prunes the partitions beyond it, of markers and of events, while the
-- query is planned.
--
-- Rows come out in (ticket, seq) order by construction, without a sort that
-- would read a whole transaction per batch: markers are scanned in ticket
-- order, and for each one the lateral subquery reads its transaction's
-- events in seq order (a lateral reference allows only a nested loop, and
-- OFFSET 0 keeps both subqueries and their orders intact). The explain
-- test checks the plan.
CREATE FUNCTION outbox.commit_backlog(cursor_ticket bigint, cursor_seq bigint, topics text[], horizon bigint,
									  below xid8 DEFAULT NULL, shard integer DEFAULT 0, shards integer DEFAULT 1)
RETURNS TABLE (ticket bigint, txid xid8, seq bigint, event_id uuid, topic text, key text,
			   payload jsonb, headers jsonb, created_at timestamptz)
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
	SELECT m.ticket, e.txid, e.seq, e.event_id, e.topic, e.key, e.payload, e.headers, e.created_at
	  FROM (SELECT c.ticket, c.txid
			  FROM outbox.commit_log c
			 WHERE c.ticket >= cursor_ticket AND c.ticket <= horizon
			   AND (below IS NULL OR c.txid < below)
			 ORDER BY c.ticket
			OFFSET 0) m
	 CROSS JOIN LATERAL (
		SELECT v.*
		  FROM outbox.event v
		 WHERE v.txid = m.txid AND (below IS NULL OR v.txid < below)
		   AND v.seq > CASE WHEN m.ticket = cursor_ticket THEN cursor_seq ELSE 0 END
		   AND (topics IS NULL OR v.topic = ANY (topics))
		   AND (shards = 1 OR outbox.shard_of(v.topic, v.key, shards) = shard)
		 ORDER BY v.seq
		OFFSET 0) e
$$;
COMMENT ON FUNCTION outbox.commit_backlog(bigint, bigint, text[], bigint, xid8, integer, integer) IS
	'pg_outbox: the events after a commit-order cursor and up to a commit horizon, of some topics or all, of one shard or all, in commit order';

-- The next batch after the group's cursor. Takes the group's leadership for
-- this session when it is free (outbox.lead()); returns nothing while
-- another session leads. fetch.c decides where the batch lies from the
-- group's row (leadership, generation, horizons, "after") and feed.c reads
-- it by index, without planning a query: the head of outbox.backlog() (xid8
-- order) or outbox.commit_backlog() (commit order), in feed order. A batch costs
-- O(batch) at any backlog (I-10), and a relay that keeps up with a trickle
-- of commits, fetching many small batches a second, does not pay for a
-- plan each time. With "wait", an empty batch waits for a commit that
-- emitted (pg_outbox preloaded, READ COMMITTED), up to that long.
CREATE FUNCTION @extschema@.outbox_fetch(group_name text, batch_size integer DEFAULT 1000, after text DEFAULT NULL,
										 wait interval DEFAULT NULL)
RETURNS TABLE (pos text, txid xid8, seq bigint, event_id uuid, topic text, key text,
			   payload jsonb, headers jsonb, created_at timestamptz)
AS '$libdir/pg_outbox', 'outbox_fetch'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER ROWS 1000
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION @extschema@.outbox_fetch(text, integer, text, interval) IS
	'pg_outbox: the next batch of the group''s feed after its cursor (or after a later position); empty while another session leads the group';

-- The same batch packed in one bytea for the relay: the fields it writes to
-- its streams, as text, each with its length (the format is described in
-- extension/pack.c and the README). Sending one value costs the server a
-- fraction of sending the rows.
CREATE FUNCTION @extschema@.outbox_fetch_packed(group_name text, batch_size integer DEFAULT 1000,
												after text DEFAULT NULL, wait interval DEFAULT NULL)
RETURNS bytea
AS '$libdir/pg_outbox', 'outbox_fetch_packed'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION @extschema@.outbox_fetch_packed(text, integer, text, interval) IS
	'pg_outbox: outbox_fetch()''s batch packed in one value, for the relay';

-- A group's last positions per stream (outbox.groups.streams), bounded:
-- every stream above "keep_after" (the cursor: a rewind leaves positions
-- above it, which outbox_reanchor() must see), then the most recently
-- written others, the highest positions, up to "max_streams" in all;
-- without the ones at or below "gone_through" (retention removed the
-- events there: a relay that found such a stream behind would have
-- nothing of it to publish again) and the ones that are no position.
-- Positions ("<major>-<seq>", with the epoch) compare as numbers.
CREATE FUNCTION outbox.pruned_streams(streams jsonb, max_streams integer, keep_after text, gone_through text)
RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
	WITH s AS (
		SELECT s.key, s.value,
			   split_part(s.value, '-', 1)::numeric AS major, split_part(s.value, '-', 2)::numeric AS seq
		  FROM jsonb_each_text(streams) s
		 WHERE s.value ~ '^[0-9]{1,20}-[0-9]{1,19}$'
	), ranked AS (
		SELECT s.key, s.value,
			   (s.major, s.seq) > (split_part(keep_after, '-', 1)::numeric, split_part(keep_after, '-', 2)::numeric)
				   AS above,
			   (s.major, s.seq) <= (split_part(gone_through, '-', 1)::numeric, split_part(gone_through, '-', 2)::numeric)
				   AS gone,
			   row_number() OVER (ORDER BY s.major DESC, s.seq DESC, s.key) AS n
		  FROM s
	)
	SELECT coalesce(jsonb_object_agg(r.key, r.value), '{}'::jsonb)
	  FROM ranked r
	 WHERE r.above IS TRUE OR (r.n <= max_streams AND r.gone IS NOT TRUE)
$$;
COMMENT ON FUNCTION outbox.pruned_streams(jsonb, integer, text, text) IS
	'pg_outbox: the last positions per stream above a cursor, then the highest up to a number, without those at or below a removed position';

-- What outbox_advance() records of the streams its relay published to:
-- the group's record with the new positions merged in. When a stream not
-- recorded before comes, the record grew: what is gone and the least
-- recently written streams beyond pg_outbox.max_group_streams are
-- forgotten (outbox.pruned_streams(); positions carry the epoch, and
-- "new_cursor" is the group's new cursor with it).
CREATE FUNCTION outbox.recorded_streams(g outbox.groups, streams jsonb, new_cursor text)
RETURNS jsonb
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	m outbox.maintenance;
BEGIN
	IF streams IS NULL THEN
		RETURN g.streams;
	END IF;
	IF g.streams ?& ARRAY(SELECT jsonb_object_keys(streams)) THEN
		RETURN g.streams || streams;
	END IF;
	SELECT * INTO m FROM outbox.maintenance;
	RETURN outbox.pruned_streams(g.streams || streams, outbox.max_group_streams(), new_cursor,
								 CASE WHEN g.ordering = 'commit'
									  THEN (m.retired_ticket + g.epoch) || '-' || 9223372036854775807
									  ELSE (m.retired_txid::text::numeric + g.epoch) || '-' || m.retired_seq END);
END
$$;
COMMENT ON FUNCTION outbox.recorded_streams(outbox.groups, jsonb, text) IS
	'pg_outbox: a group''s last positions per stream with new ones merged in, bounded when a new stream comes';

-- Moves the cursor forward to the last published position. Only the leader
-- may; a position behind the cursor is refused (see outbox_rewind). The
-- last position per stream is recorded with it, bounded
-- (outbox.recorded_streams()), so that a group writing to ever new
-- streams does not rewrite an ever larger row. In C beside fetch
-- (advance.c): both pass the same leader and generation checks.
CREATE FUNCTION @extschema@.outbox_advance(group_name text, pos text, streams jsonb DEFAULT NULL)
RETURNS void
AS '$libdir/pg_outbox', 'outbox_advance'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION @extschema@.outbox_advance(text, text, jsonb) IS
	'pg_outbox: moves the group''s cursor forward to the last published position (leader only), recording the last position per stream';

-- A relay is about to wait for a notification: the next commit that
-- emitted sends one. True when notifications are sent on demand like this
-- (pg_outbox is preloaded), false when every such commit notifies anyway.
CREATE FUNCTION @extschema@.outbox_relay_waiting()
RETURNS boolean
AS '$libdir/pg_outbox', 'outbox_relay_waiting'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION @extschema@.outbox_relay_waiting() IS
	'pg_outbox: a relay waits for a notification; the next committing transaction that emitted sends one';

-- Takes the group's leadership for this session if it is free.
CREATE FUNCTION @extschema@.outbox_lead(group_name text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	RETURN outbox.lead((outbox.get_group(group_name)).id);
END
$$;
COMMENT ON FUNCTION @extschema@.outbox_lead(text) IS
	'pg_outbox: takes the group''s leadership for this session if free; true when this session leads';

-- Gives the group's leadership up, so that a standby takes over at once.
CREATE FUNCTION @extschema@.outbox_resign(group_name text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	RETURN outbox.resign((outbox.get_group(group_name)).id);
END
$$;
COMMENT ON FUNCTION @extschema@.outbox_resign(text) IS
	'pg_outbox: gives up the group''s leadership; true when this session led it';

-- Moves a cursor anywhere: to a position (replay, or recovery after the
-- broker lost entries), to 'now' or to 'beginning'. A position ahead of
-- the horizon is refused: transactions still running (or commits still in
-- progress) would be skipped when they commit. Each rewind bumps the
-- group's generation, so that a leader reading ahead of the old cursor
-- starts again from the new one (SQLSTATE OB002). A position whose
-- events retention already removed is accepted with a warning naming the
-- oldest event still kept.
CREATE FUNCTION @extschema@.outbox_rewind(group_name text, pos text)
RETURNS text
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	g outbox.groups;
	m outbox.maintenance;
	new_txid xid8;
	new_ticket bigint;
	new_seq bigint := 0;
	new_position text;
	limit_txid xid8;
	limit_ticket bigint;
	oldest text;
BEGIN
	IF pos IS NULL THEN
		RAISE EXCEPTION 'position must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	g := outbox.get_group(group_name, true);
	IF g.ordering = 'commit' THEN
		IF pos = 'now' THEN
			new_ticket := outbox.commit_horizon() + 1;
		ELSIF pos = 'beginning' THEN
			new_ticket := 0;
		ELSE
			SELECT p.ticket, p.seq INTO new_ticket, new_seq
			  FROM outbox.parse_commit_position(outbox.unshift_position(pos, g.epoch)) p;
			limit_ticket := outbox.commit_horizon();
			IF (new_ticket, new_seq) > (limit_ticket + 1, 0::bigint) THEN
				RAISE EXCEPTION 'position % is ahead of the commit horizon of this server', pos
					USING ERRCODE = 'object_not_in_prerequisite_state',
						  DETAIL = format('Commit tickets after %s are not final or not issued yet: a cursor beyond them would skip their events for good.',
										  limit_ticket),
						  HINT = format('Rewind to a position up to "%s-0", or to ''now''.', limit_ticket + 1);
			END IF;
		END IF;
	ELSIF pos = 'now' THEN
		new_txid := outbox.horizon();
	ELSIF pos = 'beginning' THEN
		new_txid := '0'::xid8;
	ELSE
		SELECT p.txid, p.seq INTO new_txid, new_seq FROM outbox.parse_position(outbox.unshift_position(pos, g.epoch)) p;
		limit_txid := outbox.horizon();
		IF (new_txid, new_seq) > (limit_txid, 0::bigint) THEN
			RAISE EXCEPTION 'position % is ahead of the feed horizon of this server', pos
				USING ERRCODE = 'object_not_in_prerequisite_state',
					  DETAIL = format('Transactions from %s on may still be running or are not started yet: a cursor beyond them would skip their events for good.',
									  limit_txid),
					  HINT = format('Rewind to a position up to "%s-0", or to ''now''.', limit_txid);
		END IF;
	END IF;
	UPDATE outbox.groups
	   SET cursor_txid = new_txid, cursor_ticket = new_ticket, cursor_seq = new_seq, advanced_at = now(),
		   generation = generation + 1
	 WHERE id = g.id
	RETURNING cursor INTO new_position;
	-- This session's own rewind (a relay recovering lost stream entries)
	-- does not refuse its next fetch.
	IF outbox.is_leader(g.id) THEN
		PERFORM outbox.note_generation(g.id, g.generation + 1);
	END IF;
	SELECT * INTO m FROM outbox.maintenance;
	IF (g.ordering = 'xid8' AND (new_txid, new_seq) < (m.retired_txid, m.retired_seq))
	   OR (g.ordering = 'commit' AND m.retired_ticket > 0
		   AND (new_ticket < m.retired_ticket OR (new_ticket = m.retired_ticket AND new_seq = 0))) THEN
		IF g.ordering = 'xid8' THEN
			SELECT e.txid || '-' || e.seq INTO oldest FROM outbox.event e ORDER BY e.txid, e.seq LIMIT 1;
		ELSE
			SELECT c.ticket || '-' || min(e.seq) INTO oldest
			  FROM (SELECT l.txid, l.ticket FROM outbox.commit_log l ORDER BY l.ticket LIMIT 1) c
			  JOIN outbox.event e ON e.txid = c.txid
			 GROUP BY c.ticket;
		END IF;
		RAISE WARNING 'events before position % of group "%" were removed by retention', new_position, group_name
			USING DETAIL = CASE WHEN oldest IS NULL THEN 'No event is retained.'
								ELSE format('The oldest event still retained is at %s.', oldest) END,
				  HINT = 'The group resumes with the oldest event still retained; the ones before it cannot be published again.';
	END IF;
	RAISE LOG 'pg_outbox: cursor of group "%" moved from % to %', group_name, g.cursor, new_position;
	RETURN new_position;
END
$$;
COMMENT ON FUNCTION @extschema@.outbox_rewind(text, text) IS
	'pg_outbox: moves the group''s cursor to a position, ''now'' or ''beginning''; returns the new position';

-- Re-anchors a group on this server after a restore into another cluster
-- or a failover to one with an older history: the cursor goes to this
-- server's horizon ('now'), and the group's epoch rises so that its next
-- positions, the ids of the stream entries it writes, are above every
-- position it published before (its cursor and the last position per
-- stream): the relay goes on appending to the same streams. Events that
-- were waiting on the old server are not here to publish. Returns the new
-- cursor.
CREATE FUNCTION @extschema@.outbox_reanchor(group_name text)
RETURNS text
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	g outbox.groups;
	local_major numeric;
	published record;
	new_epoch numeric;
	new_position text;
BEGIN
	g := outbox.get_group(group_name, true);
	-- The highest position (with the epoch) published: the cursor, or
	-- the last one recorded for a stream.
	SELECT x.major, x.seq INTO published
	  FROM (SELECT split_part(g.cursor, '-', 1)::numeric AS major, split_part(g.cursor, '-', 2)::numeric AS seq
			UNION ALL
			SELECT split_part(s.value, '-', 1)::numeric, split_part(s.value, '-', 2)::numeric
			  FROM jsonb_each_text(g.streams) s
			 WHERE s.value ~ '^[0-9]{1,20}-[0-9]{1,19}$') x
	 ORDER BY x.major DESC, x.seq DESC
	 LIMIT 1;
	IF g.ordering = 'commit' THEN
		local_major := outbox.commit_horizon() + 1;
	ELSE
		local_major := outbox.horizon()::text::numeric;
	END IF;
	-- The events after the new cursor "<local_major + epoch>-0" are at
	-- "<local_major + epoch>-1" and beyond: above "<major>-0" from the same
	-- major on, above "<major>-<seq>" from the next one.
	new_epoch := greatest(g.epoch, published.major - local_major + CASE WHEN published.seq = 0 THEN 0 ELSE 1 END);
	IF new_epoch + local_major > 18446744073709551615 OR new_epoch > 9223372036854775807 THEN
		RAISE EXCEPTION 'cannot re-anchor group "%": its positions would leave the range of stream ids', group_name
			USING ERRCODE = 'program_limit_exceeded',
				  HINT = 'Publish to new streams with a new group instead.';
	END IF;
	UPDATE outbox.groups
	   SET cursor_txid = CASE WHEN g.ordering = 'xid8' THEN local_major::text::xid8 END,
		   cursor_ticket = CASE WHEN g.ordering = 'commit' THEN local_major::bigint END,
		   cursor_seq = 0, epoch = new_epoch, advanced_at = now(), generation = generation + 1
	 WHERE id = g.id
	RETURNING cursor INTO new_position;
	IF outbox.is_leader(g.id) THEN
		PERFORM outbox.note_generation(g.id, g.generation + 1);
	END IF;
	RAISE LOG 'pg_outbox: group "%" re-anchored: cursor % (was %), epoch % (was %)',
		group_name, new_position, g.cursor, new_epoch, g.epoch;
	RETURN new_position;
END
$$;
COMMENT ON FUNCTION @extschema@.outbox_reanchor(text) IS
	'pg_outbox: re-anchors a group on this server (after a restore or failover): cursor at the horizon, stream ids above all it published';

--
-- Privileges: relays (and admins) call these.
--
REVOKE ALL ON FUNCTION
	outbox.backlog(xid8, bigint, text[], xid8, integer, integer),
	outbox.pruned_streams(jsonb, integer, text, text),
	outbox.recorded_streams(outbox.groups, jsonb, text),
	outbox.commit_backlog(bigint, bigint, text[], bigint, xid8, integer, integer),
	@extschema@.outbox_fetch(text, integer, text, interval),
	@extschema@.outbox_fetch_packed(text, integer, text, interval),
	@extschema@.outbox_advance(text, text, jsonb),
	@extschema@.outbox_relay_waiting(),
	@extschema@.outbox_lead(text),
	@extschema@.outbox_resign(text),
	@extschema@.outbox_rewind(text, text),
	@extschema@.outbox_reanchor(text)
FROM PUBLIC;

GRANT EXECUTE ON FUNCTION
	@extschema@.outbox_fetch(text, integer, text, interval),
	@extschema@.outbox_fetch_packed(text, integer, text, interval),
	@extschema@.outbox_advance(text, text, jsonb),
	@extschema@.outbox_relay_waiting(),
	@extschema@.outbox_lead(text),
	@extschema@.outbox_resign(text),
	@extschema@.outbox_rewind(text, text),
	@extschema@.outbox_reanchor(text)
TO outbox_relay, outbox_admin;
-- pg_outbox install script, part 37: passing an event that cannot be published.
-- (assembled with the other parts of sql/install/; see 00_schema_roles.sql).

--
-- An event whose payload and headers print as more JSON text than any
-- event may (the largest pg_outbox.max_payload_size) cannot be published:
-- a fetch that meets it first in a batch refuses it (SQLSTATE OB004), and
-- the group waits there. outbox_emit() refuses such events; one written
-- before it checked the printed size, or into the table directly, is
-- passed by an admin with outbox_skip(), which moves the cursor past that
-- one event and keeps a copy of it, with the reason, in
-- outbox.skipped_events: like a rewind, the move is logged and bumps the
-- group's generation, and unlike one it loses nothing for good.
--

-- The size of a jsonb value as JSON text, as the relay publishes it and
-- jsonb's output function prints it, computed without printing it.
CREATE FUNCTION outbox.json_text_size(value jsonb)
RETURNS bigint
AS '$libdir/pg_outbox', 'outbox_json_text_size'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION outbox.json_text_size(jsonb) IS
	'pg_outbox: the size of a jsonb value as JSON text (as the relay publishes it), computed without printing it';

CREATE TABLE outbox.skipped_events (
	id bigint GENERATED ALWAYS AS IDENTITY,
	group_name text NOT NULL,
	shard integer NOT NULL,
	pos text NOT NULL,
	txid xid8 NOT NULL,
	seq bigint NOT NULL,
	event_id uuid NOT NULL,
	topic text NOT NULL,
	key text,
	payload jsonb NOT NULL,
	headers jsonb,
	text_size bigint NOT NULL,
	reason text NOT NULL,
	skipped_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
	skipped_by name NOT NULL DEFAULT SESSION_USER,
	CONSTRAINT skipped_events_pkey PRIMARY KEY (id)
);
COMMENT ON TABLE outbox.skipped_events IS
	'pg_outbox: events a group passed without publishing them (outbox_skip), each with a copy of the event and the reason';
COMMENT ON COLUMN outbox.skipped_events.pos IS 'the event''s position in the group, as the fetch reported it';
COMMENT ON COLUMN outbox.skipped_events.text_size IS 'payload and headers as JSON text, in bytes (outbox.json_text_size)';
SELECT pg_catalog.pg_extension_config_dump('outbox.skipped_events', '');

-- Moves the group's cursor past its next event, which must be at "pos",
-- the position a fetch reported (OB004): one event, never more. The
-- event is copied into outbox.skipped_events with the reason; the move is
-- logged and bumps the generation, like outbox_rewind(), so that a relay
-- leading the group starts again after it. Returns the new cursor.
CREATE FUNCTION @extschema@.outbox_skip(group_name text, pos text, reason text)
RETURNS text
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	g outbox.groups;
	e record;
	p record;
	has_next boolean;
	horizon bigint;
	next_pos text;
	new_position text;
BEGIN
	IF pos IS NULL THEN
		RAISE EXCEPTION 'position must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF reason IS NULL OR pg_catalog.btrim(reason) OPERATOR(pg_catalog.=) '' THEN
		RAISE EXCEPTION 'a reason must be given to skip an event'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Say why the event is not published: outbox.skipped_events keeps the reason with a copy of the event.';
	END IF;
	g := outbox.get_group(group_name, true);
	-- The group's next event, as its next fetch would read it.
	IF g.ordering OPERATOR(pg_catalog.=) 'commit' THEN
		-- As a fetch: the commit horizon first, then the snapshot that reads
		-- the events up to it (a new one per statement at READ COMMITTED).
		IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed' THEN
			RAISE EXCEPTION 'a commit-ordered group is read at READ COMMITTED only'
				USING ERRCODE = 'invalid_transaction_state',
					  DETAIL = 'This transaction''s snapshot may predate the commit horizon: the group''s next event could be hidden from it.';
		END IF;
		SELECT c.ticket, c.seq INTO p FROM outbox.parse_commit_position(outbox.unshift_position(pos, g.epoch)) c;
		horizon := outbox.commit_horizon();
		SELECT b.ticket::numeric AS major, b.seq, b.txid, b.event_id, b.topic, b.key, b.payload, b.headers INTO e
		  FROM outbox.commit_backlog(g.cursor_ticket, g.cursor_seq, g.topics, horizon, NULL::xid8, g.shard, g.shards) b
		 LIMIT 1;
		has_next := FOUND;
		IF has_next AND e.major OPERATOR(pg_catalog.=) p.ticket::numeric AND e.seq OPERATOR(pg_catalog.=) p.seq THEN
			UPDATE outbox.groups
			   SET cursor_ticket = p.ticket, cursor_seq = p.seq, advanced_at = pg_catalog.now(),
				   generation = generation OPERATOR(pg_catalog.+) 1::bigint
			 WHERE id OPERATOR(pg_catalog.=) g.id
			RETURNING cursor INTO new_position;
		END IF;
	ELSE
		SELECT x.txid, x.seq INTO p FROM outbox.parse_position(outbox.unshift_position(pos, g.epoch)) x;
		SELECT b.txid::text::numeric AS major, b.seq, b.txid, b.event_id, b.topic, b.key, b.payload, b.headers INTO e
		  FROM outbox.backlog(g.cursor_txid, g.cursor_seq, g.topics, NULL::xid8, g.shard, g.shards) b
		 ORDER BY b.txid, b.seq
		 LIMIT 1;
		has_next := FOUND;
		IF has_next AND e.txid OPERATOR(pg_catalog.=) p.txid AND e.seq OPERATOR(pg_catalog.=) p.seq THEN
			UPDATE outbox.groups
			   SET cursor_txid = p.txid, cursor_seq = p.seq, advanced_at = pg_catalog.now(),
				   generation = generation OPERATOR(pg_catalog.+) 1::bigint
			 WHERE id OPERATOR(pg_catalog.=) g.id
			RETURNING cursor INTO new_position;
		END IF;
	END IF;
	IF new_position IS NULL THEN
		IF has_next THEN
			next_pos := pg_catalog.concat(e.major OPERATOR(pg_catalog.+) g.epoch::numeric, '-', e.seq);
		END IF;
		RAISE EXCEPTION 'position % is not the next event of group "%"', pos, group_name
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = CASE WHEN has_next
								THEN pg_catalog.format('The group''s next event is at %s (its cursor is at %s).', next_pos, g.cursor)
								ELSE pg_catalog.format('The group has no event waiting after its cursor, %s.', g.cursor) END,
				  HINT = 'outbox_skip() passes only the event a fetch of the group refused as too large to publish (SQLSTATE OB004), once the events before it were published.';
	END IF;
	-- A relay of this session that led the group goes on from the moved
	-- cursor without being refused once.
	IF outbox.is_leader(g.id) THEN
		PERFORM outbox.note_generation(g.id, g.generation OPERATOR(pg_catalog.+) 1::bigint);
	END IF;
	INSERT INTO outbox.skipped_events (group_name, shard, pos, txid, seq, event_id, topic, key, payload, headers,
									   text_size, reason)
	VALUES (g.name, g.shard, pos, e.txid, e.seq, e.event_id, e.topic, e.key, e.payload, e.headers,
			outbox.json_text_size(e.payload) OPERATOR(pg_catalog.+) coalesce(outbox.json_text_size(e.headers), 0::bigint),
			reason);
	RAISE LOG 'pg_outbox: group "%" skipped the event at % (event id %, topic "%"): %; cursor moved from % to %',
		group_name, pos, e.event_id, e.topic, reason, g.cursor, new_position;
	RETURN new_position;
END
$$;
COMMENT ON FUNCTION @extschema@.outbox_skip(text, text, text) IS
	'pg_outbox: moves the group''s cursor past its next event, at the position given (one a fetch refused as too large to publish), recording it in outbox.skipped_events';

--
-- Privileges: admins skip, and read what was skipped.
--
REVOKE ALL ON TABLE outbox.skipped_events FROM PUBLIC;
REVOKE ALL ON FUNCTION
	outbox.json_text_size(jsonb),
	@extschema@.outbox_skip(text, text, text)
FROM PUBLIC;

GRANT SELECT ON outbox.skipped_events TO outbox_admin;
GRANT EXECUTE ON FUNCTION
	outbox.json_text_size(jsonb),
	@extschema@.outbox_skip(text, text, text)
TO outbox_admin;
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
-- pg_outbox.today when set (tests run maintenance across days with it).
CREATE FUNCTION outbox.inbox_today()
RETURNS date
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
	SELECT coalesce(nullif(current_setting('pg_outbox.today', true), '')::date,
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

-- Errors when no consumer can have the name (C: the one definition of the
-- rules).
CREATE FUNCTION outbox.consumer_name_check(consumer text)
RETURNS void
AS '$libdir/pg_outbox', 'outbox_consumer_name_check'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION outbox.consumer_name_check(text) IS 'pg_outbox: errors when a consumer name is NULL, empty, over 255 bytes or holds control characters';

-- Errors unless the current role may act for the consumer (C).
CREATE FUNCTION @extschema@.inbox_consumer_check(consumer text)
RETURNS void
AS '$libdir/pg_outbox', 'outbox_inbox_consumer_check'
LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION @extschema@.inbox_consumer_check(text) IS
	'pg_outbox: errors (42501) unless the consumer is registered and the current role may act for it';

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

-- Unregisters a consumer. Its inbox rows and dead letters would outlive it
-- unseen and come back to whoever registers the name again, so it must
-- have none, or forget => true deletes them with it.
CREATE FUNCTION @extschema@.inbox_consumer_drop(consumer text, forget boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	applied bigint;
	dead bigint;
BEGIN
	PERFORM outbox.consumer_name_check(consumer);
	IF forget IS NULL THEN
		RAISE EXCEPTION 'forget must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	PERFORM 1 FROM outbox.consumers c WHERE c.name = consumer FOR UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'consumer "%" does not exist', consumer USING ERRCODE = 'undefined_object';
	END IF;
	-- Applies in progress finish first, so that the count sees them.
	LOCK TABLE outbox.inbox, outbox.dead_letters IN SHARE MODE;
	SELECT count(*) INTO applied FROM outbox.inbox i WHERE i.consumer = inbox_consumer_drop.consumer;
	SELECT count(*) INTO dead FROM outbox.dead_letters d WHERE d.consumer = inbox_consumer_drop.consumer;
	IF (applied > 0 OR dead > 0) AND NOT forget THEN
		RAISE EXCEPTION 'consumer "%" still has applied events or dead letters', consumer
			USING ERRCODE = 'dependent_objects_still_exist',
				  DETAIL = format('The inbox holds %s events and %s dead letters of it.', applied, dead),
				  HINT = 'Pass forget => true to delete them with it, or give it another owner with inbox_consumer_set_owner().';
	END IF;
	DELETE FROM outbox.inbox i WHERE i.consumer = inbox_consumer_drop.consumer;
	DELETE FROM outbox.dead_letters d WHERE d.consumer = inbox_consumer_drop.consumer;
	DELETE FROM outbox.consumers c WHERE c.name = consumer;
	RAISE LOG 'pg_outbox: consumer "%" dropped with % events and % dead letters', consumer, applied, dead;
END
$$;
COMMENT ON FUNCTION @extschema@.inbox_consumer_drop(text, boolean) IS
	'pg_outbox: unregisters an inbox consumer; refused while it has inbox rows or dead letters unless forget => true deletes them';

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

-- Records in the inbox the events a consumer applies now, once: for each
-- event, the payload applied before under its id (by an earlier
-- transaction or an earlier event of the same batch), NULL when it is new
-- and recorded now. Takes each event's inbox lock first, in the order of
-- their keys; at REPEATABLE READ and SERIALIZABLE, 40001 when an apply
-- committed after the transaction's snapshot (C, extension/consume.c).
-- Its lookups read the inbox by its unique indexes: a partition analyzed
-- while empty must not get a plan that scans it whole for every event of
-- every batch as it fills.
CREATE FUNCTION outbox.inbox_record(consumer text, event_ids uuid[], payloads jsonb[])
RETURNS jsonb[]
AS '$libdir/pg_outbox', 'outbox_inbox_record'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off;
COMMENT ON FUNCTION outbox.inbox_record(text, uuid[], jsonb[]) IS
	'pg_outbox: records the events a consumer applies in the inbox, once; returns for each the payload applied before (NULL when new); granted to nobody';

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

CREATE FUNCTION @extschema@.inbox_apply(consumer text, event_id uuid, payload jsonb)
RETURNS boolean
AS '$libdir/pg_outbox', 'outbox_inbox_checked'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION @extschema@.inbox_apply(text, uuid, jsonb) IS
	'pg_outbox: records that a consumer applies an event; true the first time, false for a redelivery, SQLSTATE OB001 for another payload under the same id';

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
	CONSTRAINT dead_letters_pkey PRIMARY KEY (id),
	CONSTRAINT dead_letters_entry_key UNIQUE (consumer, stream, entry_id)
);
COMMENT ON TABLE outbox.dead_letters IS 'pg_outbox: stream entries a consumer gave up on, with the reason';
COMMENT ON COLUMN outbox.dead_letters.applied_payload IS 'for an identity conflict: the payload applied earlier under the same event id';
COMMENT ON COLUMN outbox.dead_letters.fields IS 'the stream entry''s fields exactly as received, names and values in turn (NULL when recorded from typed values)';
COMMENT ON COLUMN outbox.dead_letters.event_id IS 'the entry''s event_id field when it decodes';
COMMENT ON COLUMN outbox.dead_letters.payload IS 'the entry''s payload field when it decodes';
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

CREATE FUNCTION @extschema@.inbox_dead_letter(consumer text, stream text, entry_id text, event_id uuid,
											  topic text, key text, payload jsonb, headers jsonb,
											  reason text, sqlstate text DEFAULT NULL, deliveries integer DEFAULT 1)
RETURNS bigint
AS '$libdir/pg_outbox', 'outbox_inbox_checked'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION @extschema@.inbox_dead_letter(text, text, text, uuid, text, text, jsonb, jsonb, text, text, integer) IS
	'pg_outbox: records a stream entry a consumer gave up on, from typed values, with the reason; returns the dead letter id';

CREATE FUNCTION @extschema@.inbox_dead_letter(consumer text, stream text, entry_id text, fields bytea[],
											  reason text, sqlstate text DEFAULT NULL, deliveries integer DEFAULT 1)
RETURNS bigint
AS '$libdir/pg_outbox', 'outbox_inbox_checked'
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
AS '$libdir/pg_outbox', 'outbox_inbox_consume'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION @extschema@.inbox_consume(text, text, bytea[], bytea[], bytea[], bytea[], bytea[], boolean) IS
	'pg_outbox: applies a batch of entries (fields as bytes) through the inbox and a handler, as one transaction, or each in a subtransaction with isolate; returns applied, duplicate, conflict, malformed or failed per entry';

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

-- Locks a dead letter of a consumer the caller may act for, marks it
-- replayed (in the caller's transaction) and returns it.
CREATE FUNCTION outbox.dead_letter_take(dead_letter_id bigint)
RETURNS outbox.dead_letters
AS '$libdir/pg_outbox', 'outbox_inbox_checked'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.dead_letter_take(bigint) IS
	'pg_outbox: locks a dead letter, marks it replayed and returns it, for inbox_replay()';

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
		EXECUTE handler USING d.topic, d.key, d.payload, d.headers, d.event_id;
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

CREATE FUNCTION outbox.try_maintenance_lock()
RETURNS boolean
AS '$libdir/pg_outbox', 'outbox_try_maintenance_lock'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.try_maintenance_lock() IS 'pg_outbox: takes the maintenance lock for this transaction if free';

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

-- The last background maintenance run of each database of the cluster, as
-- the launcher and its workers record it in shared memory (pg_outbox
-- preloaded; else 55000): databases without the extension are listed too.
CREATE FUNCTION @extschema@.outbox_maintenance_databases()
RETURNS TABLE (database name, runs bigint, last_outcome text, last_started_at timestamptz,
			   last_finished_at timestamptz)
AS '$libdir/pg_outbox', 'outbox_maintenance_databases'
LANGUAGE C VOLATILE STRICT PARALLEL RESTRICTED;
COMMENT ON FUNCTION @extschema@.outbox_maintenance_databases() IS
	'pg_outbox: the last background maintenance run of each database of the cluster: runs, outcome, start and end';


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
-- pg_outbox install script, part 60: statistics.
-- (assembled with the other parts of sql/install/; see 00_schema_roles.sql).

--
-- Statistics.
--

-- Backends and prepared transactions that hold a transaction id, oldest
-- first; the oldest one holds the feed horizon back. As the owner, to read
-- every backend's transaction id, but without any session's text.
CREATE FUNCTION outbox.horizon_holders_all()
RETURNS TABLE (holds_horizon boolean, pid integer, gid text, database name, username name,
			   state text, xid_age integer, xact_start timestamptz, held_for interval)
LANGUAGE sql STABLE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
	WITH h AS (
		SELECT (pg_snapshot_xmin(pg_current_snapshot())::text::numeric % 4294967296)::text::xid AS xmin32
	), holders AS (
		SELECT a.pid, NULL::text AS gid, a.datname, a.usename, a.state, a.backend_xid AS xid, a.xact_start
		  FROM pg_stat_activity a
		 WHERE a.backend_xid IS NOT NULL
		   AND a.pid <> pg_backend_pid()
		UNION ALL
		SELECT NULL, p.gid, p.database, p.owner, 'prepared', p.transaction, p.prepared
		  FROM pg_prepared_xacts p
	)
	SELECT x.xid = h.xmin32, x.pid, x.gid, x.datname, x.usename, x.state, age(x.xid),
		   x.xact_start, now() - x.xact_start
	  FROM holders x, h
	 ORDER BY age(x.xid) DESC, x.pid
$$;
COMMENT ON FUNCTION outbox.horizon_holders_all() IS
	'pg_outbox: backends and prepared transactions holding a transaction id, oldest first, without their session text';

-- The same with each backend's current query, as the caller: a query only
-- where pg_stat_activity shows it to the caller, and of other databases
-- only to a caller that may read all statistics (pg_read_all_stats).
CREATE FUNCTION @extschema@.outbox_horizon_holders()
RETURNS TABLE (holds_horizon boolean, pid integer, gid text, database name, username name,
			   state text, xid_age integer, xact_start timestamptz, held_for interval,
			   query text)
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
	SELECT h.holds_horizon, h.pid, h.gid, h.database, h.username, h.state, h.xid_age, h.xact_start,
		   h.held_for,
		   CASE WHEN h.database = current_database() OR pg_has_role('pg_read_all_stats', 'USAGE')
				THEN a.query END
	  FROM outbox.horizon_holders_all() h
	  LEFT JOIN pg_stat_activity a ON a.pid = h.pid
	 ORDER BY h.xid_age DESC, h.pid
$$;
COMMENT ON FUNCTION @extschema@.outbox_horizon_holders() IS
	'pg_outbox: backends and prepared transactions holding a transaction id, oldest first; the oldest holds the feed horizon back';

-- One row per group, one per shard of a sharded group (or for one group
-- only, for_group, or one shard, "<group>/<shard>"): cursor, leader
-- (its pid while its session runs, the age of its lease, the fencing
-- generation), backlog and why it may be held. The transaction holding the horizon holds
-- xid8-ordered groups only; commit-ordered groups wait for nothing but
-- commits in progress. Counting a backlog reads it: O(backlog).
--
-- "waiting" counts what the relay may publish now (below the horizon);
-- "held_back" counts the events of the group that committed but wait
-- above the horizon for an older transaction to end (xid8 order; NULL in
-- commit order), and "oldest_held_back_age" how long the oldest of them
-- has waited. An open transaction that holds the horizon shows there, not
-- in "waiting": a group it holds publishes nothing, and its "waiting" may
-- well be 0.
CREATE FUNCTION @extschema@.outbox_group_stats(for_group text DEFAULT NULL)
RETURNS TABLE (group_name text, topics text[], cursor_position text, leader_pid integer,
			   waiting bigint, oldest_waiting_age interval, advanced_at timestamptz,
			   horizon xid8, held_by_pid integer, held_by_gid text, held_for interval, stale boolean,
			   ordering text, commit_horizon bigint, lease_age interval, generation bigint,
			   shard integer, shards integer, held_back bigint, oldest_held_back_age interval)
LANGUAGE sql VOLATILE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- The estimates of the per-group backlog are high enough to trigger JIT
-- compilation, which costs far more than the query.
SET jit = off
AS $$
	WITH ch AS MATERIALIZED (
		SELECT CASE WHEN EXISTS (SELECT 1 FROM outbox.groups WHERE ordering = 'commit')
						 AND outbox.commit_order_available()
					THEN outbox.commit_horizon() END AS h),
	-- One horizon for every group: the backlog below it, the events held
	-- back at or above it.
	xh AS MATERIALIZED (SELECT outbox.horizon() AS h)
	SELECT g.name, g.topics, g.cursor,
		   CASE WHEN lh.alive THEN g.leader_pid END,
		   w.n, now() - w.oldest, g.advanced_at,
		   CASE WHEN g.ordering = 'xid8' THEN xh.h END, hh.pid, hh.gid, hh.held_for, g.stale,
		   g.ordering, CASE WHEN g.ordering = 'commit' THEN ch.h END,
		   CASE WHEN lh.alive THEN greatest(clock_timestamp() - g.lease_renewed, interval '0') END, g.generation,
		   g.shard, g.shards,
		   CASE WHEN g.ordering = 'xid8' THEN hb.n END, now() - hb.oldest
	  FROM outbox.groups g
	 CROSS JOIN ch
	 CROSS JOIN xh
	 CROSS JOIN LATERAL (SELECT coalesce(outbox.session_alive(g.leader_pid, g.leader_started), false) AS alive) lh
	 CROSS JOIN LATERAL (
		SELECT count(*) AS n, min(e.created_at) AS oldest
		  FROM (SELECT b.created_at FROM outbox.backlog(g.cursor_txid, g.cursor_seq, g.topics, xh.h, g.shard, g.shards) b
				 WHERE g.ordering = 'xid8'
				UNION ALL
				SELECT c.created_at FROM outbox.commit_backlog(g.cursor_ticket, g.cursor_seq, g.topics, ch.h, NULL, g.shard, g.shards) c
				 WHERE g.ordering = 'commit') e) w
	 -- The group's events of committed transactions at or above the
	 -- horizon (a running transaction's are not visible here): after the
	 -- cursor, of its topics and shard, as outbox.backlog() picks them.
	 CROSS JOIN LATERAL (
		SELECT count(*) AS n, min(e.created_at) AS oldest
		  FROM outbox.event e
		 WHERE g.ordering = 'xid8'
		   AND e.txid >= greatest(g.cursor_txid, xh.h) AND (e.txid, e.seq) > (g.cursor_txid, g.cursor_seq)
		   AND (g.topics IS NULL OR e.topic = ANY (g.topics))
		   AND (g.shards = 1 OR outbox.shard_of(e.topic, e.key, g.shards) = g.shard)) hb
	  LEFT JOIN LATERAL (
		SELECT h.pid, h.gid, h.held_for FROM outbox.horizon_holders_all() h
		 WHERE h.holds_horizon AND g.ordering = 'xid8' LIMIT 1) hh ON true
	 WHERE outbox.group_named(g.name, g.shard, for_group)
	 ORDER BY g.name, g.shard
$$;
COMMENT ON FUNCTION @extschema@.outbox_group_stats(text) IS
	'pg_outbox: per group (or for one): cursor, leader and its lease, events waiting, age of the oldest, last advance, who holds the horizon, and the events it holds back';

CREATE VIEW outbox.group_stats AS SELECT * FROM @extschema@.outbox_group_stats();
COMMENT ON VIEW outbox.group_stats IS 'pg_outbox: per-group statistics (see outbox_group_stats())';
CREATE VIEW outbox.horizon_holders AS SELECT * FROM @extschema@.outbox_horizon_holders();
COMMENT ON VIEW outbox.horizon_holders IS 'pg_outbox: who holds the feed horizon (see outbox_horizon_holders())';


--
-- Privileges: relays and admins read the statistics.
--
REVOKE ALL ON TABLE outbox.group_stats, outbox.horizon_holders FROM PUBLIC;
REVOKE ALL ON FUNCTION
	outbox.horizon_holders_all(),
	@extschema@.outbox_horizon_holders(),
	@extschema@.outbox_group_stats(text)
FROM PUBLIC;

GRANT EXECUTE ON FUNCTION
	@extschema@.outbox_horizon_holders(),
	@extschema@.outbox_group_stats(text)
TO outbox_relay, outbox_admin;
GRANT EXECUTE ON FUNCTION outbox.horizon_holders_all() TO outbox_relay, outbox_admin;
GRANT SELECT ON outbox.group_stats, outbox.horizon_holders TO outbox_relay, outbox_admin;
-- pg_outbox install script, part 90: maintenance starts.
-- (assembled with the other parts of sql/install/; see 00_schema_roles.sql).

--
-- Maintenance of this database starts as soon as the install commits
-- (when pg_outbox is preloaded; see worker.c).
--
CREATE FUNCTION outbox.maintenance_wake()
RETURNS boolean
AS '$libdir/pg_outbox', 'outbox_maintenance_wake'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.maintenance_wake() IS
	'pg_outbox: has the maintenance launcher look at every database once this transaction commits (when preloaded)';
REVOKE ALL ON FUNCTION outbox.maintenance_wake() FROM PUBLIC;
SELECT outbox.maintenance_wake();
