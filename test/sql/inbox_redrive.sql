-- Parked keys drain in steps: inbox_redrive_step(), which the relay that
-- reads the stream runs, one transaction each, once inbox_redrive() or
-- inbox_skip() set a dead key draining (or its retried head applied). A
-- step applies the head's dead letter alone, then the parked entries in
-- stream order, at most max_entries at a time; a failure stops it; an
-- entry found malformed or in conflict is dead-lettered alone. The same
-- test runs on both engines (make installcheck-sql-engine).
TRUNCATE outbox.inbox, outbox.dead_letters, outbox.parked_keys, outbox.parked_entries RESTART IDENTITY;
DELETE FROM outbox.consumers;
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
-- The message, detail and hint of an error.
CREATE FUNCTION pg_temp.why(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    m text;
    d text;
    h text;
BEGIN
    EXECUTE q;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS m = MESSAGE_TEXT, d = PG_EXCEPTION_DETAIL, h = PG_EXCEPTION_HINT;
    RETURN sqlstate || ': ' || m || ' | ' || coalesce(d, '') || ' | ' || coalesce(h, '');
END
$$;
CREATE FUNCTION pg_temp.u(t text) RETURNS bytea LANGUAGE sql AS $$ SELECT convert_to(t, 'UTF8') $$;
-- Event n: its id, its stream entry id ("<n>-0": text order is not
-- stream order past 9), its fields as the relay reads them.
CREATE FUNCTION pg_temp.id(n int) RETURNS uuid LANGUAGE sql AS
    $$ SELECT format('00000000-0000-4000-8000-%s', lpad(n::text, 12, '0'))::uuid $$;
CREATE FUNCTION pg_temp.eid(n int) RETURNS text LANGUAGE sql AS $$ SELECT n || '-0' $$;
CREATE FUNCTION pg_temp.fields(key text, n int) RETURNS bytea[] LANGUAGE sql AS $$
    SELECT ARRAY[pg_temp.u('event_id'), pg_temp.u(pg_temp.id(n)::text), pg_temp.u('topic'), pg_temp.u('accounts'),
                 pg_temp.u('key'), pg_temp.u(key), pg_temp.u('payload'), pg_temp.u(jsonb_build_object('n', n)::text)]
$$;
-- Delivers events of one stream as the relay does (inbox_consume_keyed,
-- park => true): payloads {"n": n} unless given as text.
CREATE FUNCTION pg_temp.deliver(stream text, keys text[], ns int[], payloads text[] DEFAULT NULL)
RETURNS TABLE (entry_id text, status text) LANGUAGE sql AS $$
    SELECT pg_temp.eid(ns[c.ord]), c.status
      FROM inbox_consume_keyed('ledger', 'SELECT redrive_apply($1, $2, $3, $5)',
                               array_fill(stream, ARRAY[cardinality(ns)]),
                               ARRAY(SELECT pg_temp.eid(n) FROM unnest(ns) WITH ORDINALITY x(n, o) ORDER BY o),
                               ARRAY(SELECT pg_temp.u(pg_temp.id(n)::text) FROM unnest(ns) WITH ORDINALITY x(n, o) ORDER BY o),
                               array_fill(pg_temp.u('accounts'), ARRAY[cardinality(ns)]),
                               ARRAY(SELECT pg_temp.u(k) FROM unnest(keys) WITH ORDINALITY x(k, o) ORDER BY o),
                               ARRAY(SELECT pg_temp.u(coalesce(payloads[o], jsonb_build_object('n', n)::text))
                                       FROM unnest(ns) WITH ORDINALITY x(n, o) ORDER BY o),
                               NULL) c
     ORDER BY c.ord
$$;
-- A key dead-lettered at the head event n (its third delivery), as the
-- relay records it.
CREATE FUNCTION pg_temp.dead(stream text, key text, n int) RETURNS text LANGUAGE sql AS $$
    SELECT p.state FROM inbox_park_key('ledger', stream, pg_temp.eid(n), pg_temp.fields(key, n), 'handler failed', 'P0001', 3, true) p
$$;
GRANT EXECUTE ON FUNCTION pg_temp.try(text), pg_temp.why(text), pg_temp.u(text), pg_temp.id(int), pg_temp.eid(int),
    pg_temp.fields(text, int), pg_temp.deliver(text, text[], int[], text[]), pg_temp.dead(text, text, int) TO PUBLIC;

CREATE ROLE regress_redrive IN ROLE outbox_consumer;
CREATE ROLE regress_redrive_other IN ROLE outbox_consumer;
CREATE ROLE regress_redrive_nobody;
SELECT inbox_consumer_create('ledger', 'regress_redrive');
SELECT inbox_consumer_create('other', 'regress_redrive_other');

-- The handler: records what it applies, in order; raises for the events
-- (key, n) or the keys (key, NULL) of redrive_broken.
CREATE TABLE redrive_applied (seq bigserial, key text, n int, event_id uuid);
CREATE TABLE redrive_broken (key text, n int);
CREATE FUNCTION redrive_apply(topic text, key text, payload jsonb, event_id uuid) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM redrive_broken b
                WHERE b.key = redrive_apply.key AND (b.n IS NULL OR b.n = (payload->>'n')::int)) THEN
        RAISE EXCEPTION 'cannot apply event % of key %', payload->>'n', left(key, 12);
    END IF;
    INSERT INTO redrive_applied (key, n, event_id) VALUES (key, (payload->>'n')::int, event_id);
