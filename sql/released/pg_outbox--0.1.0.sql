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
	cursor text GENERATED ALWAYS AS (coalesce(cursor_txid::text, cursor_ticket::text) || '-' || cursor_seq) STORED,
	created_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
	advanced_at timestamptz,
	streams jsonb NOT NULL DEFAULT '{}',
	stale boolean NOT NULL DEFAULT false,
	CONSTRAINT groups_pkey PRIMARY KEY (id),
	CONSTRAINT groups_name_key UNIQUE (name),
	CONSTRAINT groups_name_check CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$'),
	CONSTRAINT groups_topics_check CHECK (topics IS NULL OR pg_catalog.cardinality(topics) > 0),
	CONSTRAINT groups_ordering_check CHECK (ordering IN ('xid8', 'commit')),
	CONSTRAINT groups_cursor_check CHECK (CASE ordering WHEN 'xid8' THEN cursor_txid IS NOT NULL AND cursor_ticket IS NULL
														 ELSE cursor_ticket IS NOT NULL AND cursor_txid IS NULL END)
);
COMMENT ON TABLE outbox.groups IS 'pg_outbox groups: one cursor over the feed each';
COMMENT ON COLUMN outbox.groups.ordering IS 'xid8: feed order of transaction ids; commit: order in which the transactions committed (needs preloading)';
COMMENT ON COLUMN outbox.groups.cursor IS 'the cursor as a position: "<txid>-<seq>" (xid8 order) or "<ticket>-<seq>" (commit order)';
COMMENT ON COLUMN outbox.groups.stale IS 'a stale group no longer keeps events from retention (outbox_group_set_stale)';
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
-- Leadership (C): a session-level advisory lock per group, so that a relay
-- leads without holding a transaction open across its broker round trip.
--
CREATE FUNCTION outbox.lead(group_id integer)
RETURNS boolean
AS 'MODULE_PATHNAME', 'outbox_lead'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.lead(integer) IS 'pg_outbox: takes the leadership of a group for this session if free; true when held';

CREATE FUNCTION outbox.is_leader(group_id integer)
RETURNS boolean
AS 'MODULE_PATHNAME', 'outbox_is_leader'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.is_leader(integer) IS 'pg_outbox: true when this session leads the group';

CREATE FUNCTION outbox.resign(group_id integer)
RETURNS boolean
AS 'MODULE_PATHNAME', 'outbox_resign'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.resign(integer) IS 'pg_outbox: gives up the leadership of a group; true when it was held';

CREATE FUNCTION outbox.lock_class()
RETURNS oid
AS 'MODULE_PATHNAME', 'outbox_lock_class'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION outbox.lock_class() IS 'pg_outbox: advisory lock classid of group leadership locks (pg_locks.classid)';

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
			   cursor_seq bigint, topics text[], horizon bigint, row_limit integer, below xid8)
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
	IF NOT outbox.lead(g.id) THEN
		RETURN;
	END IF;
	IF g.ordering = 'commit' THEN
		PERFORM outbox.check_commit_read();
		horizon := outbox.commit_horizon();
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
					  HINT = format('Re-anchor the group with outbox_rewind(%L, ''now'') or outbox_rewind(%L, ''beginning'').',
									group_name, group_name);
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
	new_txid xid8;
	new_ticket bigint;
	behind boolean;
	horizon bigint;
BEGIN
	SELECT * INTO p FROM outbox.parse_position(pos);
	g := outbox.get_group(group_name, true);
	IF NOT outbox.is_leader(g.id) THEN
		RAISE EXCEPTION 'this session does not lead group "%"', group_name
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  HINT = 'Only the session that fetched the batch with outbox_fetch() may advance the cursor.';
	END IF;
	IF streams IS NOT NULL AND jsonb_typeof(streams) <> 'object' THEN
		RAISE EXCEPTION 'streams must be a JSON object of stream names and positions'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	-- The position in the group's order: (ticket, seq) or (txid, seq).
	IF g.ordering = 'commit' THEN
		new_ticket := (outbox.parse_commit_position(pos)).ticket;
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
-- broker lost entries), to 'now' or to 'beginning'.
CREATE FUNCTION @extschema@.outbox_rewind(group_name text, pos text)
RETURNS text
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	g outbox.groups;
	new_txid xid8;
	new_ticket bigint;
	new_seq bigint := 0;
	new_position text;
