-- pg_outbox install script (single source; the build copies it to
-- pg_outbox--<version>.sql).
--
-- Layout: storage and internals live in schema "outbox"; the functions that
-- applications and relays call live in the extension's schema (by default
-- the first schema of search_path, usually "public"), so that
-- outbox_emit() works with the default search_path.

\echo Use "CREATE EXTENSION pg_outbox" to load this file. \quit

CREATE SCHEMA outbox;
COMMENT ON SCHEMA outbox IS 'pg_outbox storage and internals';
REVOKE ALL ON SCHEMA outbox FROM PUBLIC;

--
-- Roles. Roles are cluster-wide: the first database to install the
-- extension creates them, later ones reuse them. DROP EXTENSION leaves them.
--
DO $roles$
DECLARE
	r text;
BEGIN
	FOREACH r IN ARRAY ARRAY['outbox_writer', 'outbox_relay', 'outbox_consumer', 'outbox_admin']
	LOOP
		IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r) THEN
			EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', r);
		END IF;
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
	CONSTRAINT config_pkey PRIMARY KEY (only_row),
	CONSTRAINT config_only_row CHECK (only_row),
	CONSTRAINT config_partition_width_range CHECK (partition_width BETWEEN 100 AND 1000000000000),
	CONSTRAINT config_premake_range CHECK (premake BETWEEN 1 AND 1000),
	CONSTRAINT config_retention_check CHECK (retention >= interval '0'),
	CONSTRAINT config_retire_mode_check CHECK (retire_mode IN ('drop', 'detach')),
	CONSTRAINT config_lock_timeout_check CHECK (lock_timeout BETWEEN interval '1 millisecond' AND interval '1 minute'),
	CONSTRAINT config_max_group_lag_check CHECK (max_group_lag > interval '0')
);
COMMENT ON TABLE outbox.config IS 'pg_outbox settings (one row)';
COMMENT ON COLUMN outbox.config.partition_width IS 'transaction ids covered by one event partition';
COMMENT ON COLUMN outbox.config.premake IS 'partitions kept ready ahead of the current transaction id';
COMMENT ON COLUMN outbox.config.retention IS 'how long events are kept after every live group passed them';
COMMENT ON COLUMN outbox.config.retire_mode IS 'drop: retired partitions are dropped; detach: kept as tables outside the feed';
COMMENT ON COLUMN outbox.config.lock_timeout IS 'longest wait of maintenance DDL for a lock before it retries on a later run';
COMMENT ON COLUMN outbox.config.max_group_lag IS 'a group whose oldest waiting event is older than this is reported as lagging';
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
CREATE TABLE outbox.commit_log (
	txid xid8 NOT NULL,
	ticket bigint NOT NULL,
	CONSTRAINT commit_log_pkey PRIMARY KEY (txid)
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
BEGIN
	IF member <> EXISTS (SELECT 1 FROM pg_depend d
						  WHERE d.classid = 'pg_class'::regclass AND d.objid = rel AND d.deptype = 'e') THEN
		EXECUTE format('ALTER EXTENSION pg_outbox %s TABLE %s', CASE WHEN member THEN 'ADD' ELSE 'DROP' END, rel);
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
	x numeric := pg_snapshot_xmax(pg_current_snapshot())::text::numeric;
	r record;
BEGIN
	FOR i IN 0 .. (SELECT premake FROM outbox.config) LOOP
		SELECT * INTO r FROM outbox.free_range((x + i * (SELECT partition_width FROM outbox.config))::text::xid8);
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
AS 'MODULE_PATHNAME', 'outbox_commit_horizon'
LANGUAGE C VOLATILE STRICT PARALLEL RESTRICTED;
COMMENT ON FUNCTION outbox.commit_horizon() IS 'pg_outbox: commit horizon; every commit ticket at or below it is final (needs preloading)';

CREATE FUNCTION outbox.commit_order_available()
RETURNS boolean
AS 'MODULE_PATHNAME', 'outbox_commit_order_available'
LANGUAGE C VOLATILE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION outbox.commit_order_available() IS 'pg_outbox: whether this server orders commits (pg_outbox preloaded, not a standby)';

-- Waits until no prepared transaction that emitted is pending, and keeps
-- new ones out until the end of the transaction.
CREATE FUNCTION outbox.commit_order_lock()
RETURNS void
AS 'MODULE_PATHNAME', 'outbox_commit_order_lock'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.commit_order_lock() IS 'pg_outbox: waits for prepared transactions that emitted, and keeps new ones out';

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
	cursor text GENERATED ALWAYS AS ((coalesce(cursor_txid::text::numeric, cursor_ticket) + epoch) || '-' || cursor_seq) STORED,
	created_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
	advanced_at timestamptz,
	streams jsonb NOT NULL DEFAULT '{}',
	stale boolean NOT NULL DEFAULT false,
	generation bigint NOT NULL DEFAULT 1,
	leader_pid integer,
	leader_started timestamptz,
	lease_renewed timestamptz,
	lease_until timestamptz,
	CONSTRAINT groups_pkey PRIMARY KEY (id),
	CONSTRAINT groups_name_key UNIQUE (name),
	CONSTRAINT groups_name_check CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$'),
	CONSTRAINT groups_topics_check CHECK (topics IS NULL OR pg_catalog.cardinality(topics) > 0),
	CONSTRAINT groups_ordering_check CHECK (ordering IN ('xid8', 'commit')),
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
COMMENT ON COLUMN outbox.groups.streams IS 'last position the group''s relay published to each stream, as reported to outbox_advance()';
SELECT pg_catalog.pg_extension_config_dump('outbox.groups', '');

--
-- Emission (C).
--
CREATE FUNCTION @extschema@.outbox_emit(topic text, key text, payload jsonb,
										headers jsonb DEFAULT NULL, event_id uuid DEFAULT NULL)
RETURNS uuid
AS 'MODULE_PATHNAME', 'outbox_emit'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION @extschema@.outbox_emit(text, text, jsonb, jsonb, uuid) IS
	'pg_outbox: writes one event in the current transaction and returns its event id';

CREATE FUNCTION @extschema@.outbox_emit_many(topic text, keys text[], payloads jsonb[],
											 headers jsonb[] DEFAULT NULL, event_ids uuid[] DEFAULT NULL)
RETURNS SETOF uuid
AS 'MODULE_PATHNAME', 'outbox_emit_many'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1000;
COMMENT ON FUNCTION @extschema@.outbox_emit_many(text, text[], jsonb[], jsonb[], uuid[]) IS
	'pg_outbox: writes one event per array element in the current transaction and returns their event ids in order';

--
-- Leadership: the leading session is written in the group's row (pid and
-- backend start), with a lease that its fetches and advances renew. A
-- standby takes the group over when the leader's session ended, at once,
-- or when its lease ran out: a relay that is stopped, paused or stuck
-- keeps its connection, but not the group. See lead.c.
--
CREATE FUNCTION outbox.lock_class()
RETURNS oid
AS 'MODULE_PATHNAME', 'outbox_lock_class'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION outbox.lock_class() IS 'pg_outbox: classid of pg_outbox''s advisory locks (pg_locks.classid)';

