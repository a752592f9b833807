-- Commit-ordered groups (pg_outbox in shared_preload_libraries).
SELECT outbox.commit_order_available();

-- New groups follow commit order when the library is preloaded.
SELECT outbox_group_create('c_default');
SELECT outbox_group_create('c_xid', ordering => 'xid8');
SELECT outbox_group_create('c_all', start_at => 'beginning', ordering => 'commit');
SELECT outbox_group_create('c_bad', ordering => 'commit time');
SELECT name, ordering, cursor_txid IS NULL AS no_txid, cursor_ticket IS NOT NULL AS has_ticket
  FROM outbox.groups ORDER BY name;

-- Events of one transaction keep their order; transactions follow commit
-- order; a position is "<ticket>-<seq>".
BEGIN;
SELECT count(*) FROM outbox_emit_many('t', NULL, ARRAY['1', '2', '3']::jsonb[]);
COMMIT;
SELECT count(*) FROM outbox_emit('t', NULL, '4');
SELECT count(*) FROM outbox_emit('u', NULL, '5');
SELECT payload, pos ~ '^[0-9]+-[1-3]$' AS pos_shape,
	   split_part(pos, '-', 1)::bigint = (SELECT ticket FROM outbox.commit_log m WHERE m.txid = f.txid) AS pos_is_ticket
  FROM outbox_fetch('c_all') f;

-- One marker per committed emitting transaction; none for rolled back ones.
BEGIN;
SELECT count(*) FROM outbox_emit('t', NULL, '"rolled back"');
ROLLBACK;
SELECT count(*) AS markers FROM outbox.commit_log;

-- Batches, "after" and advancing.
SELECT payload FROM outbox_fetch('c_all', 2);
SELECT outbox_advance('c_all', (SELECT pos FROM outbox_fetch('c_all', 2) OFFSET 1));
SELECT payload FROM outbox_fetch('c_all', 2);
SELECT payload FROM outbox_fetch('c_all', 10, (SELECT pos FROM outbox_fetch('c_all', 1)));
SELECT waiting, ordering, horizon IS NULL AS no_xid_horizon, commit_horizon IS NOT NULL AS has_commit_horizon
  FROM outbox_group_stats() WHERE group_name = 'c_all';

-- Refused: behind the cursor, beyond the commit horizon, malformed.
SELECT outbox_advance('c_all', '1-1');
SELECT outbox_advance('c_all', (outbox.commit_horizon() + 1)::text || '-1');
SELECT outbox_advance('c_all', '99999999999999999999-1');

-- Topics.
SELECT outbox_group_create('c_u', topics => ARRAY['u'], start_at => 'beginning', ordering => 'commit');
SELECT payload FROM outbox_fetch('c_u');

-- A batch is the head of the backlog as outbox.commit_backlog() defines
-- it, in commit order: after every position and the cursor, at several
-- batch sizes, with and without a topic filter. Returns the comparisons
-- made and how many differed.
SELECT outbox_group_create('c_head', start_at => 'now', ordering => 'commit');
SELECT outbox_group_create('c_head_u', topics => ARRAY['u'], start_at => 'now', ordering => 'commit');
BEGIN;
SELECT count(*) FROM outbox_emit_many('t', NULL, ARRAY['1', '2']::jsonb[]);
SELECT count(*) FROM outbox_emit_many('u', NULL, ARRAY['3', '4']::jsonb[]);
COMMIT;
SELECT count(*) FROM outbox_emit('u', NULL, '5');
SELECT count(*) FROM outbox_emit_many('t', NULL, ARRAY['6', '7', '8']::jsonb[]);
CREATE FUNCTION pg_temp.head_mismatches(g text, OUT compared int, OUT mismatched int)
LANGUAGE plpgsql AS $$
DECLARE
    gr outbox.groups;
    h bigint := outbox.commit_horizon();
    p record;
    n int;