BEGIN
	g := outbox.get_group(group_name, true);
	IF g.ordering = 'commit' THEN
		IF pos = 'now' THEN
			new_ticket := outbox.commit_horizon() + 1;
		ELSIF pos = 'beginning' THEN
			new_ticket := 0;
		ELSE
			SELECT p.ticket, p.seq INTO new_ticket, new_seq FROM outbox.parse_commit_position(pos) p;
		END IF;
	ELSIF pos = 'now' THEN
		new_txid := outbox.horizon();
	ELSIF pos = 'beginning' THEN
		new_txid := '0'::xid8;
	ELSE
		SELECT p.txid, p.seq INTO new_txid, new_seq FROM outbox.parse_position(pos) p;
	END IF;
	UPDATE outbox.groups
	   SET cursor_txid = new_txid, cursor_ticket = new_ticket, cursor_seq = new_seq, advanced_at = now()
	 WHERE id = g.id
	RETURNING cursor INTO new_position;
	RAISE LOG 'pg_outbox: cursor of group "%" moved from % to %', group_name, g.cursor, new_position;
	RETURN new_position;
END
$$;
COMMENT ON FUNCTION @extschema@.outbox_rewind(text, text) IS
	'pg_outbox: moves the group''s cursor to a position, ''now'' or ''beginning''; returns the new position';

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

-- Creates the daily inbox partitions from today to three days ahead, each
-- with its (consumer, event_id) unique index. Returns how many it created.
CREATE FUNCTION outbox.inbox_premake_partitions()
RETURNS integer
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	day date;
	part name;
	created integer := 0;
BEGIN
	FOR i IN 0 .. 3 LOOP
		day := (now() AT TIME ZONE 'UTC')::date + i;
		part := format('inbox_%s', to_char(day, 'YYYYMMDD'));
		IF NOT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
						WHERE n.nspname = 'outbox' AND c.relname = part) THEN
			EXECUTE format('CREATE TABLE outbox.%I PARTITION OF outbox.inbox FOR VALUES FROM (%L) TO (%L)',
						   part, day::timestamp AT TIME ZONE 'UTC', (day + 1)::timestamp AT TIME ZONE 'UTC');
			EXECUTE format('CREATE UNIQUE INDEX %I ON outbox.%I (consumer, event_id)',
						   part || '_consumer_event_id_key', part);
			created := created + 1;
		END IF;
	END LOOP;
	RETURN created;
END
$$;
COMMENT ON FUNCTION outbox.inbox_premake_partitions() IS 'pg_outbox: creates the inbox partitions from today to three days ahead';
SELECT outbox.inbox_premake_partitions();

-- Drops the inbox partitions that end before now() - inbox_retention.
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
		SELECT c.relname
		  FROM pg_inherits i
		  JOIN pg_class c ON c.oid = i.inhrelid
		 WHERE i.inhparent = 'outbox.inbox'::regclass
		   AND c.relname ~ '^inbox_[0-9]{8}$'
		   AND to_date(substr(c.relname, 7), 'YYYYMMDD') + 1
			   <= ((now() - (SELECT inbox_retention FROM outbox.config)) AT TIME ZONE 'UTC')::date
		 ORDER BY c.relname
	LOOP
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

-- Applies an event for a consumer, once: true the first time (the caller
-- applies its effect in the same transaction), false for a redelivery with
-- an equal payload; the same id with another payload is an identity
-- conflict, SQLSTATE OB001.
CREATE FUNCTION @extschema@.inbox_apply(consumer text, event_id uuid, payload jsonb)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	applied jsonb;
BEGIN
	IF consumer IS NULL OR event_id IS NULL OR payload IS NULL THEN
		RAISE EXCEPTION '% must not be null',
			CASE WHEN consumer IS NULL THEN 'consumer' WHEN event_id IS NULL THEN 'event_id' ELSE 'payload' END
			USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF consumer = '' THEN
		RAISE EXCEPTION 'consumer must not be empty' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF octet_length(consumer) > 255 THEN
		RAISE EXCEPTION 'consumer name is too long'
			USING ERRCODE = 'program_limit_exceeded',
				  DETAIL = format('The name is %s bytes; the limit is 255 bytes.', octet_length(consumer));
	END IF;
	PERFORM outbox.inbox_lock(hashtextextended(consumer || '/' || event_id::text, 0));
	SELECT i.payload INTO applied FROM outbox.inbox i
	 WHERE i.consumer = inbox_apply.consumer AND i.event_id = inbox_apply.event_id;
	IF FOUND THEN
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
SELECT pg_catalog.pg_extension_config_dump('outbox.dead_letters', '');