CREATE FUNCTION outbox.session_started()
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'outbox_session_started'
LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION outbox.session_started() IS 'pg_outbox: when this backend started; with its pid, names the session';

CREATE FUNCTION outbox.session_alive(pid integer, started timestamptz)
RETURNS boolean
AS 'MODULE_PATHNAME', 'outbox_session_alive'
LANGUAGE C VOLATILE STRICT PARALLEL RESTRICTED;
COMMENT ON FUNCTION outbox.session_alive(integer, timestamptz) IS
	'pg_outbox: true while the backend with this pid that started then runs';

CREATE FUNCTION outbox.lease()
RETURNS interval
AS 'MODULE_PATHNAME', 'outbox_lease'
LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION outbox.lease() IS 'pg_outbox: this session''s lease of a group''s leadership (pg_outbox.lease)';

CREATE FUNCTION outbox.forget_leadership(group_id integer)
RETURNS boolean
AS 'MODULE_PATHNAME', 'outbox_forget_leadership'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.forget_leadership(integer) IS
	'pg_outbox: forgets that this session took the lead of a group; true when it had';

CREATE FUNCTION outbox.note_generation(group_id integer, generation bigint)
RETURNS bigint
AS 'MODULE_PATHNAME', 'outbox_note_generation'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.note_generation(integer, bigint) IS
	'pg_outbox: notes a led group''s generation for this session; returns the one noted before';

-- Refuses a leader's fetch or advance once after its group's cursor was
-- moved by outbox_rewind() (SQLSTATE OB002); its next fetch starts at the
-- moved cursor. Called only when outbox.note_generation() saw a change.
CREATE FUNCTION outbox.raise_rewound(g outbox.groups)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
BEGIN
	RAISE EXCEPTION 'cursor of group "%" was moved by outbox_rewind() while this session led it', g.name
		USING ERRCODE = 'OB002',
			  DETAIL = format('The cursor is at %s now.', g.cursor),
			  HINT = 'Fetch again without "after": the next batch starts at the moved cursor.';
END
$$;
COMMENT ON FUNCTION outbox.raise_rewound(outbox.groups) IS
	'pg_outbox: raises OB002 for a leader whose group''s cursor was moved under it';

-- Refuses the call of a session whose leadership of the group passed to
-- another session (SQLSTATE OB003), once: the leadership noted for it is
-- forgotten, and its next call stands by or takes the group back.
CREATE FUNCTION outbox.raise_lost(g outbox.groups)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
BEGIN
	RAISE EXCEPTION 'this session no longer leads group "%"', g.name
		USING ERRCODE = 'OB003',
			  DETAIL = format('Its lease ran out and another session took the group over (generation %s).', g.generation),
			  HINT = 'Stand by: what this session published is harmless, and the new leader publishes from the cursor.';
END
$$;
COMMENT ON FUNCTION outbox.raise_lost(outbox.groups) IS
	'pg_outbox: raises OB003 for a session whose leadership of a group passed to another';

-- Takes or keeps the group's leadership for this session; true when it
-- leads. The leader renews its lease (at most every third of it, so that
-- most fetches write nothing). Another session takes the group over when
-- no session leads it, when the leader's session ended, or when its lease
-- ran out. The takeover compares and sets the leader and the lease in one
-- update, so that of two standbys one wins and a lease renewed meanwhile
-- is not taken; it bumps the generation (fencing). A session that led the
-- group and finds another leading is refused once (OB003).
CREATE FUNCTION outbox.lead(group_id integer)
RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT PARALLEL UNSAFE
AS $$
DECLARE
	g outbox.groups;
	me timestamptz := outbox.session_started();
	gen bigint;
BEGIN
	SELECT * INTO g FROM outbox.groups WHERE id = group_id;
	IF NOT FOUND THEN
		RETURN false;
	END IF;
	IF g.leader_pid = pg_catalog.pg_backend_pid() AND g.leader_started = me THEN
		IF g.lease_renewed > pg_catalog.clock_timestamp() - outbox.lease() / 3 THEN
			RETURN true;
		END IF;
		UPDATE outbox.groups
		   SET lease_renewed = pg_catalog.clock_timestamp(), lease_until = pg_catalog.clock_timestamp() + outbox.lease()
		 WHERE id = group_id AND leader_pid = pg_catalog.pg_backend_pid() AND leader_started = me;
		IF FOUND THEN
			RETURN true;
		END IF;
		SELECT * INTO g FROM outbox.groups WHERE id = group_id;
	END IF;
	IF outbox.forget_leadership(group_id) THEN
		PERFORM outbox.raise_lost(g);
	END IF;
	IF g.leader_pid IS NOT NULL AND g.lease_until > pg_catalog.clock_timestamp()
	   AND outbox.session_alive(g.leader_pid, g.leader_started) THEN
		RETURN false;
	END IF;
	UPDATE outbox.groups
	   SET leader_pid = pg_catalog.pg_backend_pid(), leader_started = me,
		   lease_renewed = pg_catalog.clock_timestamp(), lease_until = pg_catalog.clock_timestamp() + outbox.lease(),
		   generation = generation + 1
	 WHERE id = group_id
	   AND leader_pid IS NOT DISTINCT FROM g.leader_pid AND leader_started IS NOT DISTINCT FROM g.leader_started
	   AND lease_until IS NOT DISTINCT FROM g.lease_until
	RETURNING generation INTO gen;
	IF NOT FOUND THEN
		RETURN false;
	END IF;
	PERFORM outbox.note_generation(group_id, gen);
	RETURN true;
