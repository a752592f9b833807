-- Sharded groups: a cursor and a leader per shard of (topic, key), in the
-- xid8 order (commit-ordered shards, which need pg_outbox preloaded, are
-- in shards_commit.sql). In a database of its own, with small partitions
-- for retention.
\set VERBOSITY terse
SET client_min_messages = warning;
\set regress_db :DBNAME
CREATE DATABASE regress_outbox_shards;
ALTER DATABASE regress_outbox_shards SET pg_outbox.background_maintenance = off;
\c regress_outbox_shards
\set VERBOSITY terse
SET client_min_messages = warning;
CREATE EXTENSION pg_outbox;

-- The shard function is CRC-32C (the check value of "123456789" is
-- 0xE3069283) modulo the shard count: these values are part of the
-- interface and never change.
SELECT to_hex(outbox.shard_of('123456789', NULL, 256)) AS low_byte_of_check_value;
SELECT t, k, outbox.shard_of(t, k, 4) AS of_4, outbox.shard_of(t, k, 16) AS of_16, outbox.shard_of(t, k, 256) AS of_256
  FROM (VALUES ('orders', 'order-1'), ('orders', 'order-2'), ('orders', NULL), ('payments', 'order-1'),
               ('orders', ''), ('ördersß', 'ключ')) v(t, k);
-- A key is not the topic's continuation: ("ab", "c") and ("a", "bc") differ.
SELECT outbox.shard_of('ab', 'c', 256) <> outbox.shard_of('a', 'bc', 256) AS separated;
SELECT outbox.shard_of(NULL, 'k', 4) IS NULL AS null_topic, outbox.shard_of('t', 'k', NULL) IS NULL AS null_shards;
SELECT outbox.shard_of('t', 'k', 0);
SELECT outbox.shard_of('t', 'k', 257);
SELECT outbox.shard_of('t', repeat('k', 100000), 256) BETWEEN 0 AND 255 AS long_key;

-- Creating: 1 to 256 shards; a row per shard, each at the start.
SELECT outbox_group_create('bad', shards => 0);
SELECT outbox_group_create('bad', shards => 257);
SELECT outbox_group_create('bad', shards => NULL);
SELECT outbox_group_create('bad/1');
SELECT outbox_group_create('x', start_at => 'beginning', ordering => 'xid8', shards => 4);
SELECT outbox_group_create('one', start_at => 'beginning', ordering => 'xid8');
SELECT outbox_group_create('x', shards => 2);
SELECT name, shard, shards, cursor FROM outbox.groups ORDER BY name, shard;
-- outbox_groups(): a group's shards, or one shard; a name that matches
-- nothing gives no rows, whatever it looks like.
SELECT group_name, shard, shards, ordering, cursor_position, streams, stale, generation FROM outbox_groups('x');
SELECT group_name, shard, shards, ordering FROM outbox_groups('x/3');
SELECT count(*) AS every_row FROM outbox_groups();
SELECT left(v, 12) AS for_group, length(v), (SELECT count(*) FROM outbox_groups(v)) AS rows
  FROM unnest(ARRAY['one', 'one/0', 'one/1', 'x/4', 'x/01', 'x/', '/0', 'X', '', 'x/0/0', 'x/-1', repeat('x', 100000), NULL]) v;
SELECT indexrelid::regclass AS index, pg_get_indexdef(indexrelid) LIKE '%outbox.shard_of(topic, key, 4), txid, seq)' AS on_shard_txid_seq
  FROM pg_index WHERE indrelid = 'outbox.event'::regclass AND NOT indisprimary;

-- Events of three topics, keys and no keys, in several transactions.
DO $$
BEGIN
    FOR t IN 1 .. 20 LOOP
        PERFORM outbox_emit(topic, CASE WHEN k % 7 = 0 THEN NULL ELSE 'key-' || k END, jsonb_build_object('t', t, 'k', k))
           FROM generate_series(1, 10) k, unnest(ARRAY['orders', 'payments', 'mail']) topic;
        COMMIT;
    END LOOP;
