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

-- @engine fetch@

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

-- @engine advance@

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
-- cursor. The body of outbox_reanchor(), which outbox_import_state() runs
-- too (a function running as the owner calls none by the extension's
-- schema); granted to nobody.
CREATE FUNCTION outbox.reanchor(group_name text)
RETURNS text
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
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
COMMENT ON FUNCTION outbox.reanchor(text) IS
	'pg_outbox: body of outbox_reanchor(); granted to nobody';

CREATE FUNCTION @extschema@.outbox_reanchor(group_name text)
RETURNS text
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	RETURN outbox.reanchor(group_name);
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
	outbox.reanchor(text),
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