END
$$;
COMMENT ON FUNCTION outbox.lead(integer) IS
	'pg_outbox: takes (when free, its leader gone or its lease run out) or keeps the leadership of a group for this session; true when it leads';

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
-- Positions: "<txid>-<seq>", the same text as the Redis stream entry id a
-- relay gives the event.
--
--
-- The internal helpers that run on every fetch and advance
-- (parse_position, parse_commit_position, get_group, fetch_args) pin no
-- search_path of their own: the functions that call them do, and a role
-- that calls them directly runs them with its own privileges. Each SET
-- clause costs a save and restore of settings per call.
CREATE FUNCTION outbox.parse_position(pos text, OUT txid xid8, OUT seq bigint)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
	IF pos IS NULL THEN
		RAISE EXCEPTION 'position must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF pos !~ '^[0-9]{1,20}-[0-9]{1,19}$' THEN
		RAISE EXCEPTION 'invalid feed position "%"', pos
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'A position is written "<transaction id>-<sequence>", for example "1042-3".';
	END IF;
	-- Range checks without an exception block (a subtransaction per call).
	IF split_part(pos, '-', 1)::numeric > 18446744073709551615
	   OR split_part(pos, '-', 2)::numeric > 9223372036854775807 THEN
		RAISE EXCEPTION 'invalid feed position "%"', pos
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'A part of the position is out of range.';
	END IF;
	txid := split_part(pos, '-', 1)::xid8;
	seq := split_part(pos, '-', 2)::bigint;
END
$$;
COMMENT ON FUNCTION outbox.parse_position(text) IS 'pg_outbox: splits a feed position "<txid>-<seq>"';

-- Looks up a group by name, locking its row when asked; raises 42704 when
-- it does not exist.
CREATE FUNCTION outbox.get_group(group_name text, for_update boolean DEFAULT false)
RETURNS outbox.groups
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
	g outbox.groups;
BEGIN
	IF group_name IS NULL THEN
		RAISE EXCEPTION 'group name must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF for_update THEN
		SELECT * INTO g FROM outbox.groups WHERE name = group_name FOR NO KEY UPDATE;
	ELSE
		SELECT * INTO g FROM outbox.groups WHERE name = group_name;
	END IF;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'group "%" does not exist', group_name
			USING ERRCODE = 'undefined_object',
				  HINT = 'Create it with outbox_group_create().';
	END IF;
	RETURN g;
END
$$;
COMMENT ON FUNCTION outbox.get_group(text, boolean) IS 'pg_outbox: a group by name, or error 42704';

--
-- Group management (admin).
--
CREATE FUNCTION @extschema@.outbox_group_create(group_name text, topics text[] DEFAULT NULL,
												start_at text DEFAULT 'now', ordering text DEFAULT NULL)
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
	BEGIN
		INSERT INTO outbox.groups (name, topics, ordering, cursor_txid, cursor_ticket, cursor_seq)
		VALUES (group_name, topics, ord, c_txid, c_ticket, 0);
	EXCEPTION WHEN unique_violation THEN
		RAISE EXCEPTION 'group "%" already exists', group_name USING ERRCODE = 'duplicate_object';
	END;
END
$$;
COMMENT ON FUNCTION @extschema@.outbox_group_create(text, text[], text, text) IS
	'pg_outbox: creates a group (a cursor over the feed), for all topics or some, starting now or at the beginning, in commit or xid8 order';

CREATE FUNCTION @extschema@.outbox_group_drop(group_name text, if_exists boolean DEFAULT false)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF group_name IS NULL THEN
		RAISE EXCEPTION 'group name must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	DELETE FROM outbox.groups WHERE name = group_name;
	IF NOT FOUND THEN
		IF coalesce(if_exists, false) THEN
			RETURN false;
		END IF;
		RAISE EXCEPTION 'group "%" does not exist', group_name USING ERRCODE = 'undefined_object';
	END IF;
	RETURN true;
END
$$;
COMMENT ON FUNCTION @extschema@.outbox_group_drop(text, boolean) IS 'pg_outbox: drops a group and its cursor';

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
CREATE FUNCTION outbox.backlog(cursor_txid xid8, cursor_seq bigint, topics text[], below xid8 DEFAULT NULL)
RETURNS SETOF outbox.event
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
	SELECT e.*
	  FROM outbox.event e
	 WHERE e.txid >= cursor_txid AND (e.txid, e.seq) > (cursor_txid, cursor_seq)
	   AND e.txid < coalesce(below, outbox.horizon())
	   AND (topics IS NULL OR e.topic = ANY (topics))
$$;
COMMENT ON FUNCTION outbox.backlog(xid8, bigint, text[], xid8) IS 'pg_outbox: the events after a cursor and below the horizon (or an earlier one), of some topics or all';

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
									  below xid8 DEFAULT NULL)
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
		 ORDER BY v.seq
		OFFSET 0) e
$$;
COMMENT ON FUNCTION outbox.commit_backlog(bigint, bigint, text[], bigint, xid8) IS
	'pg_outbox: the events after a commit-order cursor and up to a commit horizon, of some topics or all, in commit order';

-- Splits a commit-order position "<ticket>-<seq>".
CREATE FUNCTION outbox.parse_commit_position(pos text, OUT ticket bigint, OUT seq bigint)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
	p record;
BEGIN
	SELECT * INTO p FROM outbox.parse_position(pos);
	IF p.txid > '9223372036854775807'::xid8 THEN
		RAISE EXCEPTION 'invalid feed position "%"', pos
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'The commit ticket is out of range.';
	END IF;
	ticket := p.txid::text::bigint;
	seq := p.seq;
END
$$;
COMMENT ON FUNCTION outbox.parse_commit_position(text) IS 'pg_outbox: splits a commit-order position "<ticket>-<seq>"';

-- A group's position as this server's: a group re-anchored in another
-- cluster (outbox_reanchor) adds an epoch to the transaction id or ticket
-- of its positions; this takes it off. Text that is no position is
-- returned as is, for the parser to refuse.
CREATE FUNCTION outbox.unshift_position(pos text, epoch bigint)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
	major numeric;
BEGIN
	IF epoch = 0 OR pos !~ '^[0-9]{1,20}-[0-9]{1,19}$' THEN
		RETURN pos;
	END IF;
	major := split_part(pos, '-', 1)::numeric;
	IF major < epoch THEN
		RAISE EXCEPTION 'position % is from before the group was re-anchored', pos
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = format('The group''s positions start at %s since outbox_reanchor().', epoch);
	END IF;
	RETURN (major - epoch) || '-' || split_part(pos, '-', 2);
END
$$;
COMMENT ON FUNCTION outbox.unshift_position(text, bigint) IS 'pg_outbox: a re-anchored group''s position as this server''s (the epoch taken off)';

-- Reading the commit-ordered feed needs a snapshot taken after the
-- horizon: READ COMMITTED, where each statement takes a new one.
CREATE FUNCTION outbox.check_commit_read()
RETURNS void
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF current_setting('transaction_isolation') <> 'read committed' THEN
		RAISE EXCEPTION 'a commit-ordered group is read at READ COMMITTED only'
			USING ERRCODE = 'invalid_transaction_state',
				  DETAIL = format('This transaction is %s: its snapshot may predate the commit horizon, and events would be skipped.',
								  upper(current_setting('transaction_isolation')));
	END IF;