-- Records (or updates) a dead letter; returns its id.
CREATE FUNCTION @extschema@.inbox_dead_letter(consumer text, stream text, entry_id text, event_id uuid,
											  topic text, key text, payload jsonb, headers jsonb,
											  reason text, sqlstate text DEFAULT NULL, deliveries integer DEFAULT 1)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	dl_id bigint;
	applied jsonb;
BEGIN
	IF consumer IS NULL OR stream IS NULL OR entry_id IS NULL OR reason IS NULL THEN
		RAISE EXCEPTION 'consumer, stream, entry_id and reason must not be null'
			USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF event_id IS NOT NULL THEN
		SELECT i.payload INTO applied FROM outbox.inbox i
		 WHERE i.consumer = inbox_dead_letter.consumer AND i.event_id = inbox_dead_letter.event_id;
	END IF;
	INSERT INTO outbox.dead_letters AS d
		(consumer, event_id, stream, entry_id, topic, key, payload, applied_payload, headers, reason, sqlstate, deliveries)
	VALUES (consumer, event_id, stream, entry_id, topic, key, payload, applied, headers, reason, sqlstate,
			greatest(coalesce(deliveries, 1), 1))
	ON CONFLICT ON CONSTRAINT dead_letters_entry_key DO UPDATE
		SET reason = excluded.reason, sqlstate = excluded.sqlstate,
			deliveries = greatest(d.deliveries, excluded.deliveries), last_failed_at = now(),
			applied_payload = coalesce(excluded.applied_payload, d.applied_payload)
	RETURNING d.id INTO dl_id;
	RETURN dl_id;
END
$$;
COMMENT ON FUNCTION @extschema@.inbox_dead_letter(text, text, text, uuid, text, text, jsonb, jsonb, text, text, integer) IS
	'pg_outbox: records a stream entry a consumer gave up on, with the reason; returns the dead letter id';

-- Applies a batch of stream entries for a consumer, each in its own
-- subtransaction: inbox_apply(), then the handler when the event is new.
-- Event ids, payloads and headers come as text, as they were in the
-- stream, and are parsed per entry: a malformed one fails alone.
-- A failing entry rolls back alone. Runs as the caller, with the caller's
-- search_path, so the handler runs with the consumer's own privileges and
-- names; everything it calls itself is schema-qualified.
CREATE FUNCTION @extschema@.inbox_consume(consumer text, handler text, event_ids text[], topics text[],
										  keys text[], payloads text[], headers text[])
RETURNS TABLE (ord integer, status text, error_code text, error_message text)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
	n integer := coalesce(cardinality(payloads), 0);
	id uuid;
	body jsonb;
	meta jsonb;
	err_state text;
	err_message text;
	err_detail text;
BEGIN
	IF handler IS NULL OR handler = '' THEN
		RAISE EXCEPTION 'handler must not be empty' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF coalesce(cardinality(event_ids), 0) <> n OR coalesce(cardinality(topics), 0) <> n
	   OR coalesce(cardinality(keys), n) <> n OR coalesce(cardinality(headers), n) <> n THEN
		RAISE EXCEPTION 'the arrays of inbox_consume() must have the same length'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'keys and headers may also be NULL.';
	END IF;
	FOR i IN 1 .. n LOOP
		ord := i;
		error_code := NULL;
		error_message := NULL;
		BEGIN
			id := event_ids[i]::uuid;
			body := payloads[i]::jsonb;
			meta := headers[i]::jsonb;
			IF @extschema@.inbox_apply(consumer, id, body) THEN
				EXECUTE handler USING topics[i], keys[i], body, meta, id;
				status := 'applied';
			ELSE
				status := 'duplicate';
			END IF;
		EXCEPTION WHEN OTHERS THEN
			GET STACKED DIAGNOSTICS err_state = RETURNED_SQLSTATE, err_message = MESSAGE_TEXT,
									err_detail = PG_EXCEPTION_DETAIL;
			status := CASE WHEN err_state = 'OB001' THEN 'conflict' ELSE 'failed' END;
			error_code := err_state;
			error_message := err_message || CASE WHEN err_detail <> '' THEN ' (' || err_detail || ')' ELSE '' END;
		END;
		RETURN NEXT;
	END LOOP;
