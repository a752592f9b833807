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