END
$$;
GRANT SELECT, INSERT, DELETE ON redrive_applied, redrive_broken TO PUBLIC;
GRANT USAGE ON SEQUENCE redrive_applied_seq_seq TO PUBLIC;
\set handler 'SELECT redrive_apply($1, $2, $3, $5)'

-- A (stream s) is dead at its event 7; 8 to 11 come while it is parked,
-- B flows meanwhile.
SELECT pg_temp.dead('s', 'A', 7);
SET ROLE regress_redrive;
SELECT * FROM pg_temp.deliver('s', '{A,B,A,A,A}', '{8,12,9,10,11}');
SELECT consumer, stream, key, key_bytes, state, parked, deliveries, reason, sqlstate, head_entry_id,
       dead_letter_id, redrive_requested_at IS NULL AS not_requested
  FROM inbox_parked_keys('ledger');
-- A dead key does not drain until it is redriven.
SELECT * FROM inbox_redrive_step('ledger', :'handler', 's', pg_temp.u('A'));
SELECT * FROM inbox_redrive('ledger', 'A');
SELECT * FROM inbox_redrive('ledger', 'A');
SELECT state, redrive_requested_by = session_user AS by_session_user, redrive_requested_at IS NOT NULL AS requested_at
  FROM inbox_parked_keys('ledger');
-- The dead letter first, alone (max_entries is 64); then the parked
-- entries in stream order, 2 at a time; the last step un-parks the key.
SELECT * FROM inbox_redrive_step('ledger', :'handler', 's', pg_temp.u('A'));
SELECT key, n FROM redrive_applied ORDER BY seq;
SELECT * FROM inbox_redrive_step('ledger', :'handler', 's', pg_temp.u('A'), 2);
SELECT * FROM inbox_redrive_step('ledger', :'handler', 's', pg_temp.u('A'), 2);
SELECT * FROM inbox_redrive_step('ledger', :'handler', 's', pg_temp.u('A'), 2);
SELECT key, n FROM redrive_applied ORDER BY seq;
RESET ROLE;
SELECT entry_id, replayed_at IS NOT NULL AS replayed, skipped_at IS NULL AS not_skipped FROM outbox.dead_letters;
SELECT (SELECT count(*) FROM outbox.parked_keys) AS keys, (SELECT count(*) FROM outbox.parked_entries) AS entries;
-- A flows again.
SET ROLE regress_redrive;
SELECT * FROM pg_temp.deliver('s', '{A}', '{13}');
SELECT * FROM inbox_parked_keys('ledger');
RESET ROLE;

