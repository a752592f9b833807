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
-- @engine leases@

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
-- @engine group_names@

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