BEGIN
    compared := 0;
    mismatched := 0;
    SELECT * INTO gr FROM outbox.groups WHERE name = g;
    FOR p IN SELECT NULL::bigint AS ticket, NULL::bigint AS seq
             UNION ALL
             (SELECT b.ticket, b.seq FROM outbox.commit_backlog(gr.cursor_ticket, gr.cursor_seq, NULL, h) b) LOOP
        FOREACH n IN ARRAY ARRAY[1, 2, 3, 1000] LOOP
            compared := compared + 1;
            IF ARRAY(SELECT f.pos FROM outbox_fetch(g, n, p.ticket || '-' || p.seq) f)
               IS DISTINCT FROM
               ARRAY(SELECT b.ticket || '-' || b.seq
                       FROM outbox.commit_backlog(coalesce(p.ticket, gr.cursor_ticket), coalesce(p.seq, gr.cursor_seq),
                                                  gr.topics, h) b
                      LIMIT n) THEN
                mismatched := mismatched + 1;
            END IF;
        END LOOP;
    END LOOP;
END
$$;
SELECT * FROM pg_temp.head_mismatches('c_head');
SELECT * FROM pg_temp.head_mismatches('c_head_u');
SELECT outbox_group_drop('c_head'), outbox_group_drop('c_head_u');