-- Arguments.
SET ROLE regress_redrive;
SELECT pg_temp.why($$SELECT * FROM inbox_redrive_step('ledger', 'SELECT 1', 's', '\x41', 0)$$);
SELECT pg_temp.why($$SELECT * FROM inbox_redrive_step('ledger', 'SELECT 1', 's', '\x41', 65)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_redrive_step('ledger', 'SELECT 1', 's', '\x41', -1)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_redrive_step('ledger', 'SELECT 1', 's', '\x41', 64)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_redrive_step('ledger', 'SELECT 1', 's', '\x41', 1)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_redrive_step(NULL, 'SELECT 1', 's', '\x41')$$);
SELECT pg_temp.try($$SELECT * FROM inbox_redrive_step('ledger', NULL, 's', '\x41')$$);
SELECT pg_temp.try($$SELECT * FROM inbox_redrive_step('ledger', 'SELECT 1', NULL, '\x41')$$);
SELECT pg_temp.try($$SELECT * FROM inbox_redrive_step('ledger', 'SELECT 1', 's', NULL)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_redrive_step('ledger', 'SELECT 1', 's', '\x41', NULL)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_redrive_step('ledger', '', 's', '\x41')$$);
SELECT pg_temp.try($$SELECT * FROM inbox_parked_keys(NULL)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_redrive(NULL, 'A')$$);
SELECT pg_temp.try($$SELECT * FROM inbox_redrive('ledger', NULL)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_skip(NULL, 'A')$$);
SELECT pg_temp.try($$SELECT * FROM inbox_skip('ledger', NULL)$$);
SELECT pg_temp.try($$SELECT * FROM outbox.parked_take('ledger', NULL, '\x41', 1)$$);
SELECT pg_temp.try($$SELECT * FROM outbox.parked_take('ledger', 's', NULL, 1)$$);
SELECT pg_temp.try($$SELECT * FROM outbox.parked_take('ledger', 's', '\x41', NULL)$$);
SELECT pg_temp.try($$SELECT * FROM outbox.parked_take('ledger', 's', '\x41', 65)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_parked_keys('')$$);
SELECT pg_temp.try($$SELECT * FROM inbox_redrive(E'bad\nname', 'A')$$);
RESET ROLE;

-- A failure stops the step: C's event 22 fails; 21 before it applies,
-- 23 and 24 after it stay parked.
SELECT pg_temp.dead('s', 'C', 20);
INSERT INTO redrive_broken VALUES ('C', 22);
SET ROLE regress_redrive;
SELECT * FROM pg_temp.deliver('s', '{C,C,C,C}', '{21,22,23,24}');
SELECT result FROM inbox_redrive('ledger', 'C');
SELECT * FROM inbox_redrive_step('ledger', :'handler', 's', pg_temp.u('C'));
SELECT * FROM inbox_redrive_step('ledger', :'handler', 's', pg_temp.u('C'));
SELECT key, n FROM redrive_applied WHERE key = 'C' ORDER BY seq;
SELECT state, parked, head_entry_id FROM inbox_parked_keys('ledger');
-- The relay records the failure (a delivery of 22), and tries again
-- later: the second failure is delivery 2, which it dead-letters.
SELECT * FROM inbox_park_key('ledger', 's', '22-0', NULL, 'cannot apply event 22 of key C', 'P0001', 1, false);
SELECT applied, failed_entry_id, deliveries, key_state
  FROM inbox_redrive_step('ledger', :'handler', 's', pg_temp.u('C'));
SELECT state FROM inbox_park_key('ledger', 's', '22-0', NULL, 'cannot apply event 22 of key C', 'P0001', 2, true);
SELECT state, parked, head_entry_id, deliveries, reason FROM inbox_parked_keys('ledger');
-- Fixed, and redriven: 22 (now the dead letter) alone, then 23 and 24.
RESET ROLE;
DELETE FROM redrive_broken;
SET ROLE regress_redrive;
SELECT result FROM inbox_redrive('ledger', 'C');
SELECT * FROM inbox_redrive_step('ledger', :'handler', 's', pg_temp.u('C'));
SELECT * FROM inbox_redrive_step('ledger', :'handler', 's', pg_temp.u('C'));
SELECT key, n FROM redrive_applied WHERE key = 'C' ORDER BY seq;
RESET ROLE;
SELECT entry_id, key, deliveries, replayed_at IS NOT NULL AS replayed FROM outbox.dead_letters WHERE key = 'C' ORDER BY id;