END
$$;

-- Waits (5 s at most) until the horizons pass every event.
CREATE FUNCTION pg_temp.settled() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1 .. 500 LOOP
        IF NOT EXISTS (SELECT 1 FROM outbox.event WHERE txid >= outbox.horizon()) THEN
            RETURN true;
        END IF;
        PERFORM pg_sleep(0.01);
    END LOOP;
    RETURN false;
END
$$;
SELECT pg_temp.settled();

-- Each shard's batch holds the events of its shard, in feed order: the
-- shards together are the unsharded feed, every (topic, key) in one shard,
-- keyless events in their topic's shard.
CREATE TEMP TABLE got AS
SELECT g, s, f.pos, f.txid, f.seq, f.topic, f.key
  FROM unnest(ARRAY['x']) g, generate_series(0, 3) s,
       LATERAL outbox_fetch(g || '/' || s, 1000) f;
SELECT g, count(*) AS events, count(DISTINCT s) AS shards_with_events,
       bool_and(outbox.shard_of(topic, key, 4) = s) AS each_in_its_shard
  FROM got GROUP BY g ORDER BY g;
SELECT (SELECT count(*) FROM outbox_fetch('one', 1000)) AS unsharded,
       (SELECT count(*) FROM got WHERE g = 'x') AS xid8_shards;
SELECT count(*) AS keys_in_two_shards
  FROM (SELECT g, topic, key FROM got GROUP BY g, topic, key HAVING count(DISTINCT s) > 1) t;
-- In order: positions grow within each shard, (txid, seq) too.
SELECT count(*) AS out_of_order
  FROM (SELECT g, s, txid, seq, lag(txid) OVER w AS ptxid, lag(seq) OVER w AS pseq
          FROM (SELECT *, row_number() OVER () AS n FROM got) o
        WINDOW w AS (PARTITION BY g, s ORDER BY n)) t
 WHERE (txid, seq) <= (ptxid, pseq);

-- Names: a sharded group alone is not a shard; shard numbers are checked.
SELECT count(*) FROM outbox_fetch('x', 10);
SELECT count(*) FROM outbox_fetch('x/4', 10);
SELECT count(*) FROM outbox_fetch('x/01', 10);
SELECT count(*) FROM outbox_fetch('x/-1', 10);
SELECT count(*) FROM outbox_fetch('x/1/2', 10);
SELECT count(*) FROM outbox_fetch('x/', 10);
SELECT count(*) FROM outbox_fetch('/0', 10);
SELECT count(*) FROM outbox_fetch('x/ 1', 10);
SELECT count(*) FROM outbox_fetch('x/99999999999999999999', 10);
SELECT count(*) FROM outbox_fetch('nope/0', 10);
SELECT count(*) FROM outbox_fetch('one/1', 10);
SELECT count(*) > 0 AS unsharded_as_shard_0 FROM outbox_fetch('one/0', 10);
SELECT outbox_advance('x', '1-1');
SELECT outbox_lead('x');
SELECT outbox_rewind('x', 'beginning');
SELECT outbox_advance('x/9', '1-1');
SELECT outbox_lead('x/bad');

-- A shard advances alone; the others keep their cursors.
SELECT outbox_advance('x/1', (SELECT max(pos) FROM outbox_fetch('x/1', 1000)));
SELECT shard, waiting, cursor_position <> '0-0' AS moved FROM outbox_group_stats('x') ORDER BY shard;
SELECT group_name, shard, shards, waiting FROM outbox_group_stats('x/1');
SELECT outbox_rewind('x/1', 'beginning') IS NOT NULL AS rewound;
SELECT group_name, shard, waiting FROM outbox.group_stats WHERE group_name = 'x' ORDER BY shard;

