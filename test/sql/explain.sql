-- I-10: a batch reads O(batch) rows at any backlog, not O(backlog). And
-- the backlog's definition in SQL, which the statistics read and whose
-- head a batch is, plans as an index range scan.
\set VERBOSITY terse
SET client_min_messages = warning;

TRUNCATE outbox.event;
SELECT outbox_group_create('explain', start_at => 'beginning', ordering => 'xid8');

-- A backlog of 100,000 events in 100 transactions, then 100,000 more in
-- one transaction: with a single transaction id, the row comparison's
-- estimate says a handful of rows, the trap of a top-N sort.
DO $$
BEGIN
    FOR t IN 1 .. 100 LOOP
        PERFORM outbox_emit_many('load', NULL,
            (SELECT array_agg(jsonb_build_object('t', t, 'i', i)) FROM generate_series(1, 1000) i));
        COMMIT;
    END LOOP;
END
$$;
SELECT count(*) FROM outbox_emit_many('load', NULL,
    (SELECT array_agg(jsonb_build_object('i', i)) FROM generate_series(1, 100000) i));
ANALYZE outbox.event;

-- Leave the planner only ordered index scans, as for the statistics'
-- queries over the backlog.
SET enable_sort = off;
SET enable_seqscan = off;
SET enable_bitmapscan = off;

-- Plans a batch in SQL with a cursor "skip" events into the backlog and
-- returns the node types and the rows that scans read.
CREATE FUNCTION pg_temp.batch_plan(filtered boolean, skip integer, OUT nodes text, OUT rows_read numeric, OUT rows_returned numeric)
LANGUAGE plpgsql AS $$
DECLARE
    c_txid xid8;
    c_seq bigint;
    plan jsonb;
BEGIN
    SELECT txid, seq INTO c_txid, c_seq FROM outbox.event ORDER BY txid, seq OFFSET skip LIMIT 1;
    EXECUTE 'EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, FORMAT JSON) '
            'SELECT * FROM outbox.backlog($1, $2, $3, $5) e ORDER BY e.txid, e.seq LIMIT $4'
       INTO plan USING c_txid, c_seq, CASE WHEN filtered THEN ARRAY['load'] END, 1000, outbox.horizon();
    SELECT string_agg(DISTINCT n->>'Node Type', ', ' ORDER BY n->>'Node Type'),
           sum((n->>'Actual Rows')::numeric) FILTER (WHERE n->>'Node Type' LIKE '%Scan')
      INTO nodes, rows_read
      FROM jsonb_path_query(plan, 'strict $.**') AS n
     WHERE jsonb_typeof(n) = 'object' AND n ? 'Node Type';
    rows_returned := (plan->0->'Plan'->>'Actual Rows')::numeric;
END
$$;

-- No sequential scan, no sort; a scan reads at most a batch per partition,
-- in the many-transaction part of the backlog and in the single one.
SELECT nodes, rows_returned, rows_read <= 1000 * 2 AS reads_a_batch FROM pg_temp.batch_plan(false, 50000);
SELECT nodes, rows_returned, rows_read <= 1000 * 2 AS reads_a_batch FROM pg_temp.batch_plan(true, 50000);
SELECT nodes, rows_returned, rows_read <= 1000 * 2 AS reads_a_batch FROM pg_temp.batch_plan(false, 150000);
RESET ALL;

-- The function the relay calls reads a batch, not the backlog: heap rows
-- fetched by this transaction's index scans, across the partitions.
CREATE FUNCTION pg_temp.rows_fetched() RETURNS bigint LANGUAGE sql AS $$
    SELECT sum(idx_tup_fetch)::bigint FROM pg_stat_xact_user_tables
     WHERE relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'outbox.event'::regclass)
$$;
SELECT outbox_rewind('explain', (SELECT txid || '-' || seq FROM outbox.event ORDER BY txid, seq OFFSET 150000 LIMIT 1)) IS NOT NULL AS moved;
BEGIN;
CREATE TEMP TABLE before AS SELECT coalesce(pg_temp.rows_fetched(), 0) AS n;
SELECT count(*) FROM outbox_fetch('explain', 1000);
SELECT pg_temp.rows_fetched() - n <= 1000 * 2 AS fetched_a_batch FROM before;
COMMIT;

SELECT outbox_group_drop('explain');
TRUNCATE outbox.event;