END
$$;
COMMENT ON FUNCTION outbox.check_commit_read() IS 'pg_outbox: refuses to read the commit-ordered feed above READ COMMITTED';

-- Where a group's next batch starts, for outbox_fetch(): checks the
-- arguments, takes the group's leadership for this session when it is free
-- (no row while another session leads), and returns the group's order and
-- where its batch lies: after the cursor, or a later position given as
-- "after", of the group's topics, in commit order up to the commit horizon,
-- at most the batch size, of transactions below "below" (the xid8 horizon,
-- or in commit order a transaction id above every transaction up to the
-- commit horizon). Both horizons are read here, before the snapshot that
-- reads the batch is taken.
CREATE FUNCTION outbox.fetch_args(group_name text, batch_size integer, after text)
RETURNS TABLE (ordering text, cursor_txid xid8, cursor_ticket bigint,
			   cursor_seq bigint, topics text[], horizon bigint, row_limit integer, below xid8, epoch bigint)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
	g outbox.groups;
	next_xid xid8;
	a record;
BEGIN
	IF batch_size IS NULL THEN
		RAISE EXCEPTION 'batch_size must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF batch_size < 1 OR batch_size > 100000 THEN
		RAISE EXCEPTION 'batch_size % is out of range', batch_size
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'batch_size must be between 1 and 100000.';
	END IF;
	g := outbox.get_group(group_name);
	-- The leader goes on while its lease is fresh; anyone else, and the
	-- leader when its lease is due, asks outbox.lead().
	IF g.leader_pid IS DISTINCT FROM pg_backend_pid() OR g.leader_started IS DISTINCT FROM outbox.session_started()
	   OR g.lease_renewed <= clock_timestamp() - outbox.lease() / 3 THEN
		IF NOT outbox.lead(g.id) THEN
			RETURN;
		END IF;
		g := outbox.get_group(group_name);
	END IF;
	IF outbox.note_generation(g.id, g.generation) <> g.generation THEN
		PERFORM outbox.raise_rewound(g);
	END IF;
	IF g.epoch > 0 THEN
		after := outbox.unshift_position(after, g.epoch);
	END IF;
	IF g.ordering = 'commit' THEN
		PERFORM outbox.check_commit_read();
		horizon := outbox.commit_horizon();
		-- No ticket above the horizon's next one has been issued yet: a
		-- cursor there was not reached by publishing. Reading on would
		-- skip every ticket up to it, issued later, for good.
		IF g.cursor_ticket > horizon + 1 THEN
			RAISE EXCEPTION 'cursor of group "%" is ahead of this server''s commit tickets', group_name
				USING ERRCODE = 'object_not_in_prerequisite_state',
					  DETAIL = format('The cursor is at ticket %s, the commit horizon is at %s.', g.cursor_ticket, horizon),
					  HINT = format('After a restore into another cluster or a failover, re-anchor the group with outbox_reanchor(%L).',
									group_name);
		END IF;
		-- Every transaction with a ticket up to the horizon has ended, so
		-- its id is below the next one read after the horizon (each
		-- expression of this volatile function sees a new snapshot).
		below := pg_snapshot_xmax(pg_current_snapshot());
		IF after IS NOT NULL THEN
			SELECT * INTO a FROM outbox.parse_commit_position(after);
			IF (a.ticket, a.seq) > (g.cursor_ticket, g.cursor_seq) THEN
				g.cursor_ticket := a.ticket;
				g.cursor_seq := a.seq;
			END IF;
		END IF;
	ELSE
		below := outbox.horizon();
		next_xid := pg_snapshot_xmax(pg_current_snapshot());
		IF g.cursor_txid > next_xid THEN
			RAISE EXCEPTION 'cursor of group "%" is ahead of this server''s transaction ids', group_name
				USING ERRCODE = 'object_not_in_prerequisite_state',
					  DETAIL = format('The cursor is at transaction %s, the next transaction id is %s. This happens after a dump and restore into another cluster, or a failover to a server with an older history.',
									  g.cursor_txid, next_xid),
					  HINT = format('Re-anchor the group with outbox_reanchor(%L): it goes on from this server''s horizon, with stream ids above those it published.',
									group_name);
		END IF;
		-- A relay that fetches the next batch while the broker still writes
		-- the previous one reads after that batch, not after the cursor.
		IF after IS NOT NULL THEN
			SELECT * INTO a FROM outbox.parse_position(after);
			IF (a.txid, a.seq) > (g.cursor_txid, g.cursor_seq) THEN
				g.cursor_txid := a.txid;
				g.cursor_seq := a.seq;
			END IF;
		END IF;
	END IF;
	ordering := g.ordering;
	cursor_txid := g.cursor_txid;
	cursor_ticket := g.cursor_ticket;
	cursor_seq := g.cursor_seq;
	topics := g.topics;
	row_limit := batch_size;
	epoch := g.epoch;
	RETURN NEXT;
END
$$;
COMMENT ON FUNCTION outbox.fetch_args(text, integer, text) IS
	'pg_outbox: checks outbox_fetch()''s arguments, takes the leadership, and returns where the batch starts (no row while another session leads)';

-- The next batch after the group's cursor. Takes the group's leadership for
-- this session when it is free; returns nothing while another session leads.
-- outbox.fetch_args() says where the batch lies; fetch.c reads it by index,
-- without planning a query: the head of outbox.backlog() (xid8 order) or
-- outbox.commit_backlog() (commit order), in feed order. A batch costs
-- O(batch) at any backlog (I-10), and a relay that keeps up with a trickle
-- of commits, fetching many small batches a second, does not pay for a
-- plan each time. With "wait", an empty batch waits for a commit that
-- emitted (pg_outbox preloaded, READ COMMITTED), up to that long.
CREATE FUNCTION @extschema@.outbox_fetch(group_name text, batch_size integer DEFAULT 1000, after text DEFAULT NULL,
										 wait interval DEFAULT NULL)
RETURNS TABLE (pos text, txid xid8, seq bigint, event_id uuid, topic text, key text,
			   payload jsonb, headers jsonb, created_at timestamptz)
AS 'MODULE_PATHNAME', 'outbox_fetch'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER ROWS 1000
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION @extschema@.outbox_fetch(text, integer, text, interval) IS
	'pg_outbox: the next batch of the group''s feed after its cursor (or after a later position); empty while another session leads the group';