END
$$;
COMMENT ON FUNCTION @extschema@.inbox_consume(text, text, text[], text[], text[], text[], text[]) IS
	'pg_outbox: applies a batch of entries through the inbox and a handler, each in its own subtransaction; returns applied, duplicate, conflict or failed per entry';

-- Applies a dead letter again with its original event id (so the inbox
-- still dedupes it), through a handler, in the caller's transaction.
-- Returns 'applied' or 'duplicate'; an identity conflict raises OB001.
CREATE FUNCTION @extschema@.inbox_replay(dead_letter_id bigint, handler text)
RETURNS text
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
	d record;
	result text;
BEGIN
	IF dead_letter_id IS NULL OR handler IS NULL THEN
		RAISE EXCEPTION 'dead_letter_id and handler must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	SELECT * INTO d FROM outbox.dead_letters WHERE id = dead_letter_id FOR UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'dead letter % does not exist', dead_letter_id USING ERRCODE = 'undefined_object';
	END IF;
	IF d.event_id IS NULL OR d.payload IS NULL THEN
		RAISE EXCEPTION 'dead letter % has no event to replay', dead_letter_id
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  DETAIL = format('Entry %s of stream "%s" was gone from the stream: %s', d.entry_id, d.stream, d.reason),
				  HINT = 'Republish the event from the producer''s outbox (outbox_rewind) instead.';
	END IF;
	IF @extschema@.inbox_apply(d.consumer, d.event_id, d.payload) THEN
		EXECUTE handler USING d.topic, d.key, d.payload, d.headers, d.event_id;
		result := 'applied';
	ELSE
		result := 'duplicate';
	END IF;
	UPDATE outbox.dead_letters SET replayed_at = now() WHERE id = dead_letter_id;
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
	CONSTRAINT maintenance_pkey PRIMARY KEY (only_row),
	CONSTRAINT maintenance_only_row CHECK (only_row)
);
COMMENT ON TABLE outbox.maintenance IS 'pg_outbox: when maintenance last ran, and what it did';
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
			EXECUTE format('ALTER TABLE outbox.event DETACH PARTITION %s', b.relid);
			markers := to_regclass(format('outbox.%I', outbox.commit_partition_name(b.lower)));
			IF markers IS NOT NULL THEN
				EXECUTE format('ALTER TABLE outbox.commit_log DETACH PARTITION %s', markers);
			END IF;
			IF cfg.retire_mode = 'drop' THEN
				EXECUTE format('DROP TABLE %s', b.relid);
				IF markers IS NOT NULL THEN
					EXECUTE format('DROP TABLE %s', markers);
				END IF;
				action := 'dropped';
			ELSE
				-- Kept for inspection, and dropped with the extension.
				EXECUTE format('ALTER TABLE %s RENAME TO %I', b.relid, b.name || '_detached');
				EXECUTE format('ALTER EXTENSION pg_outbox ADD TABLE outbox.%I', b.name || '_detached');
				IF markers IS NOT NULL THEN
					EXECUTE format('ALTER TABLE %s RENAME TO %I', markers, outbox.commit_partition_name(b.lower) || '_detached');
					EXECUTE format('ALTER EXTENSION pg_outbox ADD TABLE outbox.%I', outbox.commit_partition_name(b.lower) || '_detached');
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
			IF EXISTS (SELECT 1 FROM pg_depend d
						WHERE d.classid = 'pg_class'::regclass AND d.objid = part AND d.deptype = 'e') THEN
				EXECUTE format('ALTER EXTENSION pg_outbox DROP TABLE %s', part);
			END IF;
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
-- first; the oldest one holds the feed horizon back.
CREATE FUNCTION @extschema@.outbox_horizon_holders()
RETURNS TABLE (holds_horizon boolean, pid integer, gid text, database name, username name,
			   state text, xid_age integer, xact_start timestamptz, held_for interval,
			   query text)
LANGUAGE sql STABLE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
	WITH h AS (
		SELECT (pg_snapshot_xmin(pg_current_snapshot())::text::numeric % 4294967296)::text::xid AS xmin32
	), holders AS (
		SELECT a.pid, NULL::text AS gid, a.datname, a.usename, a.state, a.backend_xid AS xid,
			   a.xact_start, a.query
		  FROM pg_stat_activity a
		 WHERE a.backend_xid IS NOT NULL
		   AND a.pid <> pg_backend_pid()
		UNION ALL
		SELECT NULL, p.gid, p.database, p.owner, 'prepared', p.transaction, p.prepared, NULL
		  FROM pg_prepared_xacts p
	)
	SELECT x.xid = h.xmin32, x.pid, x.gid, x.datname, x.usename, x.state, age(x.xid),
		   x.xact_start, now() - x.xact_start, x.query
	  FROM holders x, h
	 ORDER BY age(x.xid) DESC, x.pid