-- An empty batch waits for a commit that emitted, up to "wait" (the
-- relay tests wake it); at REPEATABLE READ every read would see the same
-- snapshot, and it returns at once.
SELECT outbox_group_create('c_wait', ordering => 'commit');
-- (A topic nothing emits: events of transactions still open below the
-- horizon when the group is created, such as a background maintenance
-- run's, would otherwise make the batch not empty.)
SELECT outbox_group_create('c_wait_x', ARRAY['nothing emits this'], ordering => 'xid8');
-- (A fetch that takes the leadership writes, and so does not wait: lead first.)
SELECT outbox_lead('c_wait');
SELECT clock_timestamp() AS t0 \gset
SELECT count(*) FROM outbox_fetch('c_wait', 10, NULL, '200 ms');
SELECT clock_timestamp() - :'t0' >= '150 ms' AS waited;
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT clock_timestamp() AS t0 \gset
SELECT count(*) FROM outbox_fetch('c_wait_x', 10, NULL, '10 s');
SELECT clock_timestamp() - :'t0' < '8 s' AS returned_at_once;
COMMIT;
SELECT outbox_group_drop('c_wait'), outbox_group_drop('c_wait_x');

-- 'now' starts after everything committed so far.
SELECT outbox_group_create('c_now', ordering => 'commit');
SELECT count(*) FROM outbox_fetch('c_now');
SELECT count(*) FROM outbox_emit('t', NULL, '6');
SELECT payload FROM outbox_fetch('c_now');

-- Rewind: to the beginning, to a position, to now.
SELECT outbox_rewind('c_now', 'beginning') ~ '^0-0$' AS at_beginning;
SELECT count(*) FROM outbox_fetch('c_now');
SELECT outbox_rewind('c_now', 'now') IS NOT NULL AS rewound;
SELECT count(*) FROM outbox_fetch('c_now');

CREATE FUNCTION pg_temp.try(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN sqlstate || ': ' || sqlerrm;
END
$$;
-- A commit position ahead of the commit horizon is refused: tickets not
-- issued yet would be skipped, and a ticket near the end of bigint would
-- make the counter overflow when it starts after a restart.
SELECT pg_temp.try($$SELECT outbox_rewind('c_now', '9223372036854775000-0')$$);
SELECT pg_temp.try($$SELECT outbox_rewind('c_now', '9223372036854775808-0')$$);
SELECT regexp_replace(pg_temp.try(format($$SELECT outbox_rewind('c_now', '%s-0')$$, outbox.commit_horizon() + 2)), '[0-9]+-', 'N-', 'g');
SELECT regexp_replace(pg_temp.try(format($$SELECT outbox_rewind('c_now', '%s-1')$$, outbox.commit_horizon() + 1)), '[0-9]+-', 'N-', 'g');
SELECT outbox_rewind('c_now', (outbox.commit_horizon() + 1) || '-0') IS NOT NULL AS at_horizon_ok;
SELECT regexp_replace(pg_temp.try(format($$SELECT outbox_advance('c_now', '%s-0')$$, outbox.commit_horizon() + 5)), '[0-9]+-', 'N-', 'g');
-- A stored cursor ahead of the counter (written around the functions) is
-- reported, never read past.
UPDATE outbox.groups SET cursor_ticket = 9223372036854775000 WHERE name = 'c_now';
SELECT pg_temp.try($$SELECT * FROM outbox_fetch('c_now')$$);
SELECT outbox_rewind('c_now', 'now') IS NOT NULL AS reanchored;
SELECT count(*) FROM outbox_fetch('c_now');

-- Read at READ COMMITTED only: an older snapshot could miss commits below
-- the horizon.
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT count(*) FROM outbox_fetch('c_all');
ROLLBACK;

-- The batch plan reads markers in ticket order and each transaction's
-- events in seq order, with no sort (that would read whole transactions).
SET enable_sort = off;
SET enable_seqscan = off;
SET enable_bitmapscan = off;
CREATE FUNCTION pg_temp.plan_lines(below xid8 DEFAULT NULL) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
	l text;
BEGIN
	FOR l IN EXECUTE format('EXPLAIN (COSTS OFF) SELECT * FROM outbox.commit_backlog(0, 0, NULL, 100, %L) LIMIT 10', below) LOOP
		RETURN NEXT l;
	END LOOP;
END
$$;
SELECT count(*) FILTER (WHERE l ~ '(^|->)\s*(Incremental )?Sort$') AS sorts,
	   count(*) FILTER (WHERE l ~ 'Nested Loop') AS nested_loops,
	   count(*) FILTER (WHERE l ~ 'Sort Key: c\.ticket$') AS markers_by_ticket,
	   count(*) FILTER (WHERE l ~ 'Sort Key: v\.seq$') AS events_by_seq
  FROM pg_temp.plan_lines() l;
-- With a bound on transaction ids (outbox_fetch passes the next one, read
-- after the horizon) the partitions beyond it, of markers and of events,
-- are not planned at all.
SELECT (SELECT count(*) FROM pg_temp.plan_lines() l WHERE l ~ ' on (commit_log|event)_') >
       (SELECT count(*) FROM pg_temp.plan_lines(pg_snapshot_xmax(pg_current_snapshot())) l
         WHERE l ~ ' on (commit_log|event)_') AS fewer_partitions,
       (SELECT count(*) FILTER (WHERE l ~ '(^|->)\s*(Incremental )?Sort$') = 0 AND count(*) FILTER (WHERE l ~ 'Nested Loop') = 1
          FROM pg_temp.plan_lines(pg_snapshot_xmax(pg_current_snapshot())) l) AS no_sort_one_loop;
RESET enable_sort;
RESET enable_seqscan;
RESET enable_bitmapscan;

-- An emitting transaction cannot be prepared while a commit-ordered group
-- exists: COMMIT PREPARED could not order it.
BEGIN;
SELECT count(*) FROM outbox_emit('t', NULL, '"prepared"');
PREPARE TRANSACTION 'commit_order_p1';
SELECT count(*) FROM pg_prepared_xacts WHERE gid = 'commit_order_p1';

-- Without commit-ordered groups it can.
SELECT outbox_group_drop(name) FROM outbox.groups WHERE ordering = 'commit' ORDER BY name;
BEGIN;
SELECT count(*) FROM outbox_emit('t', NULL, '"prepared"');
PREPARE TRANSACTION 'commit_order_p2';
ROLLBACK PREPARED 'commit_order_p2';

-- Maintenance knows both tables.
SELECT count(*) AS deferred FROM outbox_maintain() WHERE action = 'deferred';
SELECT count(*) = (SELECT count(*) FROM outbox.partition_bounds()) AS marker_partitions
  FROM pg_inherits WHERE inhparent = 'outbox.commit_log'::regclass
   AND inhrelid <> 'outbox.commit_log_default'::regclass;

SELECT outbox_group_drop('c_xid');