-- Moves the cursor forward to the last published position. Only the leader
-- may; a position behind the cursor is refused (see outbox_rewind).
CREATE FUNCTION @extschema@.outbox_advance(group_name text, pos text, streams jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	g outbox.groups;
	p record;
	bad record;
	lpos text;
	new_txid xid8;
	new_ticket bigint;
	behind boolean;
	horizon bigint;
BEGIN
	g := outbox.get_group(group_name, true);
	lpos := outbox.unshift_position(pos, g.epoch);
	SELECT * INTO p FROM outbox.parse_position(lpos);
	-- The row is locked: its leader is the leader until this transaction ends.
	IF g.leader_pid IS DISTINCT FROM pg_backend_pid() OR g.leader_started IS DISTINCT FROM outbox.session_started() THEN
		IF outbox.forget_leadership(g.id) THEN
			PERFORM outbox.raise_lost(g);
		END IF;
		RAISE EXCEPTION 'this session does not lead group "%"', group_name
			USING ERRCODE = 'OB003',
				  HINT = 'Only the session that fetched the batch with outbox_fetch() may advance the cursor.';
	END IF;
	IF outbox.note_generation(g.id, g.generation) <> g.generation THEN
		PERFORM outbox.raise_rewound(g);
	END IF;
	IF streams IS NOT NULL THEN
		IF jsonb_typeof(streams) <> 'object' THEN
			RAISE EXCEPTION 'streams must be a JSON object of stream names and positions'
				USING ERRCODE = 'invalid_parameter_value';
		END IF;
		SELECT s.key, s.value INTO bad FROM jsonb_each(streams) s
		 WHERE jsonb_typeof(s.value) <> 'string'
			OR s.value #>> '{}' !~ '^[0-9]{1,20}-[0-9]{1,19}$'
		 LIMIT 1;
		IF FOUND THEN
			RAISE EXCEPTION 'invalid position % for stream "%" in streams', bad.value, bad.key
				USING ERRCODE = 'invalid_parameter_value',
					  HINT = 'streams maps each stream name to the last position published there, as a string such as "1042-3".';
		END IF;
	END IF;
	-- The position in the group's order: (ticket, seq) or (txid, seq).
	IF g.ordering = 'commit' THEN
		new_ticket := (outbox.parse_commit_position(lpos)).ticket;
		behind := (new_ticket, p.seq) < (g.cursor_ticket, g.cursor_seq);
	ELSE
		new_txid := p.txid;
		behind := (new_txid, p.seq) < (g.cursor_txid, g.cursor_seq);
	END IF;
	IF behind THEN
		RAISE EXCEPTION 'position % is behind the cursor of group "%"', pos, group_name
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = format('The cursor is at %s.', g.cursor),
				  HINT = 'Use outbox_rewind() to move a cursor backwards.';
	END IF;
	IF g.ordering = 'commit' THEN
		horizon := outbox.commit_horizon();
		IF new_ticket > horizon THEN
			RAISE EXCEPTION 'position % is beyond the commit horizon', pos
				USING ERRCODE = 'invalid_parameter_value',
					  DETAIL = format('Commit tickets after %s may still be committing.', horizon);
		END IF;
	ELSIF new_txid >= outbox.horizon() THEN
		RAISE EXCEPTION 'position % is beyond the feed horizon', pos
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = format('Transactions from %s on may still be running.', outbox.horizon());
	END IF;
	IF p.seq = g.cursor_seq AND new_txid IS NOT DISTINCT FROM g.cursor_txid
	   AND new_ticket IS NOT DISTINCT FROM g.cursor_ticket AND streams IS NULL THEN
		RETURN;
	END IF;
	UPDATE outbox.groups
	   SET cursor_txid = new_txid, cursor_ticket = new_ticket, cursor_seq = p.seq, advanced_at = now(),
		   lease_renewed = clock_timestamp(), lease_until = clock_timestamp() + outbox.lease(),
		   streams = CASE WHEN outbox_advance.streams IS NULL THEN groups.streams
						  ELSE groups.streams || outbox_advance.streams END
	 WHERE id = g.id;
END
$$;
COMMENT ON FUNCTION @extschema@.outbox_advance(text, text, jsonb) IS
	'pg_outbox: moves the group''s cursor forward to the last published position (leader only), recording the last position per stream';

-- A relay is about to wait for a notification: the next commit that
-- emitted sends one. True when notifications are sent on demand like this
-- (pg_outbox is preloaded), false when every such commit notifies anyway.
CREATE FUNCTION @extschema@.outbox_relay_waiting()
RETURNS boolean
AS 'MODULE_PATHNAME', 'outbox_relay_waiting'
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
-- starts again from the new one (outbox.raise_rewound). A position whose
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
-- The inbox: what each consumer applied, to apply every event once.
--

-- outbox.inbox is range-partitioned by day of application, so retention
-- drops whole partitions. Uniqueness of (consumer, event_id) holds within a
-- partition by a unique index, and across partitions because inbox_apply()
-- serializes applies of one event and looks in every partition first.
CREATE TABLE outbox.inbox (
	consumer text NOT NULL,
	event_id uuid NOT NULL,
	payload jsonb NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT pg_catalog.now()
) PARTITION BY RANGE (applied_at);
COMMENT ON TABLE outbox.inbox IS 'pg_outbox inbox: events applied per consumer, with the payload applied; partitioned by day';
CREATE TABLE outbox.inbox_default PARTITION OF outbox.inbox DEFAULT;
COMMENT ON TABLE outbox.inbox_default IS 'pg_outbox: inbox rows beyond the premade partitions (normally empty)';
CREATE UNIQUE INDEX inbox_default_consumer_event_id_key ON outbox.inbox_default (consumer, event_id);

ALTER TABLE outbox.config
	ADD COLUMN inbox_retention interval NOT NULL DEFAULT '7 days',
	ADD CONSTRAINT config_inbox_retention_check CHECK (inbox_retention >= interval '1 day');
COMMENT ON COLUMN outbox.config.inbox_retention IS 'how long the inbox remembers applied events; must cover the broker''s retention and any replay window';

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

CREATE FUNCTION outbox.inbox_lock(key bigint)
RETURNS void
AS 'MODULE_PATHNAME', 'outbox_inbox_lock'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.inbox_lock(bigint) IS 'pg_outbox: transaction lock that serializes applies of one event by one consumer';


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
AS 'MODULE_PATHNAME', 'outbox_consumer_name_check'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION outbox.consumer_name_check(text) IS 'pg_outbox: errors when a consumer name is NULL, empty, over 255 bytes or holds control characters';

-- Errors unless the current role may act for the consumer (C).
CREATE FUNCTION @extschema@.inbox_consumer_check(consumer text)
RETURNS void
AS 'MODULE_PATHNAME', 'outbox_inbox_consumer_check'
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
-- alone. These are the one definition of what a field must hold.
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

-- The payload a consumer applied under an event id, NULL when none; at
-- REPEATABLE READ and SERIALIZABLE, 40001 when an apply committed after
-- the transaction's snapshot (C, extension/inbox.c). Call it holding the
-- event's inbox lock.
CREATE FUNCTION outbox.inbox_applied(consumer text, event_id uuid)
RETURNS jsonb
AS 'MODULE_PATHNAME', 'outbox_inbox_applied'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.inbox_applied(text, uuid) IS
	'pg_outbox: the payload a consumer applied under an event id, read after the event''s inbox lock; 40001 at REPEATABLE READ or SERIALIZABLE when only a later snapshot sees it';

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
	PERFORM outbox.inbox_lock(hashtextextended(consumer || '/' || event_id::text, 0));
	applied := outbox.inbox_applied(consumer, event_id);
	IF applied IS NOT NULL THEN
		IF applied = payload THEN
			RETURN false;
		END IF;
		RAISE EXCEPTION 'event % was already applied by consumer "%" with another payload', event_id, consumer
			USING ERRCODE = 'OB001',
				  DETAIL = format('Applied payload: %s. Received payload: %s.', applied, payload),
				  HINT = 'Two different events carry the same event id. Nothing was applied; find the producer that reused the id.';
	END IF;
	INSERT INTO outbox.inbox (consumer, event_id, payload) VALUES (consumer, event_id, payload);
	RETURN true;
END
$$;
COMMENT ON FUNCTION outbox.inbox_apply_unchecked(text, uuid, jsonb) IS
	'pg_outbox: body of inbox_apply(), called after its consumer check; granted to nobody';

CREATE FUNCTION @extschema@.inbox_apply(consumer text, event_id uuid, payload jsonb)
RETURNS boolean
AS 'MODULE_PATHNAME', 'outbox_inbox_checked'
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
AS 'MODULE_PATHNAME', 'outbox_inbox_checked'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION @extschema@.inbox_dead_letter(text, text, text, uuid, text, text, jsonb, jsonb, text, text, integer) IS
	'pg_outbox: records a stream entry a consumer gave up on, from typed values, with the reason; returns the dead letter id';

CREATE FUNCTION @extschema@.inbox_dead_letter(consumer text, stream text, entry_id text, fields bytea[],
											  reason text, sqlstate text DEFAULT NULL, deliveries integer DEFAULT 1)
RETURNS bigint
AS 'MODULE_PATHNAME', 'outbox_inbox_checked'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION @extschema@.inbox_dead_letter(text, text, text, bytea[], text, text, integer) IS
	'pg_outbox: records a stream entry a consumer gave up on, from its raw fields kept as received, with the reason; returns the dead letter id';

-- Applies a batch of stream entries for a consumer, each in its own
-- subtransaction: decodes its fields, inbox_apply(), then the handler when
-- the event is new. Fields come as bytes, as they were in the stream, and
-- are decoded per entry: a malformed one fails alone ('malformed'), and so
-- does a failing handler ('failed'). Runs as the caller, with the
-- caller's search_path, so the handler runs with the consumer's own
-- privileges and names; everything it calls itself is schema-qualified.
CREATE FUNCTION @extschema@.inbox_consume(consumer text, handler text, event_ids bytea[], topics bytea[],
										  keys bytea[], payloads bytea[], headers bytea[])
RETURNS TABLE (ord integer, status text, error_code text, error_message text)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
	n integer := coalesce(cardinality(payloads), 0);
	id uuid;
	v_topic text;
	v_key text;
	body jsonb;
	meta jsonb;
	decoding text;
	err_state text;
	err_message text;
	err_detail text;
BEGIN
	PERFORM @extschema@.inbox_consumer_check(consumer);
	IF handler IS NULL OR handler = '' THEN
		RAISE EXCEPTION 'handler must not be empty' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF coalesce(cardinality(event_ids), 0) <> n OR coalesce(cardinality(topics), 0) <> n
	   OR coalesce(cardinality(keys), n) <> n OR coalesce(cardinality(headers), n) <> n THEN
		RAISE EXCEPTION 'the arrays of inbox_consume() must have the same length'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'keys and headers may also be NULL.';
	END IF;
	IF n > 0 AND (array_ndims(payloads) > 1 OR array_lower(event_ids, 1) <> 1 OR array_lower(topics, 1) <> 1
				  OR array_lower(payloads, 1) <> 1 OR coalesce(array_lower(keys, 1), 1) <> 1
				  OR coalesce(array_lower(headers, 1), 1) <> 1) THEN
		RAISE EXCEPTION 'the arrays of inbox_consume() must be one-dimensional and start at 1'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	FOR i IN 1 .. n LOOP
		ord := i;
		error_code := NULL;
		error_message := NULL;
		BEGIN
			decoding := 'event_id';
			IF event_ids[i] IS NULL THEN
				RAISE EXCEPTION 'the entry has no such field' USING ERRCODE = 'null_value_not_allowed';
			END IF;
			id := outbox.entry_uuid(event_ids[i]);
			decoding := 'topic';
			IF topics[i] IS NULL THEN
				RAISE EXCEPTION 'the entry has no such field' USING ERRCODE = 'null_value_not_allowed';
			END IF;
			v_topic := outbox.entry_text(topics[i]);
			decoding := 'key';
			v_key := outbox.entry_text(keys[i]);
			decoding := 'payload';
			IF payloads[i] IS NULL THEN
				RAISE EXCEPTION 'the entry has no such field' USING ERRCODE = 'null_value_not_allowed';
			END IF;
			body := outbox.entry_json(payloads[i]);
			decoding := 'headers';
			meta := outbox.entry_json(headers[i]);
			decoding := NULL;
			IF @extschema@.inbox_apply(consumer, id, body) THEN
				EXECUTE handler USING v_topic, v_key, body, meta, id;
				status := 'applied';
			ELSE
				status := 'duplicate';
			END IF;
		EXCEPTION WHEN OTHERS THEN
			GET STACKED DIAGNOSTICS err_state = RETURNED_SQLSTATE, err_message = MESSAGE_TEXT,
									err_detail = PG_EXCEPTION_DETAIL;
			error_code := err_state;
			error_message := err_message || CASE WHEN err_detail <> '' THEN ' (' || err_detail || ')' ELSE '' END;
			IF decoding IS NOT NULL THEN
				status := 'malformed';
				error_message := format('field "%s": %s', decoding, error_message);
			ELSE
				status := CASE WHEN err_state = 'OB001' THEN 'conflict' ELSE 'failed' END;
			END IF;
		END;
		RETURN NEXT;
	END LOOP;
END
$$;
COMMENT ON FUNCTION @extschema@.inbox_consume(text, text, bytea[], bytea[], bytea[], bytea[], bytea[]) IS
	'pg_outbox: applies a batch of entries (fields as bytes) through the inbox and a handler, each in its own subtransaction; returns applied, duplicate, conflict, malformed or failed per entry';

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
AS 'MODULE_PATHNAME', 'outbox_inbox_checked'
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
					  DETAIL = format('Entry %s of stream "%s" was gone from the stream: %s', d.entry_id, d.stream, d.reason),
					  HINT = 'Republish the event from the producer''s outbox (outbox_rewind) instead.';
		END IF;
		RAISE EXCEPTION 'dead letter % has no event to replay', dead_letter_id
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  DETAIL = format('Entry %s of stream "%s" could not be read: %s', d.entry_id, d.stream, d.reason),
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
	FOR g IN SELECT * FROM outbox.groups WHERE NOT stale ORDER BY name LOOP
		IF g.ordering = 'commit' THEN
			-- Passed when nothing is left to publish up to the partition's
			-- last commit.
			ahead := last_ticket >= g.cursor_ticket
					 AND EXISTS (SELECT 1 FROM outbox.commit_backlog(g.cursor_ticket, g.cursor_seq, NULL, last_ticket));
		ELSIF g.cursor_txid < upper THEN
			EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s WHERE (txid, seq) > ($1, $2))', part)
				INTO ahead USING g.cursor_txid, g.cursor_seq;
		ELSE
			ahead := false;
		END IF;
		IF ahead THEN
			holders := holders || format('"%s"', g.name);
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
AS 'MODULE_PATHNAME', 'outbox_try_maintenance_lock'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.try_maintenance_lock() IS 'pg_outbox: takes the maintenance lock for this transaction if free';

