-- The xid8-ordered feed: fetch after the cursor, advance, rewind.
\set VERBOSITY terse
SET client_min_messages = warning;

CREATE FUNCTION pg_temp.try(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    -- transaction ids differ from run to run
    RETURN sqlstate || ': ' || regexp_replace(sqlerrm, '[0-9]+-[0-9]+', 'N-N', 'g');
END
$$;

TRUNCATE outbox.event;
SELECT outbox_group_create('all', ordering => 'xid8');
SELECT outbox_group_create('payments-only', ARRAY['payments'], ordering => 'xid8');

-- Three transactions, one aborted.
BEGIN;
SELECT outbox_emit('orders', 'o1', '{"n": 1}') IS NOT NULL AS emitted;
SELECT outbox_emit('payments', 'p1', '{"n": 2}') IS NOT NULL AS emitted;
COMMIT;
BEGIN;
SELECT outbox_emit('orders', 'o2', '{"n": 3}') IS NOT NULL AS emitted;
ROLLBACK;
BEGIN;
SELECT outbox_emit('orders', 'o3', '{"n": 4}') IS NOT NULL AS emitted;
SELECT outbox_emit('payments', 'p2', '{"n": 5}') IS NOT NULL AS emitted;
COMMIT;

-- The feed view: committed events below the horizon, in order.
SELECT topic, key, payload FROM outbox.feed;

-- The relay's batch: position is "<txid>-<seq>", the stream entry id.
CREATE TEMP TABLE batch AS SELECT * FROM outbox_fetch('all', 2);
SELECT pos = txid::text || '-' || seq AS pos_ok, topic, key, payload FROM batch;

-- Fetching again without advancing returns the same batch.
SELECT count(*) AS same FROM outbox_fetch('all', 2) f JOIN batch b USING (pos);

-- Advance to the last published position, then the rest follows.
SELECT outbox_advance('all', (SELECT pos FROM batch ORDER BY txid DESC, seq DESC LIMIT 1));
SELECT topic, key FROM outbox_fetch('all', 100);
SELECT outbox_advance('all', (SELECT pos FROM outbox_fetch('all', 100) ORDER BY txid DESC, seq DESC LIMIT 1));
SELECT count(*) AS left_over FROM outbox_fetch('all', 100);

-- Advancing to the same position again is a no-op; backwards is refused.
SELECT outbox_advance('all', (SELECT cursor_txid || '-' || cursor_seq FROM outbox.groups WHERE name = 'all'));
SELECT pg_temp.try(format($$SELECT outbox_advance('all', %L)$$, (SELECT pos FROM batch ORDER BY txid, seq LIMIT 1)));

-- A topic-filtered group sees only its topics.
SELECT topic, key FROM outbox_fetch('payments-only', 100);

-- Position syntax and range.
SELECT pg_temp.try($$SELECT outbox_advance('all', NULL)$$);
SELECT pg_temp.try($$SELECT outbox_advance('all', 'abc')$$);
SELECT pg_temp.try($$SELECT outbox_advance('all', '12')$$);
SELECT pg_temp.try($$SELECT outbox_advance('all', '-1-2')$$);
SELECT pg_temp.try($$SELECT outbox_advance('all', '1-99999999999999999999')$$);
SELECT pg_temp.try($$SELECT outbox_advance('all', '99999999999999999999-1')$$);

-- Beyond the horizon: transactions from the horizon on may still run.
SELECT pg_temp.try(format($$SELECT outbox_advance('all', '%s-0')$$, pg_current_xact_id()::text::numeric + 10));
SELECT pg_temp.try($$SELECT outbox_advance('all', '18446744073709551615-1')$$);

-- Batch size limits.
SELECT pg_temp.try($$SELECT * FROM outbox_fetch('all', 0)$$);
SELECT pg_temp.try($$SELECT * FROM outbox_fetch('all', 100001)$$);
SELECT pg_temp.try($$SELECT * FROM outbox_fetch('all', NULL)$$);
SELECT pg_temp.try($$SELECT * FROM outbox_fetch(NULL)$$);

-- Only the leader advances: after resigning, advancing is refused until
-- the next fetch takes the leadership again.
SELECT outbox.resign(id) FROM outbox.groups WHERE name = 'all';
SELECT pg_temp.try($$SELECT outbox_advance('all', (SELECT cursor_txid || '-' || cursor_seq FROM outbox.groups WHERE name = 'all'))$$);
SELECT count(*) FROM outbox_fetch('all', 1);
SELECT outbox.is_leader(id) FROM outbox.groups WHERE name = 'all';

-- The same through the relay's calls.
SELECT outbox_resign('all') AS was_leader, outbox_resign('all') AS still_leader;
SELECT outbox_lead('all') AS leads, outbox_lead('all') AS still_leads;
SELECT pg_temp.try($$SELECT outbox_lead('nope')$$);

-- The relay records the last position it published to each stream.
SELECT outbox_advance('all', (SELECT cursor_txid || '-' || cursor_seq FROM outbox.groups WHERE name = 'all'),
                      '{"outbox:orders": "1-1", "outbox:payments": "1-2"}');
SELECT outbox_advance('all', (SELECT cursor_txid || '-' || cursor_seq FROM outbox.groups WHERE name = 'all'),
                      '{"outbox:orders": "1-3"}');
SELECT streams FROM outbox.groups WHERE name = 'all';
SELECT pg_temp.try($$SELECT outbox_advance('all', (SELECT cursor_txid || '-' || cursor_seq FROM outbox.groups WHERE name = 'all'), '[1]')$$);
-- Each stream maps to a position, as a string.
SELECT pg_temp.try($$SELECT outbox_advance('all', (SELECT cursor FROM outbox.groups WHERE name = 'all'), '{"s": 5}')$$);
SELECT pg_temp.try($$SELECT outbox_advance('all', (SELECT cursor FROM outbox.groups WHERE name = 'all'), '{"s": "5"}')$$);
SELECT pg_temp.try($$SELECT outbox_advance('all', (SELECT cursor FROM outbox.groups WHERE name = 'all'), '{"s": null}')$$);
SELECT pg_temp.try($$SELECT outbox_advance('all', (SELECT cursor FROM outbox.groups WHERE name = 'all'), '{"s": {"a": "1-1"}}')$$);
SELECT pg_temp.try($$SELECT outbox_advance('all', (SELECT cursor FROM outbox.groups WHERE name = 'all'), '{"s": "1-1\n"}')$$);
SELECT pg_temp.try($$SELECT outbox_advance('all', (SELECT cursor FROM outbox.groups WHERE name = 'all'), '{"ok": "1-1", "s\"x": "1-x"}')$$);
SELECT streams FROM outbox.groups WHERE name = 'all';

-- Rewind: back to the beginning replays everything retained.
SELECT outbox_rewind('all', 'beginning');
SELECT topic, key FROM outbox_fetch('all', 100);
SELECT outbox_rewind('all', 'now') = (outbox.horizon()::text || '-0') AS at_horizon;
SELECT count(*) FROM outbox_fetch('all', 100);
SELECT pg_temp.try($$SELECT outbox_rewind('all', 'sometime')$$);
SELECT pg_temp.try($$SELECT outbox_rewind('all', NULL)$$);

-- A rewind ahead of the horizon is refused: transactions still running
-- or not yet started would be skipped when they commit.
SELECT pg_temp.try(format($$SELECT outbox_rewind('all', '%s-0')$$, pg_current_xact_id()::text::numeric + 1000000));
SELECT pg_temp.try(format($$SELECT outbox_rewind('all', '%s-1')$$, outbox.horizon()));
SELECT pg_temp.try($$SELECT outbox_rewind('all', '18446744073709551615-9223372036854775807')$$);
SELECT outbox_rewind('all', outbox.horizon() || '-0') = outbox.horizon() || '-0' AS at_horizon_ok;

-- A cursor ahead of the server's transaction ids (a dump restored into a
-- new cluster) is refused loudly rather than stalling.
UPDATE outbox.groups SET cursor_txid = (pg_current_xact_id()::text::numeric + 1000000)::text::xid8, cursor_seq = 0
 WHERE name = 'all';