-- A batch of a shard reads about a batch, with 1, 4 or 16 shards: rows
-- fetched from the heap by this transaction's index scans. Every event is
-- in one transaction, so only the shard index can tell the shards apart.
SELECT outbox_group_create('s16', start_at => 'now', ordering => 'xid8', shards => 16);
SELECT outbox_group_create('s1', start_at => 'now', ordering => 'xid8');
SELECT count(*) FROM outbox_emit_many('bulk', (SELECT array_agg('k' || i) FROM generate_series(1, 40000) i),
    (SELECT array_agg(to_jsonb(i)) FROM generate_series(1, 40000) i));
SELECT pg_temp.settled();
SELECT outbox_rewind('x/' || s, 'beginning') IS NOT NULL AS rewound FROM generate_series(0, 3) s;
CREATE FUNCTION pg_temp.rows_fetched() RETURNS bigint LANGUAGE sql AS $$
    SELECT coalesce(sum(idx_tup_fetch), 0)::bigint FROM pg_stat_xact_user_tables
     WHERE relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'outbox.event'::regclass)
$$;
CREATE FUNCTION pg_temp.batch_reads(g text, OUT events bigint, OUT rows_read bigint) LANGUAGE plpgsql AS $$
DECLARE
    before bigint := pg_temp.rows_fetched();
BEGIN
    SELECT count(*) INTO events FROM outbox_fetch(g, 1000);
    rows_read := pg_temp.rows_fetched() - before;
END
$$;
BEGIN;
SELECT g, events, rows_read <= events + 10 AS reads_its_batch
  FROM unnest(ARRAY['s1', 'x/2', 's16/9']) g, LATERAL pg_temp.batch_reads(g);
COMMIT;

-- Changing the shard count is a new group that starts where the old one
-- stands: each new shard rewound to the old group's lowest cursor. The
-- new shards together publish everything any old shard had not (and some
-- that one had: the inbox drops those).
SELECT outbox_group_create('x2', start_at => 'now', ordering => 'xid8', shards => 2);
SELECT outbox_advance('x/' || s, (SELECT max(pos) FROM outbox_fetch('x/' || s, 100 * (s + 1))))
  FROM generate_series(0, 3) s;
CREATE TEMP TABLE lowest AS
SELECT c.cursor_position AS pos
  FROM outbox_group_stats('x') c, LATERAL outbox.parse_position(c.cursor_position) p
 ORDER BY p.txid, p.seq LIMIT 1;
SELECT outbox_rewind('x2/' || s, (SELECT pos FROM lowest)) IS NOT NULL AS rewound FROM generate_series(0, 1) s;
CREATE TEMP TABLE old_waiting AS
SELECT f.event_id FROM generate_series(0, 3) s, LATERAL outbox_fetch('x/' || s, 100000) f;
CREATE TEMP TABLE new_feed AS
SELECT f.event_id FROM generate_series(0, 1) s, LATERAL outbox_fetch('x2/' || s, 100000) f;
SELECT (SELECT count(*) FROM old_waiting) > 0 AS old_had_waiting,
       (SELECT count(*) FROM old_waiting WHERE event_id NOT IN (SELECT event_id FROM new_feed)) AS lost,
       (SELECT count(*) - count(DISTINCT event_id) FROM new_feed) AS twice_in_new;
SELECT outbox_group_drop('x2');

-- Stale and live: the whole group by its name, or one shard.
SELECT outbox_group_set_stale('x');
SELECT shard, stale FROM outbox.group_stats WHERE group_name = 'x' ORDER BY shard;
SELECT outbox_group_set_stale('x/2', false);
SELECT shard, stale FROM outbox.group_stats WHERE group_name = 'x' ORDER BY shard;
SELECT outbox_group_set_stale('x', false);