-- Runs everything maintenance does, once; idempotent. When another run
-- holds the maintenance lock it returns at once. Each step that takes a
-- lock does so with outbox.config.lock_timeout, in its own subtransaction:
-- one that cannot get its lock is reported as deferred and retried on the
-- next run, so emitters never wait on maintenance longer than that.
CREATE FUNCTION @extschema@.outbox_maintain()
RETURNS TABLE (action text, object text, detail text)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '200ms'
SET enable_sort = off
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
BEGIN
	IF NOT outbox.try_maintenance_lock() THEN
		action := 'skipped'; detail := 'another maintenance run is in progress';
		RETURN NEXT;
		RETURN;
	END IF;
	SELECT * INTO cfg FROM outbox.config;
	PERFORM set_config('lock_timeout', (extract(epoch FROM cfg.lock_timeout) * 1000)::int || 'ms', true);
	UPDATE outbox.maintenance SET last_started_at = clock_timestamp();

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

	-- 3. Retention: a partition leaves when every live group has passed all
	-- of it and its last event is older than the retention.
	FOR b IN SELECT * FROM outbox.partition_bounds() p WHERE p.upper <= outbox.horizon() ORDER BY p.lower LOOP
		CONTINUE WHEN outbox.retire_blocker(b.relid, b.lower, b.upper) IS NOT NULL;
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

	-- 5. Groups that lag: reported, never skipped.
	FOR g IN SELECT s.group_name, s.oldest_waiting_age
			   FROM @extschema@.outbox_group_stats() s
			  WHERE NOT s.stale AND s.oldest_waiting_age > cfg.max_group_lag
	LOOP
		RAISE WARNING 'pg_outbox: group "%" lags: its oldest waiting event is % old', g.group_name, g.oldest_waiting_age
			USING HINT = 'Its events are kept until it passes them. Start its relay, or mark it stale with outbox_group_set_stale() so that it stops keeping storage.';
		action := 'lagging'; object := g.group_name; detail := format('oldest waiting event is %s old', g.oldest_waiting_age);
		RETURN NEXT;
	END LOOP;

	UPDATE outbox.maintenance SET last_finished_at = clock_timestamp();
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
	UPDATE outbox.groups SET stale = outbox_group_set_stale.stale WHERE id = (outbox.get_group(group_name)).id;
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