-- The dead letter fails again: the step reports it (its next delivery)
-- and applies nothing after it; recorded, the key is dead again. Skipped,
-- the rest drains without it.
SELECT pg_temp.dead('s', 'D', 30);
INSERT INTO redrive_broken VALUES ('D', NULL);
SET ROLE regress_redrive;
SELECT * FROM pg_temp.deliver('s', '{D}', '{31}');
SELECT result FROM inbox_redrive('ledger', 'D');
RESET ROLE;
DELETE FROM redrive_broken WHERE n IS NULL;
INSERT INTO redrive_broken VALUES ('D', 30);
SET ROLE regress_redrive;
SELECT * FROM inbox_redrive_step('ledger', :'handler', 's', pg_temp.u('D'));
SELECT state FROM inbox_park_key('ledger', 's', '30-0', NULL, 'cannot apply event 30 of key D', 'P0001', 4, true);
SELECT * FROM inbox_skip('ledger', 'D');
SELECT * FROM inbox_skip('ledger', 'D');
SELECT * FROM inbox_redrive_step('ledger', :'handler', 's', pg_temp.u('D'));
SELECT key, n FROM redrive_applied WHERE key = 'D' ORDER BY seq;
RESET ROLE;
SELECT entry_id, deliveries, replayed_at IS NULL AS not_replayed, skipped_by = session_user AS skipped_by_session_user,
       skipped_at IS NOT NULL AS skipped
  FROM outbox.dead_letters WHERE key = 'D';
DELETE FROM redrive_broken;

-- Malformed and conflicting entries of a draining key are dead-lettered
-- alone and the step goes on: E's 41 is no JSON, 42 was applied before
-- with another payload.
SELECT inbox_apply('ledger', pg_temp.id(42), '{"n": 42, "v": 1}');
SELECT pg_temp.dead('s', 'E', 40);
SET ROLE regress_redrive;
SELECT * FROM pg_temp.deliver('s', '{E,E,E}', '{41,42,43}', '{"{",NULL,NULL}');
SELECT result FROM inbox_redrive('ledger', 'E');
SELECT * FROM inbox_redrive_step('ledger', :'handler', 's', pg_temp.u('E'));
SELECT * FROM inbox_redrive_step('ledger', :'handler', 's', pg_temp.u('E'));
SELECT key, n FROM redrive_applied WHERE key = 'E' ORDER BY seq;
RESET ROLE;
SELECT entry_id, key, reason, sqlstate, deliveries, applied_payload, cardinality(fields) AS fields
  FROM outbox.dead_letters WHERE entry_id IN ('41-0', '42-0') ORDER BY id;
-- Also when the batch raised and the entries go one by one: F's 45 is
-- dead-lettered, 46 fails and stops the step, 47 stays parked.
SELECT pg_temp.dead('s', 'F', 44);
INSERT INTO redrive_broken VALUES ('F', 46);
SET ROLE regress_redrive;
SELECT * FROM pg_temp.deliver('s', '{F,F,F}', '{45,46,47}', '{"[1, 2",NULL,NULL}');
SELECT result FROM inbox_redrive('ledger', 'F');
SELECT applied FROM inbox_redrive_step('ledger', :'handler', 's', pg_temp.u('F'));
SELECT * FROM inbox_redrive_step('ledger', :'handler', 's', pg_temp.u('F'));
SELECT state, parked FROM inbox_parked_keys('ledger');
RESET ROLE;
SELECT entry_id, sqlstate FROM outbox.dead_letters WHERE entry_id = '45-0';
DELETE FROM redrive_broken;
SET ROLE regress_redrive;
SELECT * FROM inbox_redrive_step('ledger', :'handler', 's', pg_temp.u('F'));
SELECT key, n FROM redrive_applied WHERE key = 'F' ORDER BY seq;
RESET ROLE;