$$;
COMMENT ON FUNCTION @extschema@.outbox_horizon_holders() IS
	'pg_outbox: backends and prepared transactions holding a transaction id, oldest first; the oldest holds the feed horizon back';

-- One row per group (or for one group only, for_group): cursor, leader,
-- backlog and why it may be held. The transaction holding the horizon holds
-- xid8-ordered groups only; commit-ordered groups wait for nothing but
-- commits in progress. Counting a backlog reads it: O(backlog).
CREATE FUNCTION @extschema@.outbox_group_stats(for_group text DEFAULT NULL)
RETURNS TABLE (group_name text, topics text[], cursor_position text, leader_pid integer,
			   waiting bigint, oldest_waiting_age interval, advanced_at timestamptz,
			   horizon xid8, held_by_pid integer, held_by_gid text, held_for interval, stale boolean,
			   ordering text, commit_horizon bigint)
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
		   (SELECT l.pid FROM pg_locks l
			 WHERE l.locktype = 'advisory' AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
			   AND l.classid = outbox.lock_class() AND l.objid = g.id AND l.objsubid = 3 AND l.granted
			 LIMIT 1),
		   w.n, now() - w.oldest, g.advanced_at,
		   CASE WHEN g.ordering = 'xid8' THEN outbox.horizon() END, hh.pid, hh.gid, hh.held_for, g.stale,
		   g.ordering, CASE WHEN g.ordering = 'commit' THEN ch.h END
	  FROM outbox.groups g
	 CROSS JOIN ch
	 CROSS JOIN LATERAL (
		SELECT count(*) AS n, min(e.created_at) AS oldest
		  FROM (SELECT b.created_at FROM outbox.backlog(g.cursor_txid, g.cursor_seq, g.topics) b
				 WHERE g.ordering = 'xid8'
				UNION ALL
				SELECT c.created_at FROM outbox.commit_backlog(g.cursor_ticket, g.cursor_seq, g.topics, ch.h) c
				 WHERE g.ordering = 'commit') e) w
	  LEFT JOIN LATERAL (
		SELECT h.pid, h.gid, h.held_for FROM @extschema@.outbox_horizon_holders() h
		 WHERE h.holds_horizon AND g.ordering = 'xid8' LIMIT 1) hh ON true
	 WHERE for_group IS NULL OR g.name = for_group
	 ORDER BY g.name
$$;
COMMENT ON FUNCTION @extschema@.outbox_group_stats(text) IS
	'pg_outbox: per group (or for one): cursor, leader, events waiting, age of the oldest, last advance, and who holds the horizon';

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
	@extschema@.outbox_horizon_holders(),
	@extschema@.outbox_group_stats(text),
	@extschema@.inbox_apply(text, uuid, jsonb),
	@extschema@.inbox_dead_letter(text, text, text, uuid, text, text, jsonb, jsonb, text, text, integer),
	@extschema@.inbox_consume(text, text, text[], text[], text[], text[], text[]),
	@extschema@.inbox_replay(bigint, text),
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
	@extschema@.outbox_horizon_holders(),
	@extschema@.outbox_group_stats(text)
TO outbox_relay, outbox_admin;
GRANT EXECUTE ON FUNCTION outbox.horizon(), outbox.commit_horizon() TO outbox_relay, outbox_admin;
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
GRANT SELECT ON outbox.event, outbox.commit_log, outbox.config, outbox.inbox, outbox.dead_letters TO outbox_admin;

GRANT EXECUTE ON FUNCTION
	@extschema@.inbox_apply(text, uuid, jsonb),
	@extschema@.inbox_dead_letter(text, text, text, uuid, text, text, jsonb, jsonb, text, text, integer),
	@extschema@.inbox_consume(text, text, text[], text[], text[], text[], text[])
TO outbox_consumer, outbox_admin;

-- Replay runs as the caller and reads and marks the dead letter.
GRANT EXECUTE ON FUNCTION @extschema@.inbox_replay(bigint, text) TO outbox_admin;
GRANT UPDATE (replayed_at) ON outbox.dead_letters TO outbox_admin;
GRANT UPDATE ON outbox.config TO outbox_admin;