-- One row per group (or for one group only, for_group): cursor, leader
-- (its pid while its session runs, the age of its lease, the fencing
-- generation), backlog and why it may be held. The transaction holding the horizon holds
-- xid8-ordered groups only; commit-ordered groups wait for nothing but
-- commits in progress. Counting a backlog reads it: O(backlog).
CREATE FUNCTION @extschema@.outbox_group_stats(for_group text DEFAULT NULL)
RETURNS TABLE (group_name text, topics text[], cursor_position text, leader_pid integer,
			   waiting bigint, oldest_waiting_age interval, advanced_at timestamptz,
			   horizon xid8, held_by_pid integer, held_by_gid text, held_for interval, stale boolean,
			   ordering text, commit_horizon bigint, lease_age interval, generation bigint)
LANGUAGE sql VOLATILE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- The estimates of the per-group backlog are high enough to trigger JIT
-- compilation, which costs far more than the query.
SET jit = off
AS $$
	WITH ch AS MATERIALIZED (
		SELECT CASE WHEN EXISTS (SELECT 1 FROM outbox.groups WHERE ordering = 'commit')
						 AND outbox.commit_order_available()
					THEN outbox.commit_horizon() END AS h)
	SELECT g.name, g.topics, g.cursor,
		   CASE WHEN lh.alive THEN g.leader_pid END,
		   w.n, now() - w.oldest, g.advanced_at,
		   CASE WHEN g.ordering = 'xid8' THEN outbox.horizon() END, hh.pid, hh.gid, hh.held_for, g.stale,
		   g.ordering, CASE WHEN g.ordering = 'commit' THEN ch.h END,
		   CASE WHEN lh.alive THEN greatest(clock_timestamp() - g.lease_renewed, interval '0') END, g.generation
	  FROM outbox.groups g
	 CROSS JOIN ch
	 CROSS JOIN LATERAL (SELECT coalesce(outbox.session_alive(g.leader_pid, g.leader_started), false) AS alive) lh
	 CROSS JOIN LATERAL (
		SELECT count(*) AS n, min(e.created_at) AS oldest
		  FROM (SELECT b.created_at FROM outbox.backlog(g.cursor_txid, g.cursor_seq, g.topics) b
				 WHERE g.ordering = 'xid8'
				UNION ALL
				SELECT c.created_at FROM outbox.commit_backlog(g.cursor_ticket, g.cursor_seq, g.topics, ch.h) c
				 WHERE g.ordering = 'commit') e) w
	  LEFT JOIN LATERAL (
		SELECT h.pid, h.gid, h.held_for FROM outbox.horizon_holders_all() h
		 WHERE h.holds_horizon AND g.ordering = 'xid8' LIMIT 1) hh ON true
	 WHERE for_group IS NULL OR g.name = for_group
	 ORDER BY g.name
