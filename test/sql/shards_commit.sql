-- Sharded groups in commit order (pg_outbox preloaded; the C engine's
-- alone: the SQL engine has no commit order). shards.sql tests the rest in
-- the xid8 order, which is compared here too. In a database of its own,
-- with small partitions for retention.
\set VERBOSITY terse
SET client_min_messages = warning;
\set regress_db :DBNAME
CREATE DATABASE regress_outbox_shards_commit;
ALTER DATABASE regress_outbox_shards_commit SET pg_outbox.background_maintenance = off;
\c regress_outbox_shards_commit
\set VERBOSITY terse
SET client_min_messages = warning;
CREATE EXTENSION pg_outbox;

SELECT outbox_group_create('x', start_at => 'beginning', ordering => 'xid8', shards => 4);
SELECT outbox_group_create('c', start_at => 'beginning', ordering => 'commit', shards => 4);
SELECT outbox_group_create('one', start_at => 'beginning', ordering => 'xid8');
SELECT group_name, shard, shards, ordering FROM outbox_groups('c/3');

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

-- Each shard's batch holds the events of its shard, in feed order, in
-- either order: the shards together are the unsharded feed, every (topic,
-- key) in one shard, keyless events in their topic's shard.
CREATE TEMP TABLE got AS
SELECT g, s, f.pos, f.txid, f.seq, f.topic, f.key
  FROM unnest(ARRAY['x', 'c']) g, generate_series(0, 3) s,
       LATERAL outbox_fetch(g || '/' || s, 1000) f;
SELECT g, count(*) AS events, count(DISTINCT s) AS shards_with_events,
       bool_and(outbox.shard_of(topic, key, 4) = s) AS each_in_its_shard
  FROM got GROUP BY g ORDER BY g;
SELECT (SELECT count(*) FROM outbox_fetch('one', 1000)) AS unsharded,
       (SELECT count(*) FROM got WHERE g = 'x') AS xid8_shards,
       (SELECT count(*) FROM got WHERE g = 'c') AS commit_shards;
SELECT count(*) AS keys_in_two_shards
  FROM (SELECT g, topic, key FROM got GROUP BY g, topic, key HAVING count(DISTINCT s) > 1) t;
-- In order: positions grow within each shard, (txid, seq) too (the
-- transactions committed one after the other).
SELECT count(*) AS out_of_order
  FROM (SELECT g, s, txid, seq, lag(txid) OVER w AS ptxid, lag(seq) OVER w AS pseq
          FROM (SELECT *, row_number() OVER () AS n FROM got) o
        WINDOW w AS (PARTITION BY g, s ORDER BY n)) t
 WHERE (txid, seq) <= (ptxid, pseq);

-- A batch of a commit-ordered shard reads about a batch: rows fetched from
-- the heap by this transaction's index scans. Every bulk event is in one
-- transaction, so only the shard index can tell the shards apart.
SELECT count(*) FROM outbox_emit_many('bulk', (SELECT array_agg('k' || i) FROM generate_series(1, 40000) i),
    (SELECT array_agg(to_jsonb(i)) FROM generate_series(1, 40000) i));
SELECT pg_temp.settled();
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
SELECT outbox_rewind('c/' || s, 'beginning') IS NOT NULL AS rewound FROM generate_series(0, 3) s;
BEGIN;
SELECT count(*) FROM outbox_fetch('c/0', 1000) WHERE topic <> 'bulk';
SELECT events, rows_read <= events + 10 AS reads_its_batch FROM pg_temp.batch_reads('c/3');
COMMIT;
-- The shard index stays while a group of its shard count is left.
SELECT outbox_group_drop('x');
SELECT count(*) AS shard_4_index FROM pg_class WHERE relname = 'event_shards_4_idx';
SELECT outbox_group_drop('c');
SELECT count(*) AS shard_4_index FROM pg_class WHERE relname = 'event_shards_4_idx';
SELECT outbox_group_drop('one');

-- Retention waits for every shard, and for its own events only.
TRUNCATE outbox.event, outbox.commit_log;
UPDATE outbox.config SET partition_width = 200, premake = 3, retention = '0';
SELECT outbox_drop_empty_partitions() >= 1 AS dropped;
SELECT count(*) >= 0 AS ran FROM outbox_maintain();
SELECT outbox_group_create('rc', start_at => 'now', ordering => 'commit', shards => 2);
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
-- Maintenance measures lag by the first event after each cursor, in the
-- group's order, while no session leads the shard.
UPDATE outbox.config SET max_group_lag = '1 microsecond';
SET client_min_messages = error;
SELECT object FROM outbox_maintain() WHERE action = 'lagging' ORDER BY 1;
SET client_min_messages = warning;
-- Shard 0 publishes its event: shard 1 still keeps the partition.
SELECT outbox_advance('rc/0', (SELECT max(pos) FROM outbox_fetch('rc/0', 10)));
-- This session leads shard 0 now: it is not reported.
SET client_min_messages = error;
SELECT object FROM outbox_maintain() WHERE action = 'lagging' ORDER BY 1;
SET client_min_messages = warning;
UPDATE outbox.config SET max_group_lag = '1 day';
SELECT reason FROM outbox_partitions() WHERE reason LIKE 'not yet%' ORDER BY lower LIMIT 1;
SELECT outbox_advance('rc/1', (SELECT max(pos) FROM outbox_fetch('rc/1', 10)));
-- Every shard passed it: it goes.
SELECT action, count(*) FROM outbox_maintain() WHERE action IN ('dropped', 'detached') GROUP BY action;
SELECT count(*) AS events_left FROM outbox.event;

\c :regress_db
DROP DATABASE regress_outbox_shards_commit;
