-- Partition maintenance: premaking ahead of the transaction ids, rows
-- moved out of the default partition, retention that waits for every live
-- group, stale groups. In a database of its own, with small partitions.
\set VERBOSITY terse
SET client_min_messages = warning;
\set regress_db :DBNAME
CREATE DATABASE regress_outbox_maintain;
-- Only this test maintains it, also on a server that preloads pg_outbox.
ALTER DATABASE regress_outbox_maintain SET pg_outbox.background_maintenance = off;
\c regress_outbox_maintain
\set VERBOSITY terse
SET client_min_messages = warning;
CREATE EXTENSION pg_outbox;

-- Transaction ids go fast here: partitions of 200, three ahead. The wide
-- (empty) partitions made at install make way for them.
UPDATE outbox.config SET partition_width = 200, premake = 3, retention = '0';
SELECT outbox_drop_empty_partitions() >= 5 AS dropped;
SELECT count(*) AS partitions_left FROM outbox.partition_bounds();

-- Waits (5 s at most) until the feed's horizon passes every event: any
-- transaction that holds an id (an autovacuum ANALYZE, say) holds it back.
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

-- Burns n transaction ids.
CREATE PROCEDURE burn(n int) LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1 .. n LOOP
        PERFORM pg_current_xact_id();
        COMMIT;
    END LOOP;
END
$$;

-- No partition yet: an emit lands in the default partition, never fails.
SELECT outbox_group_create('slow', start_at => 'beginning', ordering => 'xid8');
SELECT outbox_group_create('fast', start_at => 'beginning', ordering => 'xid8');
SELECT outbox_emit('t', 'early', '{}') IS NOT NULL AS emitted;
SELECT partition_name, rows_estimate, reason FROM outbox_partitions();

-- Maintenance moves the row into its partition (with a warning naming it)
-- and premakes the headroom.
SET client_min_messages = error;
SELECT action, count(*) > 0 AS some FROM outbox_maintain() GROUP BY action ORDER BY action;
SET client_min_messages = warning;
-- What the run left for outbox_maintenance_status().
SELECT last_started_at IS NOT NULL AS started, last_finished_at >= last_started_at AS finished
  FROM outbox_maintenance_status();
SELECT count(*) AS in_default FROM outbox.event_default;
SELECT pg_temp.settled();
SELECT key FROM outbox.feed;
SELECT count(*) >= 3 AS headroom
  FROM outbox.partition_bounds() WHERE upper > pg_current_xact_id();

-- A second run has nothing to move and nothing deferred.
SELECT count(*) AS moved_or_deferred FROM outbox_maintain() WHERE action IN ('moved', 'deferred');

-- A jump of transaction ids beyond the premade range: writers still emit
-- (into the default partition), and the next run fixes it.
CALL burn(1000);
SELECT outbox_emit('t', 'after-jump', '{}') IS NOT NULL AS emitted;
SELECT count(*) AS in_default FROM outbox.event_default;
SET client_min_messages = error;
SELECT action, count(*) > 0 AS some FROM outbox_maintain() GROUP BY action ORDER BY action;
SET client_min_messages = warning;
SELECT count(*) AS in_default FROM outbox.event_default;
SELECT pg_temp.settled();
SELECT key FROM outbox.feed ORDER BY txid;

-- Retention keeps what a group still needs: both groups are at the
-- beginning, so the partitions with events stay (empty old ones go).
CALL burn(300);
SELECT count(*) >= 0 AS ran FROM outbox_maintain();
SELECT pg_temp.settled();
SELECT key FROM outbox.feed ORDER BY txid;
SELECT reason FROM outbox_partitions() WHERE NOT retirable AND upper <= outbox.horizon() ORDER BY lower LIMIT 1;

-- "fast" passes everything; "slow" still keeps the partitions.
SELECT count(*) FROM outbox_fetch('fast', 1000);
SELECT outbox_advance('fast', (SELECT max(pos) FROM outbox_fetch('fast', 1000) WHERE key = 'after-jump'));
SELECT count(*) AS retired FROM outbox_maintain() WHERE action IN ('dropped', 'detached');

-- "slow" passes the first event only: the partition of the first event
-- leaves, the one of the second stays.
SELECT outbox_advance('slow', (SELECT pos FROM outbox_fetch('slow', 1)));
SELECT action, count(*) FROM outbox_maintain() WHERE action IN ('dropped', 'detached') GROUP BY action;
SELECT pg_temp.settled();
SELECT key FROM outbox.feed;