-- Each state's answer. Retrying (its head is retried by the relay):
-- neither redrive nor skip changes it, and a step does nothing.
SELECT state FROM inbox_park_key('ledger', 's', '50-0', pg_temp.fields('R', 50), 'handler failed', 'P0001', 1, false);
SET ROLE regress_redrive;
SELECT * FROM pg_temp.deliver('s', '{R}', '{51}');
SELECT * FROM inbox_redrive('ledger', 'R');
SELECT * FROM inbox_skip('ledger', 'R');
SELECT * FROM inbox_redrive_step('ledger', :'handler', 's', pg_temp.u('R'));
-- Not parked: a no-op, one row.
SELECT * FROM inbox_redrive('ledger', 'nobody');
SELECT * FROM inbox_redrive('ledger', 'nobody', 's');
SELECT * FROM inbox_skip('ledger', 'nobody');
SELECT * FROM inbox_redrive('ledger', 'R', 'elsewhere');
SELECT * FROM inbox_redrive_step('ledger', :'handler', 's', pg_temp.u('nobody'));
RESET ROLE;
-- A key dead in two streams: redriven in one, then in both; skipped in
-- one while draining with its dead letter pending, then nothing to skip.
SELECT pg_temp.dead('s', 'M', 60);
SELECT pg_temp.dead('s2', 'M', 61);
SET ROLE regress_redrive;
SELECT * FROM inbox_redrive('ledger', 'M', 's2');
SELECT * FROM inbox_redrive('ledger', 'M');
SELECT * FROM inbox_skip('ledger', 'M', 's2');
SELECT * FROM inbox_skip('ledger', 'M', 's2');
SELECT stream, key, state FROM inbox_parked_keys('ledger', '{s2}');
SELECT stream, key, state FROM inbox_parked_keys('ledger', '{s,s2,nope}');
SELECT count(*) FROM inbox_parked_keys('ledger', '{}');
SELECT (SELECT key_state FROM inbox_redrive_step('ledger', :'handler', 's', pg_temp.u('M'), 1)) AS s_first,
       (SELECT key_state FROM inbox_redrive_step('ledger', :'handler', 's2', pg_temp.u('M'), 1)) AS s2_first;
SELECT key, n FROM redrive_applied WHERE key = 'M' ORDER BY seq;
RESET ROLE;
-- A dead key whose dead letter was replayed by hand: nothing to skip; it
-- drains.
SELECT pg_temp.dead('s', 'H', 62);
SET ROLE regress_redrive;
SELECT inbox_replay((SELECT dead_letter_id FROM inbox_parked_keys('ledger') WHERE key = 'H'), :'handler');
SELECT * FROM inbox_skip('ledger', 'H');
SELECT * FROM inbox_redrive_step('ledger', :'handler', 's', pg_temp.u('H'));
RESET ROLE;
-- A dead letter with no event (the stream lost the entry before its
-- fields were kept): it cannot be redriven, only skipped.
SELECT pg_temp.dead('s', 'Z', 63);
UPDATE outbox.dead_letters SET fields = NULL, event_id = NULL, payload = NULL WHERE entry_id = '63-0';
SET ROLE regress_redrive;
SELECT * FROM pg_temp.deliver('s', '{Z}', '{64}');
SELECT * FROM inbox_redrive('ledger', 'Z');
SELECT * FROM inbox_skip('ledger', 'Z');
SELECT * FROM inbox_redrive_step('ledger', :'handler', 's', pg_temp.u('Z'));
SELECT key, n FROM redrive_applied WHERE key = 'Z' ORDER BY seq;
SELECT stream, key, state FROM inbox_parked_keys('ledger');
RESET ROLE;

-- Only members of the consumer's owner (and admins) list, redrive, skip
-- and drain its keys.
SET ROLE regress_redrive_other;
SELECT pg_temp.try($$SELECT * FROM inbox_parked_keys('ledger')$$);
SELECT pg_temp.try($$SELECT * FROM inbox_redrive('ledger', 'R')$$);
SELECT pg_temp.try($$SELECT * FROM inbox_skip('ledger', 'R')$$);
SELECT pg_temp.try($$SELECT * FROM inbox_redrive_step('ledger', 'SELECT 1', 's', '\x52')$$);
SELECT pg_temp.try($$SELECT * FROM outbox.parked_take('ledger', 's', '\x52', 1)$$);
SELECT pg_temp.try($$SELECT * FROM outbox.parked_take_unchecked('ledger', 's', '\x52', 1)$$);
SELECT pg_temp.try($$SELECT * FROM outbox.inbox_redrive_unchecked('ledger', 'R', NULL)$$);
SELECT pg_temp.try($$SELECT count(*) FROM outbox.parked_keys$$);
SELECT pg_temp.try($$SELECT count(*) FROM outbox.parked_entries$$);
SELECT pg_temp.try($$SELECT * FROM inbox_parked_keys('unregistered')$$);
SELECT count(*) FROM inbox_parked_keys('other');
RESET ROLE;
SET ROLE regress_redrive_nobody;
SELECT pg_temp.try($$SELECT * FROM inbox_redrive('ledger', 'R')$$);
RESET ROLE;
SELECT state FROM inbox_parked_keys('ledger') WHERE key = 'R';