$$;
COMMENT ON FUNCTION @extschema@.outbox_group_stats(text) IS
	'pg_outbox: per group (or for one): cursor, leader and its lease, events waiting, age of the oldest, last advance, and who holds the horizon';

CREATE VIEW outbox.group_stats AS SELECT * FROM @extschema@.outbox_group_stats();
COMMENT ON VIEW outbox.group_stats IS 'pg_outbox: per-group statistics (see outbox_group_stats())';
CREATE VIEW outbox.horizon_holders AS SELECT * FROM @extschema@.outbox_horizon_holders();
COMMENT ON VIEW outbox.horizon_holders IS 'pg_outbox: who holds the feed horizon (see outbox_horizon_holders())';

--
-- Privileges: nothing for PUBLIC; writers emit, relays read the feed and
-- move cursors, admins manage groups and see everything.
--
REVOKE ALL ON ALL TABLES IN SCHEMA outbox FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA outbox FROM PUBLIC;
REVOKE ALL ON FUNCTION
	@extschema@.outbox_emit(text, text, jsonb, jsonb, uuid),
	@extschema@.outbox_emit_many(text, text[], jsonb[], jsonb[], uuid[]),
	@extschema@.outbox_group_create(text, text[], text, text),
	@extschema@.outbox_group_drop(text, boolean),
	@extschema@.outbox_fetch(text, integer, text, interval),
	@extschema@.outbox_advance(text, text, jsonb),
	@extschema@.outbox_lead(text),
	@extschema@.outbox_resign(text),
	@extschema@.outbox_relay_waiting(),
	@extschema@.outbox_rewind(text, text),
	@extschema@.outbox_reanchor(text),
	@extschema@.outbox_horizon_holders(),
	@extschema@.outbox_group_stats(text),
	@extschema@.inbox_apply(text, uuid, jsonb),
	@extschema@.inbox_dead_letter(text, text, text, uuid, text, text, jsonb, jsonb, text, text, integer),
	@extschema@.inbox_dead_letter(text, text, text, bytea[], text, text, integer),
	@extschema@.inbox_consume(text, text, bytea[], bytea[], bytea[], bytea[], bytea[]),
	@extschema@.inbox_replay(bigint, text),
	@extschema@.inbox_consumer_check(text),
	@extschema@.inbox_consumer_create(text, regrole),
	@extschema@.inbox_consumer_set_owner(text, regrole),
	@extschema@.inbox_consumer_drop(text, boolean),
	@extschema@.inbox_consumers(),
	@extschema@.outbox_maintain(),
	@extschema@.outbox_group_set_stale(text, boolean),
	@extschema@.outbox_drop_empty_partitions(),
	@extschema@.outbox_partitions()
FROM PUBLIC;

GRANT USAGE ON SCHEMA outbox TO outbox_writer, outbox_relay, outbox_consumer, outbox_admin;

GRANT EXECUTE ON FUNCTION
	@extschema@.outbox_emit(text, text, jsonb, jsonb, uuid),
	@extschema@.outbox_emit_many(text, text[], jsonb[], jsonb[], uuid[])
TO outbox_writer, outbox_admin;

GRANT EXECUTE ON FUNCTION
	@extschema@.outbox_fetch(text, integer, text, interval),
	@extschema@.outbox_advance(text, text, jsonb),
	@extschema@.outbox_lead(text),
	@extschema@.outbox_resign(text),
	@extschema@.outbox_relay_waiting(),
	@extschema@.outbox_rewind(text, text),
	@extschema@.outbox_reanchor(text),
	@extschema@.outbox_horizon_holders(),
	@extschema@.outbox_group_stats(text)
TO outbox_relay, outbox_admin;
GRANT EXECUTE ON FUNCTION outbox.horizon(), outbox.commit_horizon(), outbox.horizon_holders_all()
TO outbox_relay, outbox_admin;
GRANT EXECUTE ON FUNCTION
	@extschema@.outbox_maintain(),
	@extschema@.outbox_partitions()
TO outbox_relay, outbox_admin;
GRANT EXECUTE ON FUNCTION
	@extschema@.outbox_group_set_stale(text, boolean),
	@extschema@.outbox_drop_empty_partitions()
TO outbox_admin;
GRANT SELECT ON outbox.maintenance TO outbox_relay, outbox_admin;
GRANT SELECT ON outbox.feed, outbox.groups, outbox.group_stats, outbox.horizon_holders TO outbox_relay, outbox_admin;

GRANT EXECUTE ON FUNCTION
	@extschema@.outbox_group_create(text, text[], text, text),
	@extschema@.outbox_group_drop(text, boolean)
TO outbox_admin;
GRANT SELECT ON outbox.event, outbox.commit_log, outbox.config, outbox.inbox, outbox.dead_letters,
	outbox.consumers TO outbox_admin;

-- Consumers act only for the consumers their roles own: each of these
-- checks the consumer before it touches the inbox (extension/inbox.c).
-- The *_unchecked bodies, outbox.inbox_applied() and
-- outbox.dead_letter_record() are granted to nobody.
GRANT EXECUTE ON FUNCTION
	@extschema@.inbox_apply(text, uuid, jsonb),
	@extschema@.inbox_dead_letter(text, text, text, uuid, text, text, jsonb, jsonb, text, text, integer),
	@extschema@.inbox_dead_letter(text, text, text, bytea[], text, text, integer),
	@extschema@.inbox_consume(text, text, bytea[], bytea[], bytea[], bytea[], bytea[]),
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
GRANT UPDATE ON outbox.config TO outbox_admin;

--
-- Maintenance of this database starts as soon as the install commits
-- (when pg_outbox is preloaded; see worker.c).
--
CREATE FUNCTION outbox.maintenance_wake()
RETURNS boolean
AS 'MODULE_PATHNAME', 'outbox_maintenance_wake'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.maintenance_wake() IS
	'pg_outbox: has the maintenance launcher look at every database once this transaction commits (when preloaded)';
REVOKE ALL ON FUNCTION outbox.maintenance_wake() FROM PUBLIC;
SELECT outbox.maintenance_wake();