-- Rewinding "fast" before what retention removed warns: those events
-- cannot be published again. It goes on with the oldest event kept; a
-- rewind to that event's position does not warn.
SELECT outbox_rewind('fast', 'beginning');
SELECT key FROM outbox_fetch('fast', 10);
SELECT outbox_advance('fast', (SELECT pos FROM outbox_fetch('fast', 10) ORDER BY txid DESC, seq DESC LIMIT 1));
SELECT outbox_rewind('fast', (SELECT txid || '-' || seq FROM outbox.event ORDER BY txid, seq LIMIT 1)) IS NOT NULL AS no_warning;

-- A stale group no longer keeps storage; a lagging one is reported.
UPDATE outbox.config SET max_group_lag = '1 microsecond', retire_mode = 'detach';
SET client_min_messages = error;  -- the warning names the lag, which varies
SELECT action, object FROM outbox_maintain() WHERE action = 'lagging';
SET client_min_messages = warning;
SELECT outbox_group_set_stale('slow');
-- (One partition or two: background maintenance, where it runs, takes
-- transaction ids of its own and may have moved the horizon past another.)
SELECT action, count(*) >= 1 AS retired FROM outbox_maintain() WHERE action IN ('dropped', 'detached', 'lagging') GROUP BY action;
SELECT count(*) >= 1 AS detached_kept FROM pg_class WHERE relname LIKE 'event\_%\_detached';
SELECT count(*) AS events_left FROM outbox.event;
SELECT group_name, stale FROM outbox.group_stats ORDER BY 1;
SELECT outbox_group_set_stale('slow', false);


-- A batch reads across partitions in feed order, the default partition's
-- rows merged with the range partitions': an event in a premade
-- partition, one in the default partition after a jump, one in a
-- partition made above that jump, one in the default partition again.
SELECT outbox_group_create('merge', start_at => 'now', ordering => 'xid8');
SELECT outbox_emit('t', 'merge-1', '{}') IS NOT NULL AS emitted;
CALL burn(1000);
SELECT outbox_emit('t', 'merge-2', '{}') IS NOT NULL AS emitted;
DO $$
DECLARE
    x bigint := pg_current_xact_id()::text::bigint;
BEGIN
    EXECUTE format('CREATE TABLE outbox.event_merge PARTITION OF outbox.event FOR VALUES FROM (%L) TO (%L)',
                   x + 50, x + 100);
END
$$;
CALL burn(60);
SELECT outbox_emit('t', 'merge-3', '{}') IS NOT NULL AS emitted;
CALL burn(100);
SELECT outbox_emit('t', 'merge-4', '{}') IS NOT NULL AS emitted;
SELECT count(*) AS in_default FROM outbox.event_default;
SELECT count(*) AS in_merge FROM outbox.event_merge;
SELECT key FROM outbox_fetch('merge', 10);
SELECT key FROM outbox_fetch('merge', 2, (SELECT pos FROM outbox_fetch('merge', 1)));
SELECT outbox_group_drop('merge');

-- Maintenance reads no group's backlog. "quiet" takes topic q only: one
-- event of it, then 3,000 of topic t that it will never publish; "slow"
-- and "fast" are behind all of them. A run reads the event partitions a
-- few rows at a time (the first event after each cursor, the last of
-- each partition), never the 3,000: this transaction's statistics count
-- the rows it read. Retention is a day here, so no partition is searched
-- for a group's events.
UPDATE outbox.config SET retention = '1 day', max_group_lag = '1 day', retire_mode = 'drop';
CALL burn(250);
SELECT outbox_group_create('quiet', topics => '{q}', start_at => 'now', ordering => 'xid8');
SELECT outbox_emit('q', 'kept', '{}') IS NOT NULL AS emitted;
CALL burn(250);
SELECT count(*) AS noise FROM (SELECT outbox_emit('t', 'noise-' || i, '{}') FROM generate_series(1, 3000) i) e;
CALL burn(250);
SELECT pg_temp.settled();
SET client_min_messages = error;
SELECT count(*) >= 0 AS ran FROM outbox_maintain();
-- The counts are taken before and after the run in one transaction: the
-- statistics of this backend's earlier transactions are flushed at most
-- once a second, and until then they count here too.
BEGIN;
CREATE TEMP TABLE rows_read_before ON COMMIT DROP AS
SELECT sum(seq_tup_read + coalesce(idx_tup_fetch, 0)) AS n
  FROM pg_stat_xact_user_tables WHERE schemaname = 'outbox' AND relname LIKE 'event\_%';