-- A key of 1 MB, and a key with control characters (valid UTF-8): they
-- park, list and redrive by their exact text.
SELECT pg_temp.dead('s', repeat('é', 524288), 70);
SELECT pg_temp.dead('s', E'ctl\x01\x02\t\n\x1b\x7f "quoted" é', 80);
SET ROLE regress_redrive;
SELECT * FROM pg_temp.deliver('s', ARRAY[repeat('é', 524288), E'ctl\x01\x02\t\n\x1b\x7f "quoted" é'], '{71,81}');
SELECT octet_length(key_bytes) AS bytes, key = repeat('é', 524288) AS same, state, parked
  FROM inbox_parked_keys('ledger') WHERE head_entry_id = '70-0';
SELECT key_bytes, key = E'ctl\x01\x02\t\n\x1b\x7f "quoted" é' AS same, state, parked
  FROM inbox_parked_keys('ledger') WHERE head_entry_id = '80-0';
SELECT * FROM inbox_redrive('ledger', repeat('é', 524287));
SELECT * FROM inbox_redrive('ledger', E'ctl\x01\x02\t\n\x1b\x7f "quoted" ');
SELECT stream, state, result FROM inbox_redrive('ledger', repeat('é', 524288));
SELECT stream, state, result FROM inbox_redrive('ledger', E'ctl\x01\x02\t\n\x1b\x7f "quoted" é');
SELECT applied, key_state FROM inbox_redrive_step('ledger', :'handler', 's', convert_to(repeat('é', 524288), 'UTF8'));
SELECT applied, key_state FROM inbox_redrive_step('ledger', :'handler', 's', convert_to(repeat('é', 524288), 'UTF8'));
SELECT applied, key_state FROM inbox_redrive_step('ledger', :'handler', 's', pg_temp.u(E'ctl\x01\x02\t\n\x1b\x7f "quoted" é'));
SELECT applied, key_state FROM inbox_redrive_step('ledger', :'handler', 's', pg_temp.u(E'ctl\x01\x02\t\n\x1b\x7f "quoted" é'));
SELECT n, octet_length(key) AS key_bytes FROM redrive_applied WHERE n BETWEEN 70 AND 81 ORDER BY seq;
RESET ROLE;
-- A key that does not decode is listed without its text.
INSERT INTO outbox.parked_keys (consumer, stream, key, state, head_entry_id, dead_letter_id, reason)
VALUES ('ledger', 's', '\xff41', 'dead', '90-0', 1, 'not UTF-8');
SELECT stream, key, key_bytes, state FROM inbox_parked_keys('ledger') ORDER BY head_entry_id;
DELETE FROM outbox.parked_keys WHERE head_entry_id = '90-0';

