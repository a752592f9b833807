-- outbox_emit() and outbox_emit_many(): rows written in the caller's transaction.
\set VERBOSITY terse
SET client_min_messages = warning;

CREATE TEMP TABLE seen (event_id uuid);

-- One event; the id is generated, version 7, time-ordered.
BEGIN;
INSERT INTO seen SELECT outbox_emit('orders', 'order-1', '{"amount": 10}');
SELECT e.txid = pg_current_xact_id() AS own_txid, e.seq, e.topic, e.key, e.payload, e.headers,
       e.event_id = s.event_id AS same_id, substr(e.event_id::text, 15, 1) AS uuid_version,
       e.created_at BETWEEN now() AND clock_timestamp() AS created_now
  FROM outbox.event e JOIN seen s USING (event_id);
COMMIT;

-- Generated ids stay distinct, version 7 and RFC 4122 variant, across many
-- refills of the backend's pool of random bytes (ten bytes an id, 4096 a
-- pool), by outbox_emit and outbox_emit_many alike; their millisecond
-- prefixes never go back.
BEGIN;
CREATE TEMP TABLE many_ids ON COMMIT DROP AS
SELECT outbox_emit('ids', NULL, to_jsonb(i)) AS event_id, i FROM generate_series(1, 5000) i
UNION ALL
SELECT m.event_id, 5000 + m.n FROM outbox_emit_many('ids', NULL,
       (SELECT array_agg(to_jsonb(i)) FROM generate_series(1, 5000) i)) WITH ORDINALITY AS m(event_id, n);
SELECT count(*) AS ids, count(DISTINCT event_id) AS distinct_ids,
       count(*) FILTER (WHERE substr(event_id::text, 15, 1) = '7') AS version_7,
       count(*) FILTER (WHERE substr(event_id::text, 20, 1) IN ('8', '9', 'a', 'b')) AS rfc4122_variant,
       count(DISTINCT substr(event_id::text, 20)) AS distinct_random_tails
  FROM many_ids;
SELECT count(*) AS prefix_went_back
  FROM (SELECT substr(event_id::text, 1, 13) AS ms,
               lag(substr(event_id::text, 1, 13)) OVER (ORDER BY i) AS before FROM many_ids) t
 WHERE ms < before;
ROLLBACK;

-- A given event id is kept as is; headers and a NULL key are stored.
BEGIN;
SELECT outbox_emit('orders', NULL, '{"amount": 20}', '{"trace": "abc"}',
                   '00000000-0000-4000-8000-000000000001') AS event_id;
SELECT seq, topic, key, payload, headers FROM outbox.event
 WHERE event_id = '00000000-0000-4000-8000-000000000001';
COMMIT;

-- Savepoints and exception blocks write under the top-level transaction id;
-- the sequence keeps growing inside one transaction; a rolled-back
-- savepoint leaves nothing.
BEGIN;
SELECT outbox_emit('t', 'a', '1') IS NOT NULL AS emitted;
SAVEPOINT s1;
SELECT outbox_emit('t', 'b', '2') IS NOT NULL AS emitted;
RELEASE SAVEPOINT s1;
SAVEPOINT s2;
SELECT outbox_emit('t', 'rolled back', '3') IS NOT NULL AS emitted;
ROLLBACK TO SAVEPOINT s2;
DO $$
BEGIN
    PERFORM outbox_emit('t', 'c', '4');
    BEGIN
        PERFORM outbox_emit('t', 'in failed block', '5');
        RAISE division_by_zero;
    EXCEPTION WHEN division_by_zero THEN
        NULL;
    END;
END
$$;
SELECT key, seq, txid = pg_current_xact_id() AS top_level_txid
  FROM outbox.event WHERE txid = pg_current_xact_id() ORDER BY seq;
COMMIT;

-- An error caught by a savepoint leaves emission working in the transaction.
BEGIN;
SELECT outbox_emit('t', 'before error', '7') IS NOT NULL AS emitted;
SAVEPOINT e;
SELECT outbox_emit('', 'bad', '8');
ROLLBACK TO SAVEPOINT e;
SELECT outbox_emit('t', 'after error', '9') IS NOT NULL AS emitted;
SELECT count(*) FROM outbox_emit_many('t', ARRAY['after error, many'], ARRAY['10']::jsonb[]);
SELECT key, seq FROM outbox.event WHERE txid = pg_current_xact_id() ORDER BY seq;
COMMIT;

-- A rolled-back transaction leaves nothing.
BEGIN;
SELECT outbox_emit('t', 'aborted', '6') IS NOT NULL AS emitted;
ROLLBACK;
SELECT count(*) AS aborted_rows FROM outbox.event WHERE key = 'aborted' OR key = 'rolled back' OR key = 'in failed block';

-- The set-based variant: ids in array order, one insert, same transaction.
BEGIN;
CREATE TEMP TABLE many AS
SELECT * FROM outbox_emit_many('bulk', ARRAY['k1', NULL, 'k3'],
                               ARRAY['{"n": 1}', '{"n": 2}', '{"n": 3}']::jsonb[],
                               ARRAY[NULL, '{"h": 2}', NULL]::jsonb[],
                               ARRAY['00000000-0000-4000-8000-0000000000a1', NULL,
                                     '00000000-0000-4000-8000-0000000000a3']::uuid[]) WITH ORDINALITY AS m(event_id, n);
SELECT m.n, e.seq, e.key, e.payload, e.headers, e.txid = pg_current_xact_id() AS own_txid,
       e.event_id::text LIKE '00000000-%' AS given_id
  FROM many m JOIN outbox.event e USING (event_id) ORDER BY m.n;
COMMIT;

-- Keys and headers may be omitted; an empty array emits nothing.
SELECT count(*) FROM outbox_emit_many('bulk', NULL, ARRAY['{}', '{}']::jsonb[]);
SELECT count(*) FROM outbox_emit_many('bulk', NULL, '{}'::jsonb[]);

-- A large set in one call.
SELECT count(*) FROM outbox_emit_many('bulk', NULL,
    (SELECT array_agg(jsonb_build_object('i', i)) FROM generate_series(1, 5000) i));
SELECT count(*), count(DISTINCT seq), min(seq) = 1 AS from_one, max(seq) = 5000 AS to_n
  FROM outbox.event WHERE topic = 'bulk' AND payload ? 'i';

-- Many calls in one statement.
BEGIN;
SELECT count(outbox_emit('rows', i::text, jsonb_build_object('i', i))) FROM generate_series(1, 1000) i;
SELECT count(*), max(seq) - min(seq) + 1 AS span FROM outbox.event WHERE txid = pg_current_xact_id();
COMMIT;

-- The table is insert-only: nothing above updated or deleted a row.
SELECT pg_stat_force_next_flush();
SELECT pg_sleep(0.1);
SELECT pg_stat_clear_snapshot();
SELECT sum(n_tup_ins) > 0 AS inserted, sum(n_tup_upd + n_tup_del + n_tup_hot_upd) AS changed
  FROM pg_stat_user_tables
 WHERE relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'outbox.event'::regclass);

TRUNCATE outbox.event;