SELECT count(*) >= 0 AS ran FROM outbox_maintain();
SELECT sum(seq_tup_read + coalesce(idx_tup_fetch, 0)) - (SELECT coalesce(n, 0) FROM rows_read_before) < 300 AS few_rows_read
  FROM pg_stat_xact_user_tables WHERE schemaname = 'outbox' AND relname LIKE 'event\_%';
COMMIT;
SET client_min_messages = warning;

-- Lag is the age of the first event after a cursor, of any topic: a group
-- of some topics counts only while no session leads it.
UPDATE outbox.config SET max_group_lag = '1 microsecond';
SET client_min_messages = error;
SELECT object FROM outbox_maintain() WHERE action = 'lagging' ORDER BY 1;
SELECT count(*) AS fetched FROM outbox_fetch('quiet', 10);
SELECT object FROM outbox_maintain() WHERE action = 'lagging' ORDER BY 1;
SELECT outbox_resign('quiet');
SET client_min_messages = warning;

-- Retention still keeps what a live group has not passed (I-6): with
-- "slow" and "fast" stale, the partitions of the noise go, that of
-- "quiet"'s waiting event stays until "quiet" passes it.
UPDATE outbox.config SET retention = '0', max_group_lag = '1 day';
SELECT outbox_group_set_stale('slow');
SELECT outbox_group_set_stale('fast');
SET client_min_messages = error;
SELECT count(*) > 0 AS retired FROM outbox_maintain() WHERE action = 'dropped';
SELECT topic, count(*), min(key) FROM outbox.event GROUP BY topic ORDER BY topic;
SELECT outbox_advance('quiet', (SELECT pos FROM outbox_fetch('quiet', 10) WHERE key = 'kept'));
SELECT count(*) > 0 AS retired FROM outbox_maintain() WHERE action = 'dropped';
SET client_min_messages = warning;
SELECT count(*) AS events_left FROM outbox.event;
SELECT outbox_group_set_stale('slow', false);
SELECT outbox_group_set_stale('fast', false);

-- outbox_maintenance_databases() reads what the background workers
-- record: preloaded, it lists the cluster's databases; without preloading
-- nothing records runs, and it says so (55000) rather than list nothing.
CREATE FUNCTION pg_temp.databases_as_expected() RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    preloaded boolean := current_setting('shared_preload_libraries') ~ '(^|[ ,])pg_outbox($|[ ,])';
BEGIN
    PERFORM 1 FROM outbox_maintenance_databases() d WHERE d.database = current_database();
    RETURN preloaded AND FOUND;
EXCEPTION WHEN object_not_in_prerequisite_state THEN
    RETURN NOT preloaded;
END
$$;
SELECT pg_temp.databases_as_expected();

-- The summary of the last run.
SELECT last_started_at <= last_finished_at AS ran FROM outbox.maintenance;

-- A run takes at most 60 subtransactions (each step that may fail alone
-- is one, and each that makes a partition takes a transaction id): far
-- more partitions to premake than that are made over several runs, never
-- in one transaction that would overflow its backend's subtransaction
-- cache.
UPDATE outbox.config SET premake = 100;
SELECT pg_snapshot_xmax(pg_current_snapshot()) AS xmax_before \gset
SET client_min_messages = error;
SELECT count(*) FILTER (WHERE action = 'created') AS created, count(*) FILTER (WHERE action = 'deferred') AS deferred
  FROM outbox_maintain() WHERE object LIKE 'outbox.event\_%';
-- (An autovacuum ANALYZE may take an id meanwhile, so not exactly 61.)
SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint - :'xmax_before'::text::bigint < 70 AS xids_bounded;
SELECT count(*) FILTER (WHERE action = 'created') > 0 AS created, count(*) FILTER (WHERE action = 'deferred') AS deferred
  FROM outbox_maintain() WHERE object LIKE 'outbox.event\_%';
SET client_min_messages = warning;
UPDATE outbox.config SET premake = 3;

-- Dropping the extension leaves nothing, partitions made by maintenance
-- included.
DROP EXTENSION pg_outbox;
SELECT count(*) AS relations FROM pg_class WHERE relname LIKE 'event\_%' OR relname LIKE 'inbox\_%';

\c :regress_db
DROP DATABASE regress_outbox_maintain;
