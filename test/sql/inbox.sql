-- The inbox: inbox_apply(), inbox_consume(), dead letters, replay, retention.
TRUNCATE outbox.inbox, outbox.dead_letters RESTART IDENTITY;
\set VERBOSITY terse
SET client_min_messages = warning;

CREATE FUNCTION pg_temp.try(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN sqlstate || ': ' || sqlerrm;
END
$$;
-- Stream fields arrive as bytes: text as UTF-8 bytes, NULL kept.
CREATE FUNCTION pg_temp.b(a text[]) RETURNS bytea[] LANGUAGE sql AS
    $$ SELECT array_agg(convert_to(x, 'UTF8') ORDER BY o) FROM unnest(a) WITH ORDINALITY u(x, o) $$;
GRANT EXECUTE ON FUNCTION pg_temp.try(text), pg_temp.b(text[]) TO PUBLIC;

-- The consumers of this test, owned by the role that runs it.
DELETE FROM outbox.consumers;
SELECT inbox_consumer_create(c, current_user::regrole)
  FROM unnest(ARRAY['accounting', 'reporting', 'ledger', 'c']) c;

-- First time true, redelivery false; jsonb equality ignores key order and
-- whitespace; the same event for another consumer is its own.
SELECT inbox_apply('accounting', '00000000-0000-4000-8000-000000000001', '{"amount": 10, "currency": "EUR"}');
SELECT inbox_apply('accounting', '00000000-0000-4000-8000-000000000001', '{"currency":"EUR","amount":10}');
SELECT inbox_apply('reporting', '00000000-0000-4000-8000-000000000001', '{"amount": 10, "currency": "EUR"}');

-- The same id with another payload: identity conflict, SQLSTATE OB001,
-- naming consumer and event, showing both payloads; nothing applied.
SELECT pg_temp.try($$SELECT inbox_apply('accounting', '00000000-0000-4000-8000-000000000001', '{"amount": 99, "currency": "EUR"}')$$);
DO $$
DECLARE
    d text;
BEGIN
    PERFORM inbox_apply('accounting', '00000000-0000-4000-8000-000000000001', '{"amount": 99, "currency": "EUR"}');
EXCEPTION WHEN SQLSTATE 'OB001' THEN
    GET STACKED DIAGNOSTICS d = PG_EXCEPTION_DETAIL;
    RAISE WARNING '%', d;
END
$$;
SELECT consumer, event_id, payload FROM outbox.inbox ORDER BY consumer;

-- Bad input.
SELECT pg_temp.try($$SELECT inbox_apply(NULL, '00000000-0000-4000-8000-000000000002', '{}')$$);
SELECT pg_temp.try($$SELECT inbox_apply('c', NULL, '{}')$$);
SELECT pg_temp.try($$SELECT inbox_apply('c', '00000000-0000-4000-8000-000000000002', NULL)$$);
SELECT pg_temp.try($$SELECT inbox_apply('', '00000000-0000-4000-8000-000000000002', '{}')$$);
SELECT pg_temp.try($$SELECT inbox_apply(repeat('c', 256), '00000000-0000-4000-8000-000000000002', '{}')$$);
SELECT count(*) AS rows_after_errors FROM outbox.inbox;

-- The apply and the effect commit together: a rolled-back transaction
-- leaves no inbox row, so the redelivery applies.
CREATE TABLE balances (currency text PRIMARY KEY, total numeric NOT NULL);
BEGIN;
SELECT inbox_apply('accounting', '00000000-0000-4000-8000-000000000003', '{"amount": 5, "currency": "USD"}');
INSERT INTO balances VALUES ('USD', 5);
ROLLBACK;
SELECT inbox_apply('accounting', '00000000-0000-4000-8000-000000000003', '{"amount": 5, "currency": "USD"}');

-- inbox_consume with isolate: a batch, each entry in its own
-- subtransaction, through a handler that receives topic, key, payload,
-- headers, event id.
CREATE FUNCTION apply_transfer(topic text, key text, payload jsonb, headers jsonb, event_id uuid)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO balances VALUES (payload->>'currency', (payload->>'amount')::numeric)
    ON CONFLICT (currency) DO UPDATE SET total = balances.total + excluded.total
$$;
SELECT * FROM inbox_consume('ledger', 'SELECT apply_transfer($1, $2, $3, $4, $5)',
    pg_temp.b(ARRAY['00000000-0000-4000-8000-0000000000b1', '00000000-0000-4000-8000-0000000000b2',
          '00000000-0000-4000-8000-0000000000b1', '00000000-0000-4000-8000-0000000000b3',
          '00000000-0000-4000-8000-0000000000b2', '00000000-0000-4000-8000-0000000000b4',
          'not-a-uuid', '00000000-0000-4000-8000-0000000000b5']),
    pg_temp.b(ARRAY['transfers', 'transfers', 'transfers', 'transfers', 'transfers', 'transfers', 'transfers', 'transfers']),
    pg_temp.b(ARRAY['a', 'b', 'a', 'c', 'b', 'd', 'e', 'f']),
    pg_temp.b(ARRAY['{"amount": 10, "currency": "EUR"}', '{"amount": 7, "currency": "EUR"}',
          '{"amount": 10, "currency": "EUR"}', '{"amount": "oops", "currency": "EUR"}',
          '{"amount": 700, "currency": "EUR"}', '{"amount": 1, "currency": "GBP"}',
          '{"amount": 1, "currency": "GBP"}', '{"amount": 1, "currency": "GB']),
    NULL, isolate => true);
-- The failed entries (a bad amount, a bad id, bad JSON) and the conflict
-- changed nothing; the others applied once.
SELECT * FROM balances ORDER BY currency;
SELECT event_id FROM outbox.inbox WHERE consumer = 'ledger' ORDER BY event_id;

-- Without isolate, the batch applies as one: malformed entries, duplicates
-- (also of an earlier entry of the batch) and conflicts are reported
-- without raising, the handler runs in the order of the entries...
CREATE TABLE ledger_log (n serial, event_id uuid, xid xid8);
CREATE FUNCTION log_transfer(event_id uuid) RETURNS void LANGUAGE sql AS $$
    INSERT INTO ledger_log (event_id, xid) VALUES (event_id, pg_current_xact_id())
$$;
SELECT * FROM inbox_consume('ledger', 'SELECT log_transfer($5)',
    pg_temp.b(ARRAY['00000000-0000-4000-8000-0000000000e2', '00000000-0000-4000-8000-0000000000b1',
          '00000000-0000-4000-8000-0000000000e1', '00000000-0000-4000-8000-0000000000e2',
          'not-a-uuid', '00000000-0000-4000-8000-0000000000e1', '00000000-0000-4000-8000-0000000000e3']),
    pg_temp.b(array_fill('transfers'::text, ARRAY[7])), NULL,
    pg_temp.b(ARRAY['{"n": 2}', '{"amount": 10, "currency": "EUR"}', '{"n": 1}', '{"n": 2}', '{}', '{"n": 9}', '{"n": 3']),
    NULL);
SELECT n, event_id FROM ledger_log ORDER BY n;
-- ...in one transaction with one transaction id, and no subtransaction
-- (each would take an id of its own: the handler and the inbox write).
SELECT count(DISTINCT xid) AS xids_in_handler FROM ledger_log;
SELECT pg_snapshot_xmax(pg_current_snapshot()) AS xmax_before \gset
SELECT count(*) AS entries
  FROM inbox_consume('ledger', 'SELECT log_transfer($5)',
                     (SELECT array_agg(convert_to(gen_random_uuid()::text, 'UTF8')) FROM generate_series(1, 100)),
                     pg_temp.b(array_fill('transfers'::text, ARRAY[100])), NULL,
                     pg_temp.b(array_fill('{}'::text, ARRAY[100])), NULL)
 WHERE status = 'applied';
SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint - :'xmax_before'::text::bigint AS xids_used;
-- A handler that raises aborts the call (inbox_context names the event);
-- isolate then reports it alone.
SELECT pg_temp.try($$SELECT * FROM inbox_consume('ledger', 'SELECT 1 / ($3->>''d'')::int',
    pg_temp.b(ARRAY['00000000-0000-4000-8000-0000000000f1', '00000000-0000-4000-8000-0000000000f2']),
    pg_temp.b(ARRAY['t', 't']), NULL, pg_temp.b(ARRAY['{"d": 1}', '{"d": 0}']), NULL)$$);
SELECT * FROM inbox_consume('ledger', 'SELECT 1 / ($3->>''d'')::int',
    pg_temp.b(ARRAY['00000000-0000-4000-8000-0000000000f1', '00000000-0000-4000-8000-0000000000f2']),
    pg_temp.b(ARRAY['t', 't']), NULL, pg_temp.b(ARRAY['{"d": 1}', '{"d": 0}']), NULL, isolate => true);
-- isolate takes at most 64 entries: a transaction with more
-- subtransactions overflows its backend's cache.
SELECT pg_temp.try($$SELECT * FROM inbox_consume('ledger', 'SELECT 1',
    (SELECT array_agg(convert_to(gen_random_uuid()::text, 'UTF8')) FROM generate_series(1, 65)),
    pg_temp.b(array_fill('t'::text, ARRAY[65])), NULL, pg_temp.b(array_fill('{}'::text, ARRAY[65])), NULL, isolate => true)$$);
SELECT count(*) AS sixty_four FROM inbox_consume('ledger', 'SELECT 1',
    (SELECT array_agg(convert_to(gen_random_uuid()::text, 'UTF8')) FROM generate_series(1, 64)),
    pg_temp.b(array_fill('t'::text, ARRAY[64])), NULL, pg_temp.b(array_fill('{}'::text, ARRAY[64])), NULL, isolate => true);
SELECT pg_temp.try($$SELECT * FROM inbox_consume('ledger', 'SELECT 1', ARRAY[]::bytea[], ARRAY[]::bytea[], NULL, ARRAY[]::bytea[], NULL, NULL)$$);
-- A cancel (here a statement timeout) is no entry's failure: it ends the
-- call, as in PL/pgSQL, and the session goes on.
SET statement_timeout = '200ms';
SELECT pg_temp.try($$SELECT * FROM inbox_consume('ledger', 'SELECT pg_sleep(5)',
    pg_temp.b(ARRAY['00000000-0000-4000-8000-0000000000f4']), pg_temp.b(ARRAY['t']), NULL, pg_temp.b(ARRAY['{}']), NULL, isolate => true)$$);
RESET statement_timeout;
SELECT count(*) AS not_applied FROM outbox.inbox WHERE event_id = '00000000-0000-4000-8000-0000000000f4';
-- A handler that cannot run inside a function is refused, naming why.
SELECT pg_temp.try($$SELECT * FROM inbox_consume('ledger', 'COMMIT',
    pg_temp.b(ARRAY['00000000-0000-4000-8000-0000000000f3']), pg_temp.b(ARRAY['t']), NULL, pg_temp.b(ARRAY['{}']), NULL)$$);
DELETE FROM outbox.inbox WHERE consumer = 'ledger' AND event_id NOT IN
    ('00000000-0000-4000-8000-0000000000b1', '00000000-0000-4000-8000-0000000000b2', '00000000-0000-4000-8000-0000000000b4');
DROP TABLE ledger_log;
DROP FUNCTION log_transfer(uuid);

SELECT pg_temp.try($$SELECT * FROM inbox_consume('c', '', ARRAY[]::bytea[], ARRAY[]::bytea[], NULL, ARRAY[]::bytea[], NULL)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_consume('c', 'SELECT 1', pg_temp.b(ARRAY['00000000-0000-4000-8000-0000000000c1']), ARRAY[]::bytea[], NULL, pg_temp.b(ARRAY['{}']), NULL)$$);

-- Dead letters: recorded once per stream entry, updated on each failure;
-- a conflict keeps the payload applied earlier beside the received one.
SELECT inbox_dead_letter('ledger', 'outbox:transfers', '100-4', '00000000-0000-4000-8000-0000000000b3',
                         'transfers', 'c', '{"amount": "oops", "currency": "EUR"}', NULL,
                         'invalid input syntax for type numeric: "oops"', '22P02', 3) AS first_id \gset
SELECT inbox_dead_letter('ledger', 'outbox:transfers', '100-4', '00000000-0000-4000-8000-0000000000b3',
                         'transfers', 'c', '{"amount": "oops", "currency": "EUR"}', NULL,
                         'invalid input syntax for type numeric: "oops"', '22P02', 5) = :first_id AS same_row;
SELECT inbox_dead_letter('ledger', 'outbox:transfers', '100-5', '00000000-0000-4000-8000-0000000000b2',
                         'transfers', 'b', '{"amount": 700, "currency": "EUR"}', NULL,
                         'identity conflict', 'OB001') IS NOT NULL AS recorded;
SELECT inbox_dead_letter('ledger', 'outbox:transfers', '99-1', NULL, NULL, NULL, NULL, NULL,
                         'entry deleted from the stream before it was applied') IS NOT NULL AS recorded;
SELECT entry_id, event_id IS NOT NULL AS has_event, payload, applied_payload, sqlstate, deliveries,
       last_failed_at >= first_failed_at AS times_ok
  FROM outbox.dead_letters ORDER BY entry_id;
SELECT pg_temp.try($$SELECT inbox_dead_letter(NULL, 's', '1-1', NULL, NULL, NULL, NULL, NULL, 'r')$$);

-- Replay: with the original event id, through the (fixed) handler.
CREATE OR REPLACE FUNCTION apply_transfer(topic text, key text, payload jsonb, headers jsonb, event_id uuid)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO balances VALUES (payload->>'currency', coalesce((payload->>'amount') ~ '^[0-9.]+$', false)::int)
    ON CONFLICT (currency) DO UPDATE SET total = balances.total + excluded.total
$$;
SELECT inbox_replay(id, 'SELECT apply_transfer($1, $2, $3, $4, $5)') FROM outbox.dead_letters WHERE entry_id = '100-4';
SELECT inbox_replay(id, 'SELECT apply_transfer($1, $2, $3, $4, $5)') FROM outbox.dead_letters WHERE entry_id = '100-4';
SELECT entry_id, replayed_at IS NOT NULL AS replayed FROM outbox.dead_letters ORDER BY entry_id;
SELECT pg_temp.try($$SELECT inbox_replay(id, 'SELECT 1') FROM outbox.dead_letters WHERE entry_id = '100-5'$$);
SELECT pg_temp.try($$SELECT inbox_replay(id, 'SELECT 1') FROM outbox.dead_letters WHERE entry_id = '99-1'$$);
SELECT pg_temp.try($$SELECT inbox_replay(424242, 'SELECT 1')$$);

-- Retention drops whole inbox partitions older than inbox_retention, never
-- the current ones.
SELECT outbox.inbox_premake_partitions() >= 0 AS premade;  -- unless background maintenance did
SELECT count(*) >= 4 AS premade FROM pg_inherits WHERE inhparent = 'outbox.inbox'::regclass;
CREATE TABLE outbox.inbox_20000101 PARTITION OF outbox.inbox
    FOR VALUES FROM ('2000-01-01 00:00+00') TO ('2000-01-02 00:00+00');
-- As the partitions made by CREATE EXTENSION are: the extension's.
ALTER EXTENSION pg_outbox ADD TABLE outbox.inbox_20000101;
INSERT INTO outbox.inbox VALUES ('old', '00000000-0000-4000-8000-0000000000d1', '{}', '2000-01-01 12:00+00');
SELECT outbox.inbox_retire_partitions();
SELECT count(*) AS old_rows FROM outbox.inbox WHERE consumer = 'old';
SELECT count(*) AS kept_rows FROM outbox.inbox;

-- At REPEATABLE READ and SERIALIZABLE, a redelivery of an event applied
-- before the transaction began, in the partition rows go to now, is a
-- duplicate (only an apply committed after the snapshot is a 40001).
SELECT inbox_apply('accounting', '00000000-0000-4000-8000-000000000004', '{"n": 4}');
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT inbox_apply('accounting', '00000000-0000-4000-8000-000000000004', '{"n": 4}');
SELECT ord, status FROM inbox_consume('accounting', 'SELECT 1',
    pg_temp.b(ARRAY['00000000-0000-4000-8000-000000000004', '00000000-0000-4000-8000-000000000005']),
    pg_temp.b(ARRAY['t', 't']), NULL, pg_temp.b(ARRAY['{"n": 4}', '{"n": 5}']), NULL);
COMMIT;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT inbox_apply('accounting', '00000000-0000-4000-8000-000000000005', '{"n": 5}');
COMMIT;
DELETE FROM outbox.inbox WHERE event_id IN ('00000000-0000-4000-8000-000000000004', '00000000-0000-4000-8000-000000000005');

-- A consumer role may apply, dead-letter and replay for its own
-- consumers, nothing else.
CREATE ROLE regress_outbox_consumer IN ROLE outbox_consumer;
GRANT ALL ON balances TO regress_outbox_consumer;
SELECT inbox_consumer_create('role-test', 'regress_outbox_consumer');
SET ROLE regress_outbox_consumer;
SELECT inbox_apply('role-test', '00000000-0000-4000-8000-0000000000e1', '{}');
SELECT inbox_dead_letter('role-test', 's', '1-1', NULL, NULL, NULL, NULL, NULL, 'r') IS NOT NULL AS recorded;
SELECT * FROM inbox_consume('role-test', 'SELECT apply_transfer($1, $2, $3, $4, $5)',
    pg_temp.b(ARRAY['00000000-0000-4000-8000-0000000000e2']), pg_temp.b(ARRAY['t']), NULL,
    pg_temp.b(ARRAY['{"amount": 1, "currency": "CHF"}']), NULL);
SELECT pg_temp.try($$SELECT count(*) FROM outbox.inbox$$);
SELECT pg_temp.try($$SELECT count(*) FROM outbox.dead_letters$$);
SELECT pg_temp.try($$SELECT inbox_replay(1, 'SELECT 1')$$);
SELECT pg_temp.try($$SELECT outbox_emit('t', 'k', '{}')$$);
SELECT pg_temp.try($$SELECT * FROM outbox_fetch('g')$$);
RESET ROLE;

DROP FUNCTION apply_transfer(text, text, jsonb, jsonb, uuid);
DROP TABLE balances;
TRUNCATE outbox.inbox, outbox.dead_letters;
DELETE FROM outbox.consumers;
DROP ROLE regress_outbox_consumer;
