-- I-10: the batch query is an index range scan at any backlog; it reads
-- O(batch) rows, not O(backlog).
\set VERBOSITY terse
SET client_min_messages = warning;

TRUNCATE outbox.event;
SELECT outbox_group_create('explain', start_at => 'beginning');

-- A backlog of 100,000 events in 100 transactions.
DO $$
BEGIN
    FOR t IN 1 .. 100 LOOP
        PERFORM outbox_emit_many('load', NULL,
            (SELECT array_agg(jsonb_build_object('t', t, 'i', i)) FROM generate_series(1, 1000) i));
        COMMIT;
    END LOOP;
END
$$;
ANALYZE outbox.event;

-- Plans the relay's batch query with a cursor in the middle of the backlog
-- and returns the node types and the rows that scans read.
CREATE FUNCTION pg_temp.batch_plan(filtered boolean, OUT nodes text, OUT rows_read numeric, OUT rows_returned numeric)
LANGUAGE plpgsql AS $$
DECLARE
    c_txid xid8;
    c_seq bigint;
    plan jsonb;
BEGIN
    SELECT txid, seq INTO c_txid, c_seq FROM outbox.event ORDER BY txid, seq OFFSET 50000 LIMIT 1;
    EXECUTE 'EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, FORMAT JSON) ' || outbox.fetch_sql(filtered)
       INTO plan USING c_txid, c_seq, ARRAY['load'], 1000;
    SELECT string_agg(DISTINCT n->>'Node Type', ', ' ORDER BY n->>'Node Type'),
           sum((n->>'Actual Rows')::numeric) FILTER (WHERE n->>'Node Type' LIKE '%Scan')
      INTO nodes, rows_read
      FROM jsonb_path_query(plan, 'strict $.**') AS n
     WHERE jsonb_typeof(n) = 'object' AND n ? 'Node Type';
    rows_returned := (plan->0->'Plan'->>'Actual Rows')::numeric;
END
$$;

-- No sequential scan, no sort; a scan reads at most a batch per partition.
SELECT nodes, rows_returned, rows_read <= 1000 * 2 AS reads_a_batch FROM pg_temp.batch_plan(false);
SELECT nodes, rows_returned, rows_read <= 1000 * 2 AS reads_a_batch FROM pg_temp.batch_plan(true);

-- The same through the function the relay calls, after a cached plan had a
-- chance to form on an empty table: fetching stays O(batch).
SELECT count(*) FROM outbox_fetch('explain', 1000);

SELECT outbox_group_drop('explain');
TRUNCATE outbox.event;