-- Maintenance makes a missing shard index again (a restore makes the
-- extension's tables without it); a fetch without it says what to do.
DROP INDEX outbox.event_shards_4_idx;
SELECT count(*) FROM outbox_fetch('x/0', 10);
SELECT action, object FROM outbox_maintain() WHERE object LIKE '%shards%';
SELECT count(*) > 0 AS reads_again FROM outbox_fetch('x/0', 10);

-- A writer with nothing but outbox_writer emits through the shard indexes.
CREATE ROLE regress_shard_writer LOGIN IN ROLE outbox_writer;
SET ROLE regress_shard_writer;
SELECT outbox_emit('orders', 'by-writer', '{}') IS NOT NULL AS emitted;
RESET ROLE;
DROP ROLE regress_shard_writer;

-- Dropping: the whole group only; the index goes with the last group of
-- its shard count.
SELECT outbox_group_drop('x/0');
SELECT outbox_group_drop('x');
SELECT count(*) AS shard_4_index FROM pg_class WHERE relname = 'event_shards_4_idx';
SELECT outbox_group_drop('s16');
SELECT relname FROM pg_class WHERE relname LIKE 'event\_shards\_%';
SELECT outbox_group_drop('s1');
SELECT outbox_group_drop('one');

-- Retention waits for every shard, and for its own events only: a shard
-- (or a group of some topics) with nothing left in a partition does not
-- keep it, however far back its cursor is.
TRUNCATE outbox.event, outbox.commit_log;
UPDATE outbox.config SET partition_width = 200, premake = 3, retention = '0';
SELECT outbox_drop_empty_partitions() >= 1 AS dropped;
SELECT count(*) >= 0 AS ran FROM outbox_maintain();
SELECT outbox_group_create('r', start_at => 'now', ordering => 'xid8', shards => 2);
SELECT outbox_group_create('mail_only', topics => ARRAY['mail'], start_at => 'now', ordering => 'xid8');
-- One key of each shard of two, in one partition, then ids burned past it.
CREATE TEMP TABLE two_keys AS
SELECT (SELECT 'k' || i FROM generate_series(1, 100) i WHERE outbox.shard_of('orders', 'k' || i, 2) = 0 LIMIT 1) AS k0,
       (SELECT 'k' || i FROM generate_series(1, 100) i WHERE outbox.shard_of('orders', 'k' || i, 2) = 1 LIMIT 1) AS k1;
SELECT outbox_emit('orders', k0, '{}') IS NOT NULL AS emitted FROM two_keys;
SELECT outbox_emit('orders', k1, '{}') IS NOT NULL AS emitted FROM two_keys;
CREATE PROCEDURE burn(n int) LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1 .. n LOOP
        PERFORM pg_current_xact_id();
        COMMIT;
    END LOOP;
END
$$;
CALL burn(450);
SELECT pg_temp.settled();
SELECT count(*) >= 0 AS ran FROM outbox_maintain();
SELECT reason FROM outbox_partitions() WHERE rows_estimate > 0 OR reason LIKE 'not yet%' ORDER BY lower LIMIT 1;
-- Maintenance measures lag by the first event after each cursor, in each
-- group's order, without reading a backlog: a shard, or a group of some
-- topics, whose cursor is behind another's events counts while no session
-- leads it.
UPDATE outbox.config SET max_group_lag = '1 microsecond';
SET client_min_messages = error;
SELECT object FROM outbox_maintain() WHERE action = 'lagging' ORDER BY 1;
SET client_min_messages = warning;
-- Shard 0 publishes its event: shard 1 still keeps the partition.
SELECT outbox_advance('r/0', (SELECT max(pos) FROM outbox_fetch('r/0', 10)));
-- This session leads shard 0 now: it is not reported, whatever
-- is after its cursor.
SET client_min_messages = error;
SELECT object FROM outbox_maintain() WHERE action = 'lagging' ORDER BY 1;
SET client_min_messages = warning;
UPDATE outbox.config SET max_group_lag = '1 day';
SELECT reason FROM outbox_partitions() WHERE reason LIKE 'not yet%' ORDER BY lower LIMIT 1;
SELECT outbox_advance('r/1', (SELECT max(pos) FROM outbox_fetch('r/1', 10)));
-- Every shard passed it; "mail_only" has no event there: it goes.
SELECT action, count(*) FROM outbox_maintain() WHERE action IN ('dropped', 'detached') GROUP BY action;
SELECT count(*) AS events_left FROM outbox.event;

\c :regress_db
DROP DATABASE regress_outbox_shards;