SELECT pg_temp.try($$SELECT * FROM outbox_fetch('all')$$);
DO $$
DECLARE
    hint text;
BEGIN
    PERFORM * FROM outbox_fetch('all');
EXCEPTION WHEN object_not_in_prerequisite_state THEN
    GET STACKED DIAGNOSTICS hint = PG_EXCEPTION_HINT;
    RAISE WARNING 'hint: %', hint;
END
$$;
SELECT outbox_rewind('all', 'now') IS NOT NULL AS reanchored;
SELECT count(*) FROM outbox_fetch('all');

-- Re-anchoring: on the server where the group published, nothing to lift
-- (the epoch stays 0; the cursor goes to the horizon). After a restore
-- into a cluster with lower transaction ids (the last positions per
-- stream are above this server's), the epoch lifts every position above
-- them; positions given back are the group's own, and older ones refused.
SELECT outbox_reanchor('all') = outbox.horizon() || '-0' AS at_horizon, epoch FROM outbox.groups WHERE name = 'all';
-- Nor right after a rewind to 'now' (the cursor is at the horizon, and
-- nothing at or after it was published).
SELECT outbox_rewind('all', 'now') IS NOT NULL AS rewound;
SELECT outbox_reanchor('all') IS NOT NULL AS reanchored, epoch FROM outbox.groups WHERE name = 'all';
SELECT outbox_emit('orders', 're-1', '{}') IS NOT NULL AS emitted;
UPDATE outbox.groups SET streams = '{"outbox:orders": "900000000-7", "bad": "x"}' WHERE name = 'all';
SELECT outbox_reanchor('all') = '900000001-0' AS lifted;
SELECT epoch + cursor_txid::text::bigint = 900000001 AS epoch_ok, cursor FROM outbox.groups WHERE name = 'all';
SELECT outbox_emit('orders', 're-2', '{}') IS NOT NULL AS emitted;
SELECT split_part(pos, '-', 1)::bigint > 900000000 AS above, key FROM outbox_fetch('all', 10);
SELECT outbox_advance('all', (SELECT pos FROM outbox_fetch('all', 10) WHERE key = 're-2'));
SELECT split_part(cursor, '-', 1)::bigint > 900000000 AS cursor_above FROM outbox.groups WHERE name = 'all';
SELECT pg_temp.try($$SELECT outbox_advance('all', '1-1')$$);
SELECT pg_temp.try($$SELECT outbox_rewind('all', '5-0')$$);
SELECT pg_temp.try($$SELECT outbox_reanchor('nope')$$);
SELECT pg_temp.try($$SELECT outbox_reanchor(NULL)$$);
-- A stream at the last Redis id leaves no room above it.
UPDATE outbox.groups SET streams = '{"s": "18446744073709551615-1"}' WHERE name = 'all';
SELECT pg_temp.try($$SELECT outbox_reanchor('all')$$);
SELECT split_part(cursor, '-', 1)::bigint > 900000000 AS unchanged FROM outbox.groups WHERE name = 'all';
UPDATE outbox.groups SET epoch = 0, streams = '{}' WHERE name = 'all';
SELECT outbox_rewind('all', 'now') IS NOT NULL AS back;

-- Fetching after a later position (a relay's prefetch while the broker
-- writes the previous batch) skips what is in flight; a position behind
-- the cursor changes nothing.
SELECT outbox_rewind('all', 'beginning') IS NOT NULL AS rewound;
SELECT key FROM outbox_fetch('all', 2, (SELECT pos FROM outbox_fetch('all', 1)));
SELECT key FROM outbox_fetch('all', 1, '0-0');
SELECT pg_temp.try($$SELECT * FROM outbox_fetch('all', 1, 'x')$$);

-- Statistics: waiting events and the age of the oldest.
SELECT group_name, cursor_position ~ '^[0-9]+-0$' AS cursor_ok, leader_pid = pg_backend_pid() AS leads, waiting,
       oldest_waiting_age > '0'::interval AS has_age, horizon = outbox.horizon() AS horizon_ok
  FROM outbox.group_stats ORDER BY group_name;

-- A batch is the head of the backlog as outbox.backlog() defines it, in
-- feed order: after every position and the cursor, at several batch
-- sizes, with and without a topic filter. Returns the comparisons made and
-- how many differed.
SELECT outbox_group_create('head', start_at => 'now', ordering => 'xid8');
SELECT outbox_group_create('head_bc', topics => ARRAY['b', 'c'], start_at => 'now', ordering => 'xid8');
BEGIN;
SELECT count(*) FROM outbox_emit_many('a', NULL, ARRAY['1', '2']::jsonb[]);
SELECT count(*) FROM outbox_emit_many('b', NULL, ARRAY['3', '4', '5']::jsonb[]);
SELECT count(*) FROM outbox_emit('c', NULL, '6');
COMMIT;
SELECT count(*) FROM outbox_emit('a', NULL, '7');
SELECT count(*) FROM outbox_emit_many('c', NULL, ARRAY['8', '9']::jsonb[]);
CREATE FUNCTION pg_temp.head_mismatches(g text, OUT compared int, OUT mismatched int)
LANGUAGE plpgsql AS $$
DECLARE
    gr outbox.groups;
    p record;
    n int;
BEGIN
    compared := 0;
    mismatched := 0;
    SELECT * INTO gr FROM outbox.groups WHERE name = g;
    FOR p IN SELECT NULL::xid8 AS txid, NULL::bigint AS seq
             UNION ALL
             (SELECT b.txid, b.seq FROM outbox.backlog(gr.cursor_txid, gr.cursor_seq, NULL) b ORDER BY 1, 2) LOOP
        FOREACH n IN ARRAY ARRAY[1, 2, 3, 1000] LOOP
            compared := compared + 1;
            IF ARRAY(SELECT f.pos FROM outbox_fetch(g, n, p.txid || '-' || p.seq) f)
               IS DISTINCT FROM
               ARRAY(SELECT b.txid || '-' || b.seq
                       FROM outbox.backlog(coalesce(p.txid, gr.cursor_txid), coalesce(p.seq, gr.cursor_seq), gr.topics) b
                      ORDER BY b.txid, b.seq LIMIT n) THEN
                mismatched := mismatched + 1;
            END IF;
        END LOOP;
    END LOOP;
END
$$;
SELECT * FROM pg_temp.head_mismatches('head');
SELECT * FROM pg_temp.head_mismatches('head_bc');
SELECT outbox_group_drop('head'), outbox_group_drop('head_bc');

-- A wait is between 0 and 10 seconds (the statement's snapshot holds
-- VACUUM's horizon while it waits). Without pg_outbox preloaded no commit
-- could wake a sleeping fetch: an empty batch returns at once.
SELECT pg_temp.try($$SELECT * FROM outbox_fetch('all', 1, NULL, '-1 s')$$);
SELECT pg_temp.try($$SELECT * FROM outbox_fetch('all', 1, NULL, '2 hours')$$);
SELECT pg_temp.try($$SELECT * FROM outbox_fetch('all', 1, NULL, '10.001 s')$$);
SELECT pg_temp.try($$SELECT * FROM outbox_fetch('all', 1, NULL, '1 day')$$);
SELECT outbox_group_create('no_wait', start_at => 'now', ordering => 'xid8');
-- (A fetch that takes the leadership writes, and so does not wait: lead first.)
SELECT outbox_lead('no_wait');
SELECT clock_timestamp() AS t0 \gset
SELECT count(*) FROM outbox_fetch('no_wait', 10, NULL, '3 s');
-- (Preloaded, as on a server set up as the README recommends, it waits.)
SELECT (clock_timestamp() - :'t0' < '2 s') = NOT outbox.commit_order_available() AS returned_at_once_unless_preloaded;
-- The lease each leader sets for itself (100 ms to 1 hour; the C engine
-- refuses a value outside when it is set: test/sql/engine_c.sql).
SELECT pg_temp.try($$SET pg_outbox.lease = '100ms'$$), current_setting('pg_outbox.lease');
RESET pg_outbox.lease;
SELECT outbox_group_drop('no_wait');

-- A batch's rows are kept in memory of the session that outlives the
-- calling query, for the next batch (fetch.c). A batch still open when its
-- transaction fails, one read after its transaction (WITH HOLD), one from
-- the select list and two in one query come out right, and so do the
-- batches after them.
SELECT outbox_rewind('all', 'beginning') IS NOT NULL AS rewound;
BEGIN;
DECLARE open_batch CURSOR FOR SELECT key FROM outbox_fetch('all', 3);
FETCH 1 FROM open_batch;
SELECT 1 / 0;
ROLLBACK;
BEGIN;
DECLARE held_batch CURSOR WITH HOLD FOR SELECT key FROM outbox_fetch('all', 3);
COMMIT;
SELECT key FROM outbox_fetch('all', 2, '0-0');
FETCH ALL FROM held_batch;
CLOSE held_batch;
SELECT (outbox_fetch('all', 2)).key;
SELECT a.key, b.key FROM outbox_fetch('all', 2) a FULL JOIN outbox_fetch('all', 3) b USING (pos);

-- A large batch (the C engine gives its memory back once the batch is
-- read: test/sql/engine_c.sql).
SET work_mem = '64MB';
SELECT count(*) FROM outbox_emit_many('bulk',
    (SELECT array_agg(i::text) FROM generate_series(1, 20000) i),
    (SELECT array_agg(jsonb_build_object('pad', repeat('x', 500))) FROM generate_series(1, 20000)));
SELECT count(*) > 20000 AS all_there, sum(octet_length(payload::text)) > 8 * 1024 * 1024 AS large
  FROM outbox_fetch('all', 30000);
RESET work_mem;

SELECT outbox_group_drop('all'), outbox_group_drop('payments-only');
TRUNCATE outbox.event;