-- 100,000 parked entries of one key (stored as that many deliveries
-- would have parked them, in another order than the stream's) drain in
-- 1 + 1,563 steps (the dead letter, then at most 64 entries each), each
-- its own transaction, in stream order.
SELECT pg_temp.dead('bulk', 'K', 99);
INSERT INTO outbox.parked_entries (consumer, stream, entry_id, event_id, topic, key, payload)
SELECT 'ledger', 'bulk', (1000 + i / 7) || '-' || (i % 7), pg_temp.u(pg_temp.id(100 + i)::text), pg_temp.u('accounts'),
       pg_temp.u('K'), pg_temp.u(format('{"n": %s}', 100 + i))
  FROM generate_series(0, 99999) i
 ORDER BY md5(i::text);
UPDATE outbox.parked_keys SET parked = 100000 WHERE stream = 'bulk';
-- Analyzed, as autovacuum would after so large an insert (plans made
-- while the table was small are made again).
ANALYZE outbox.parked_entries;
-- Drains the key, at most max_steps steps (a transaction each), as the
-- relay does: until it is un-parked or a step fails.
CREATE PROCEDURE pg_temp.drain(stream text, key bytea, max_steps int, INOUT steps int DEFAULT 0,
                               INOUT most int DEFAULT 0, INOUT last_state text DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    LOOP
        SELECT * INTO r FROM inbox_redrive_step('ledger', 'SELECT redrive_apply($1, $2, $3, $5)', stream, key);
        steps := steps + 1;
        most := greatest(most, r.applied);
        last_state := r.key_state;
        COMMIT;
        EXIT WHEN r.key_state IS NULL OR r.failed_entry_id IS NOT NULL OR steps = max_steps;
    END LOOP;
END
$$;
GRANT EXECUTE ON PROCEDURE pg_temp.drain(text, bytea, int, int, int, text) TO PUBLIC;
-- (The steps' commits need not wait for the disk here. Between parts of
-- the drain the table is vacuumed, as autovacuum would: until then each
-- step's scan passes the index entries of the entries drained before it.)
SET synchronous_commit = off;
SET ROLE regress_redrive;
SELECT result FROM inbox_redrive('ledger', 'K');
CALL pg_temp.drain('bulk', '\x4b', 400);
RESET ROLE;
VACUUM outbox.parked_entries;
SET ROLE regress_redrive;
CALL pg_temp.drain('bulk', '\x4b', 400);
RESET ROLE;
VACUUM outbox.parked_entries;
SET ROLE regress_redrive;
CALL pg_temp.drain('bulk', '\x4b', 400);
RESET ROLE;
VACUUM outbox.parked_entries;
SET ROLE regress_redrive;
CALL pg_temp.drain('bulk', '\x4b', 400);
SELECT count(*) AS applied, min(n), max(n),
       count(*) FILTER (WHERE n <> 98 + row) AS out_of_order
  FROM (SELECT n, row_number() OVER (ORDER BY seq) AS row FROM redrive_applied WHERE key = 'K') x;
RESET ROLE;
RESET synchronous_commit;
SELECT (SELECT count(*) FROM outbox.parked_keys WHERE stream = 'bulk') AS keys,
       (SELECT count(*) FROM outbox.parked_entries WHERE stream = 'bulk') AS entries;

-- A consumer with parked keys is dropped only with forget => true, which
-- deletes them.
SELECT inbox_consumer_create('dropme', 'regress_redrive');
SELECT state FROM inbox_park_key('dropme', 's', '1-0', pg_temp.fields('A', 1), 'handler failed', 'P0001', 3, true);
SELECT c.status FROM inbox_consume_keyed('dropme', :'handler', '{s}', '{2-0}', ARRAY[pg_temp.u(pg_temp.id(2)::text)],
                                         ARRAY[pg_temp.u('accounts')], ARRAY[pg_temp.u('A')],
                                         ARRAY[pg_temp.u('{"n": 2}')], NULL) c;
SELECT pg_temp.why($$SELECT inbox_consumer_drop('dropme')$$);
SELECT inbox_consumer_drop('dropme', forget => true);
SELECT (SELECT count(*) FROM outbox.parked_keys WHERE consumer = 'dropme') AS keys,
       (SELECT count(*) FROM outbox.parked_entries WHERE consumer = 'dropme') AS entries,
       (SELECT count(*) FROM outbox.dead_letters WHERE consumer = 'dropme') AS dead_letters;
-- With nothing parked, as before.
SELECT inbox_consumer_drop('other');

DROP TABLE redrive_applied, redrive_broken;
DROP FUNCTION redrive_apply(text, text, jsonb, uuid);
TRUNCATE outbox.inbox, outbox.dead_letters, outbox.parked_keys, outbox.parked_entries RESTART IDENTITY;
DELETE FROM outbox.consumers;
DROP ROLE regress_redrive, regress_redrive_other, regress_redrive_nobody;
