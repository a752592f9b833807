-- Parked keys (part 45): inbox_consume_keyed(), inbox_park_key() and the
-- entries outbox.parked_match(), parked_add() and parked_settle(). Runs on
-- both engines with this one expected output.
TRUNCATE outbox.inbox, outbox.dead_letters, outbox.parked_keys, outbox.parked_entries RESTART IDENTITY;
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
-- An error with its detail and hint.
CREATE FUNCTION pg_temp.explain(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    d text;
    h text;
BEGIN
    EXECUTE q;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS d = PG_EXCEPTION_DETAIL, h = PG_EXCEPTION_HINT;
    RETURN sqlstate || ': ' || sqlerrm || E'\nDETAIL: ' || coalesce(d, '') || E'\nHINT: ' || coalesce(h, '');
END
$$;
-- Stream fields arrive as bytes: text as UTF-8 bytes, NULL kept.
CREATE FUNCTION pg_temp.b(a text[]) RETURNS bytea[] LANGUAGE sql AS
    $$ SELECT array_agg(convert_to(x, 'UTF8') ORDER BY o) FROM unnest(a) WITH ORDINALITY u(x, o) $$;
GRANT EXECUTE ON FUNCTION pg_temp.try(text), pg_temp.explain(text), pg_temp.b(text[]) TO PUBLIC;

DELETE FROM outbox.consumers;
SELECT inbox_consumer_create(c, current_user::regrole)
  FROM unnest(ARRAY['parker', 'plain', 'keyed', 'other']) c;

-- The handler: records what it applied, in order; raises for a key in
-- park_fail or a payload with "fail".
CREATE TABLE park_applied (seq serial, key text, n integer);
CREATE TABLE park_fail (key text PRIMARY KEY);
CREATE FUNCTION park_apply(key text, payload jsonb) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF payload ? 'fail' OR EXISTS (SELECT 1 FROM park_fail f WHERE f.key = park_apply.key) THEN
        RAISE EXCEPTION 'cannot apply % of key %', payload->>'n', key;
    END IF;
    INSERT INTO park_applied (key, n) VALUES (key, (payload->>'n')::integer);
END
$$;

-- A batch of one stream: entry i is "1-<n>", its event id ends in n, its
-- payload is {"n": n}; a NULL key is no key field.
CREATE FUNCTION pg_temp.consume(c text, ks text[], ns integer[], iso boolean DEFAULT false, pk boolean DEFAULT true,
                                s text DEFAULT 'orders')
RETURNS TABLE (ord integer, status text, error_code text, error_message text) LANGUAGE sql AS $$
    SELECT * FROM inbox_consume_keyed(c, 'SELECT park_apply($2, $3)',
        array_fill(s, ARRAY[cardinality(ns)]),
        ARRAY(SELECT '1-' || n FROM unnest(ns) WITH ORDINALITY u(n, o) ORDER BY o),
        ARRAY(SELECT convert_to('00000000-0000-4000-8000-' || lpad(n::text, 12, '0'), 'UTF8')
                FROM unnest(ns) WITH ORDINALITY u(n, o) ORDER BY o),
        array_fill(convert_to('t', 'UTF8'), ARRAY[cardinality(ns)]),
        ARRAY(SELECT convert_to(k, 'UTF8') FROM unnest(ks) WITH ORDINALITY u(k, o) ORDER BY o),
        ARRAY(SELECT convert_to(jsonb_build_object('n', n)::text, 'UTF8') FROM unnest(ns) WITH ORDINALITY u(n, o) ORDER BY o),
        NULL, iso, pk)
$$;
-- The statuses of a batch on one line.
CREATE FUNCTION pg_temp.statuses(c text, ks text[], ns integer[], iso boolean DEFAULT false, pk boolean DEFAULT true,
                                 s text DEFAULT 'orders')
RETURNS text LANGUAGE sql AS $$
    SELECT string_agg(r.ord || ':' || r.status || coalesce(' (' || r.error_message || ')', ''), ', ' ORDER BY r.ord)
      FROM pg_temp.consume(c, ks, ns, iso, pk, s) r
$$;
-- An entry's raw fields, as the relay sends them to inbox_park_key().
CREATE FUNCTION pg_temp.fields(k text, n integer) RETURNS bytea[] LANGUAGE sql AS $$
    SELECT pg_temp.b(ARRAY['event_id', '00000000-0000-4000-8000-' || lpad(n::text, 12, '0'), 'topic', 't']
                     || CASE WHEN k IS NULL THEN ARRAY[]::text[] ELSE ARRAY['key', k] END
                     || ARRAY['payload', jsonb_build_object('n', n)::text, 'prev', '0-0'])
$$;
-- inbox_park_key()'s row, with the dead letter named by its entry.
CREATE FUNCTION pg_temp.park(c text, s text, e text, f bytea[], reason text, code text, deliveries integer, dead boolean)
RETURNS TABLE (state text, dead_letter text) LANGUAGE plpgsql AS $$
DECLARE
    dl bigint;
BEGIN
    SELECT r.state, r.dead_letter_id INTO state, dl FROM inbox_park_key(c, s, e, f, reason, code, deliveries, dead) r;
    SELECT d.entry_id INTO dead_letter FROM outbox.dead_letters d WHERE d.id = dl;
    RETURN NEXT;
END
$$;
-- The parked keys and entries.
CREATE FUNCTION pg_temp.parked() RETURNS TABLE (what text) LANGUAGE sql AS $$
    SELECT format('key %s/%s %s head %s parked %s deliveries %s%s%s', k.stream, convert_from(k.key, 'UTF8'), k.state,
                  k.head_entry_id, k.parked, k.deliveries,
                  CASE WHEN k.head_fields IS NOT NULL THEN ' (fields kept)' ELSE '' END,
                  coalesce(' dead letter ' || d.entry_id, ''))
      FROM outbox.parked_keys k LEFT JOIN outbox.dead_letters d ON d.id = k.dead_letter_id
     UNION ALL
    SELECT format('entry %s/%s %s deliveries %s%s', e.stream, convert_from(e.key, 'UTF8'), e.entry_id, e.deliveries,
                  coalesce(' (' || e.reason || ')', ''))
      FROM outbox.parked_entries e
     ORDER BY 1
$$;
GRANT EXECUTE ON FUNCTION pg_temp.consume(text, text[], integer[], boolean, boolean, text),
    pg_temp.statuses(text, text[], integer[], boolean, boolean, text), pg_temp.fields(text, integer),
    pg_temp.parked(),
    pg_temp.park(text, text, text, bytea[], text, text, integer, boolean) TO PUBLIC;

--
-- The fast path: nothing parked, and it is inbox_consume() itself, with
-- the same results (applied, duplicate, malformed, conflict) for the same
-- batch, here for two consumers with the same history.
--
CREATE TEMP TABLE batch (o integer, stream text, entry_id text, event_id bytea, topic bytea, key bytea, payload bytea);
INSERT INTO batch VALUES
    (1, 's', '5-1', convert_to('00000000-0000-4000-8000-00000000a001', 'UTF8'), '\x74', 'A', convert_to('{"n": 1}', 'UTF8')),
    (2, 's', '5-2', convert_to('00000000-0000-4000-8000-00000000a002', 'UTF8'), '\x74', 'B', convert_to('{"n": 2}', 'UTF8')),
    (3, 's', '5-3', convert_to('00000000-0000-4000-8000-00000000a001', 'UTF8'), '\x74', 'A', convert_to('{"n": 1}', 'UTF8')),
    (4, 's', '5-4', convert_to('00000000-0000-4000-8000-00000000a002', 'UTF8'), '\x74', 'B', convert_to('{"n": 99}', 'UTF8')),
    (5, 's', '5-5', convert_to('not-a-uuid', 'UTF8'), '\x74', 'A', convert_to('{"n": 5}', 'UTF8')),
    (6, 's', '5-6', convert_to('00000000-0000-4000-8000-00000000a006', 'UTF8'), '\x74', NULL, '\xff'),
    (7, 's', '5-7', convert_to('00000000-0000-4000-8000-00000000a007', 'UTF8'), '\x74', NULL, convert_to('{"n": 7}', 'UTF8'));
CREATE TEMP TABLE plain_result AS
SELECT * FROM inbox_consume('plain', 'SELECT park_apply($2, $3)',
    ARRAY(SELECT event_id FROM batch ORDER BY o), ARRAY(SELECT topic FROM batch ORDER BY o),
    ARRAY(SELECT key FROM batch ORDER BY o), ARRAY(SELECT payload FROM batch ORDER BY o), NULL);
CREATE TEMP TABLE keyed_result AS
SELECT * FROM inbox_consume_keyed('keyed', 'SELECT park_apply($2, $3)',
    ARRAY(SELECT stream FROM batch ORDER BY o), ARRAY(SELECT entry_id FROM batch ORDER BY o),
    ARRAY(SELECT event_id FROM batch ORDER BY o), ARRAY(SELECT topic FROM batch ORDER BY o),
    ARRAY(SELECT key FROM batch ORDER BY o), ARRAY(SELECT payload FROM batch ORDER BY o), NULL);
SELECT ord, status, error_code FROM keyed_result ORDER BY ord;
UPDATE keyed_result SET error_message = replace(error_message, '"keyed"', '"plain"');
SELECT count(*) AS differences FROM ((TABLE plain_result EXCEPT TABLE keyed_result) UNION ALL (TABLE keyed_result EXCEPT TABLE plain_result)) d;
-- With isolate (and park, no key twice) too: a failing entry fails alone.
INSERT INTO park_fail VALUES ('C');
SELECT pg_temp.statuses('plain', '{C,D}', '{8,9}', iso => true) AS inbox_consume_keyed,
       (SELECT string_agg(r.ord || ':' || r.status || coalesce(' (' || r.error_message || ')', ''), ', ' ORDER BY r.ord)
          FROM inbox_consume('keyed', 'SELECT park_apply($2, $3)', pg_temp.b('{00000000-0000-4000-8000-000000000008,00000000-0000-4000-8000-000000000009}'),
                             pg_temp.b('{t,t}'), pg_temp.b('{C,D}'), pg_temp.b('{"{\"n\": 8}","{\"n\": 9}"}'), NULL, isolate => true) r) AS inbox_consume;
DELETE FROM park_fail;
-- Nothing parked on the way.
SELECT count(*) AS parked_rows FROM outbox.parked_keys;
TRUNCATE park_applied;

--
-- Blocked: with isolate and park, after a keyed entry failed, the later
-- entries of its (stream, key) in the call are not touched; keyless
-- entries never block; another stream's key of the same name is another
-- key.
--
INSERT INTO park_fail VALUES ('A');
SELECT pg_temp.statuses('parker', '{A,B,A,NULL,A,C}', '{1,2,3,4,5,6}', iso => true);
SELECT key, n FROM park_applied ORDER BY seq;
-- The same failure with park => false (on-failure skip): today's
-- behaviour, the later entries of A are tried and fail too.
SELECT pg_temp.statuses('other', '{A,B,A}', '{1,2,3}', iso => true, pk => false);
-- Without isolate the batch fails as one, as inbox_consume() does.
SELECT pg_temp.try($$SELECT * FROM pg_temp.consume('other', '{A,B}', '{11,12}')$$);

TRUNCATE park_applied;
--
-- Parked: the relay records A's failure (retrying, head 1-1) and sends
-- the blocked entries again: they park. Later batches park A's entries too,
-- and B's apply.
--
SELECT * FROM pg_temp.park('parker', 'orders', '1-1', pg_temp.fields('A', 1), 'cannot apply 1 of key A', 'P0001', 1, false);
SELECT pg_temp.statuses('parker', '{A,A}', '{3,5}', iso => true);
SELECT pg_temp.statuses('parker', '{B,A,C,A}', '{7,8,9,10}');
SELECT * FROM pg_temp.parked();
SELECT key, n FROM park_applied ORDER BY seq;
-- Parking is idempotent: a batch delivered again after a lost
-- acknowledgement parks nothing twice.
SELECT pg_temp.statuses('parker', '{A,A}', '{8,10}');
SELECT k.parked, (SELECT count(*) FROM outbox.parked_entries) AS rows FROM outbox.parked_keys k;
-- With park => false (on-failure skip) the parks are honoured all the same.
SELECT pg_temp.statuses('parker', '{A,B}', '{12,13}', pk => false);
-- An entry stores the five fields inbox_consume() reads, as received, and
-- its position.
SELECT entry_id, pos_ms, pos_seq, convert_from(event_id, 'UTF8') AS event_id, convert_from(topic, 'UTF8') AS topic,
       convert_from(key, 'UTF8') AS key, convert_from(payload, 'UTF8') AS payload, headers
  FROM outbox.parked_entries ORDER BY pos_ms, pos_seq;

--
-- The head: retried while it still fails, it fails again (the key stays
-- retrying); once it applies, its key drains, with the later entries
-- parked; settled, the key is un-parked.
--
SELECT pg_temp.statuses('parker', '{A}', '{1}', iso => true);
SELECT * FROM pg_temp.park('parker', 'orders', '1-1', pg_temp.fields('A', 1), 'cannot apply 1 of key A', 'P0001', 2, false);
DELETE FROM park_fail;
SELECT pg_temp.statuses('parker', '{A,A}', '{1,14}');
SELECT * FROM pg_temp.parked();
SELECT key, n FROM park_applied WHERE key = 'A' ORDER BY seq;
SELECT outbox.parked_settle('parker', 'orders', 'A', false, '{1-3,1-5}', false) AS state;
SELECT outbox.parked_settle('parker', 'orders', 'A', false, '{1-8,1-10,1-12,1-14,1-99}', false) AS state;
SELECT * FROM pg_temp.parked();
-- Un-parked, A flows again.
SELECT pg_temp.statuses('parker', '{A}', '{15}');
-- A head that applies on its retry with nothing parked behind it
-- un-parks its key at once.
SELECT * FROM pg_temp.park('parker', 'orders', '1-16', pg_temp.fields('D', 16), 'failed once', 'P0001', 1, false);
SELECT pg_temp.statuses('parker', '{D}', '{16}', iso => true);
SELECT count(*) AS parked_keys FROM outbox.parked_keys;
-- A head that is a duplicate, malformed or a conflict on its retry is
-- settled too (the relay dead-letters a malformed one or a conflict
-- alone): its key drains.
SELECT * FROM pg_temp.park('parker', 'orders', '1-15', pg_temp.fields('A', 15), 'failed once', 'P0001', 1, false);
SELECT pg_temp.statuses('parker', '{A,A}', '{15,17}');
SELECT * FROM pg_temp.parked();
SELECT outbox.parked_settle('parker', 'orders', 'A', false, '{1-17}', false) AS state;
TRUNCATE park_applied;

--
-- A dead key: its head is dead-lettered; its later entries park; its head
-- delivered again (its acknowledgement was lost) is acknowledged, not
-- applied.
--
SELECT * FROM pg_temp.park('parker', 'orders', '1-20', pg_temp.fields('E', 20), 'cannot apply 20 of key E', 'P0001', 3, true);
SELECT pg_temp.statuses('parker', '{E,E,F}', '{20,21,22}');
SELECT * FROM pg_temp.parked();
SELECT entry_id, key, payload, reason, sqlstate, deliveries, cardinality(fields) AS fields
  FROM outbox.dead_letters ORDER BY id;
SELECT key, n FROM park_applied ORDER BY seq;

--
-- inbox_park_key(), case by case.
--
TRUNCATE outbox.dead_letters, outbox.parked_keys, outbox.parked_entries RESTART IDENTITY;
-- A keyed entry, not dead: its key parks retrying, with its fields kept;
-- again (delivered and failed again), its deliveries move.
SELECT * FROM pg_temp.park('parker', 's', '2-1', pg_temp.fields('K', 1), 'first', 'P0001', 1, false);
SELECT * FROM pg_temp.park('parker', 's', '2-1', pg_temp.fields('K', 1), 'second', 'P0002', 2, false);
SELECT reason, sqlstate, deliveries, head_fields = pg_temp.fields('K', 1) AS fields_as_received FROM outbox.parked_keys;
-- The retrying head at --max-deliveries: dead-lettered from its fields,
-- the key dead.
SELECT * FROM pg_temp.park('parker', 's', '2-1', pg_temp.fields('K', 1), 'third', 'P0003', 3, true);
SELECT * FROM pg_temp.parked();
SELECT entry_id, event_id, topic, key, payload, reason, sqlstate, deliveries, fields = pg_temp.fields('K', 1) AS fields_as_received
  FROM outbox.dead_letters;
-- A keyed entry dead at once (--max-deliveries 1): dead-lettered, its key
-- dead.
SELECT * FROM pg_temp.park('parker', 's', '2-2', pg_temp.fields('L', 2), 'at once', NULL, 1, true);
-- A keyless entry: nothing when not dead (state NULL); dead-lettered alone
-- when dead.
SELECT * FROM pg_temp.park('parker', 's', '2-3', pg_temp.fields(NULL, 3), 'keyless', 'P0001', 1, false);
SELECT * FROM pg_temp.park('parker', 's', '2-3', pg_temp.fields(NULL, 3), 'keyless', 'P0001', 2, true);
-- Another entry of a key parked with another head: it parks itself.
SELECT * FROM pg_temp.park('parker', 's', '2-4', pg_temp.fields('K', 4), 'behind', 'P0001', 1, false);
SELECT * FROM pg_temp.park('parker', 's', '2-5', pg_temp.fields('K', 5), 'behind', 'P0001', 1, true);
SELECT * FROM pg_temp.parked();
-- fields NULL, a parked entry failing in a drain: its deliveries move...
SELECT * FROM pg_temp.park('parker', 's', '2-4', NULL, 'drain failed', 'P0001', 1, false);
SELECT * FROM pg_temp.park('parker', 's', '2-4', NULL, 'drain failed again', 'P0001', 1, false);
SELECT * FROM pg_temp.parked();
-- ...and when dead it becomes its key's dead letter and head (its fields
-- rebuilt from what was kept); the key is dead again.
UPDATE outbox.parked_keys SET state = 'draining';
UPDATE outbox.dead_letters SET replayed_at = now() WHERE entry_id = '2-1';
SELECT * FROM pg_temp.park('parker', 's', '2-4', NULL, 'drain gave up', 'P0001', 3, true);
SELECT * FROM pg_temp.parked();
SELECT entry_id, key, payload, reason, deliveries, array_length(fields, 1) AS fields, outbox.entry_field(fields, 'prev') AS prev
  FROM outbox.dead_letters WHERE entry_id = '2-4';
-- fields NULL, a head failing again in a redrive: its dead letter is
-- updated; the key goes back to dead only when dead.
UPDATE outbox.parked_keys SET state = 'draining' WHERE head_entry_id = '2-4';
SELECT * FROM pg_temp.park('parker', 's', '2-4', NULL, 'redrive failed', 'P0004', 4, false);
SELECT reason, sqlstate, deliveries FROM outbox.dead_letters WHERE entry_id = '2-4';
SELECT * FROM pg_temp.park('parker', 's', '2-4', NULL, 'redrive gave up', 'P0004', 5, true);
SELECT * FROM pg_temp.parked();
-- fields NULL, a retrying head gone from the stream (trimmed while
-- pending): dead-lettered from the fields kept, the key dead.
SELECT * FROM pg_temp.park('parker', 's', '2-6', pg_temp.fields('M', 6), 'failed', 'P0001', 1, false);
SELECT * FROM pg_temp.park('parker', 's', '2-6', NULL, 'entry deleted from the stream', NULL, 1, true);
SELECT entry_id, key, payload, reason, fields = pg_temp.fields('M', 6) AS fields_as_received FROM outbox.dead_letters WHERE entry_id = '2-6';
-- fields NULL, any other entry: a plain dead letter when dead (a gap the
-- relay records), nothing otherwise.
SELECT * FROM pg_temp.park('parker', 's', '2-7', NULL, 'gone', NULL, 1, false);
SELECT * FROM pg_temp.park('parker', 's', '2-7', NULL, 'gone', NULL, 1, true);
SELECT entry_id, key, payload, fields FROM outbox.dead_letters WHERE entry_id = '2-7';
-- deliveries below 1 count as 1, as in inbox_dead_letter().
SELECT * FROM pg_temp.park('parker', 's', '2-8', pg_temp.fields('N', 8), 'zero', NULL, -5, false);
SELECT deliveries FROM outbox.parked_keys WHERE head_entry_id = '2-8';
-- Bad input.
SELECT pg_temp.try($$SELECT * FROM inbox_park_key('parker', 's', '2-9', pg_temp.b('{key,K,payload}'), 'odd', NULL, 1, false)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_park_key('parker', 's', '2-9', '{{key,K},{key,K}}'::bytea[], 'two dimensions', NULL, 1, false)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_park_key('parker', NULL, '2-9', NULL, 'r', NULL, 1, false)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_park_key('parker', 's', NULL, NULL, 'r', NULL, 1, false)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_park_key('parker', 's', '2-9', NULL, NULL, NULL, 1, false)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_park_key('parker', 's', '2-9', NULL, 'r', NULL, NULL, false)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_park_key('parker', 's', '2-9', NULL, 'r', NULL, 1, NULL)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_park_key(NULL, 's', '2-9', NULL, 'r', NULL, 1, false)$$);
SELECT pg_temp.explain($$SELECT * FROM inbox_park_key('parker', 's', 'not-an-id', pg_temp.fields('K', 9), 'r', NULL, 1, false)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_park_key('parker', 's', '2-9-1', NULL, 'r', NULL, 1, true)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_park_key('parker', 's', repeat('1', 21) || '-1', NULL, 'r', NULL, 1, true)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_park_key('unknown', 's', '2-9', NULL, 'r', NULL, 1, true)$$);
SELECT count(*) AS dead_letters_after_errors FROM outbox.dead_letters;

--
-- OB005: parking past outbox.config.park_limit fails the whole call, with
-- the counts; nothing of it is parked or applied. Parking again what is
-- parked already never fails.
--
TRUNCATE outbox.dead_letters, outbox.parked_keys, outbox.parked_entries, park_applied RESTART IDENTITY;
UPDATE outbox.config SET park_limit = 3;
SELECT * FROM pg_temp.park('parker', 'orders', '1-30', pg_temp.fields('P', 30), 'failed', 'P0001', 1, false);
SELECT pg_temp.statuses('parker', '{P,P,Q}', '{31,32,33}');
SELECT pg_temp.explain($$SELECT * FROM pg_temp.consume('parker', '{Q,P,P}', '{34,35,36}')$$);
SELECT * FROM pg_temp.parked();
SELECT key, n FROM park_applied ORDER BY seq;
SELECT pg_temp.statuses('parker', '{P,P,P}', '{31,32,35}');
SELECT pg_temp.statuses('parker', '{P,P}', '{31,32}');
SELECT pg_temp.try($$SELECT * FROM inbox_park_key('parker', 'orders', '1-37', pg_temp.fields('P', 37), 'behind', 'P0001', 1, true)$$);
SELECT pg_temp.try($$UPDATE outbox.config SET park_limit = 0$$);
UPDATE outbox.config SET park_limit = DEFAULT;
SELECT pg_temp.statuses('parker', '{P,P}', '{36,37}');

--
-- The subtransactions of a call: at most 64 (I-19), with isolate one per
-- entry applied, parks and blocks in the main transaction; more than 64
-- entries with isolate are refused. Without isolate, parking and applying
-- take one transaction id.
--
TRUNCATE outbox.parked_keys, outbox.parked_entries, park_applied;
SELECT * FROM pg_temp.park('parker', 'orders', '3-1', pg_temp.fields('P', 1), 'failed', 'P0001', 1, false);
INSERT INTO park_fail VALUES ('k1'), ('k7');
SELECT pg_snapshot_xmax(pg_current_snapshot()) AS xmax_before \gset
SELECT status, count(*)
  FROM pg_temp.consume('parker', ARRAY(SELECT CASE WHEN i % 16 = 5 THEN 'P' ELSE 'k' || (i % 21) END FROM generate_series(1, 64) i),
                       ARRAY(SELECT 1000 + i FROM generate_series(1, 64) i), iso => true)
 GROUP BY status ORDER BY status;
SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint - :'xmax_before'::text::bigint <= 65 AS xids_bounded;
SELECT pg_temp.try($$SELECT * FROM pg_temp.consume('parker', array_fill('k'::text, ARRAY[65]), ARRAY(SELECT 2000 + i FROM generate_series(1, 65) i), iso => true)$$);
DELETE FROM park_fail;
SELECT pg_snapshot_xmax(pg_current_snapshot()) AS xmax_before \gset
SELECT status, count(*)
  FROM pg_temp.consume('parker', ARRAY(SELECT CASE WHEN i % 10 = 0 THEN 'P' ELSE 'k' || i END FROM generate_series(1, 100) i),
                       ARRAY(SELECT 3000 + i FROM generate_series(1, 100) i))
 GROUP BY status ORDER BY status;
SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint - :'xmax_before'::text::bigint AS xids_used;
-- Blocked entries are blocked, never applied, even those of a key that
-- comes three times around others.
TRUNCATE outbox.parked_keys, outbox.parked_entries, park_applied;
INSERT INTO park_fail VALUES ('R');
SELECT pg_temp.statuses('parker', '{R,S,R,S,R,T}', '{4001,4002,4003,4004,4005,4006}', iso => true);
SELECT key, n FROM park_applied ORDER BY seq;
DELETE FROM park_fail;

--
-- Keys are bytes: a key of 1 MB parks and matches by its hash; a key with
-- control characters (valid UTF-8) and multibyte characters parks exactly,
-- and a key one byte away is another key; the empty key is a key.
--
TRUNCATE outbox.parked_keys, outbox.parked_entries, park_applied;
SELECT * FROM pg_temp.park('parker', 'orders', '4-1', pg_temp.fields(repeat('x', 1048576), 1), 'big', 'P0001', 1, false);
SELECT pg_temp.statuses('parker', ARRAY[repeat('x', 1048576), repeat('x', 1048575) || 'y', repeat('x', 1048576)], '{5001,5002,5003}');
SELECT octet_length(key) AS key_bytes, octet_length(key_hash) AS hash_bytes, parked FROM outbox.parked_keys;
SELECT entry_id, octet_length(key) AS key_bytes FROM outbox.parked_entries ORDER BY entry_id;
SELECT outbox.parked_settle('parker', 'orders', convert_to(repeat('x', 1048576), 'UTF8'), false, '{1-5001,1-5003}', false) AS state;
SELECT * FROM pg_temp.park('parker', 'orders', '4-2', pg_temp.fields(E'k\x01\x09\x1f\x7f é€😀', 2), 'control', 'P0001', 1, false);
SELECT pg_temp.statuses('parker', ARRAY[E'k\x01\x09\x1f\x7f é€😀', E'k\x01\x09\x1f\x7f é€😁', E'k\x01\x09\x1f\x7f é€', 'k'], '{5011,5012,5013,5014}');
SELECT * FROM pg_temp.park('parker', 'orders', '4-3', pg_temp.fields('', 3), 'empty', 'P0001', 1, false);
SELECT pg_temp.statuses('parker', '{"",NULL}', '{5021,5022}');
SELECT encode(key, 'hex') AS key, state, parked FROM outbox.parked_keys WHERE octet_length(key) < 100 ORDER BY key;
SELECT octet_length(key) AS key_bytes, n FROM park_applied ORDER BY seq;

--
-- Streams: a key parked in one stream is not parked in another; an empty
-- stream name is a name.
--
TRUNCATE outbox.parked_keys, outbox.parked_entries, park_applied;
SELECT * FROM pg_temp.park('parker', '', '5-1', pg_temp.fields('A', 1), 'failed', 'P0001', 1, false);
SELECT pg_temp.statuses('parker', '{A}', '{6001}', s => '') AS empty_stream,
       pg_temp.statuses('parker', '{A}', '{6002}', s => 'orders') AS orders;

--
-- Bad input to inbox_consume_keyed(): NULLs (22004), arrays of another
-- length or shape (22023), a handler that is empty, isolate beyond 64.
--
SELECT pg_temp.try($$SELECT * FROM inbox_consume_keyed('parker', 'SELECT 1', NULL, '{1-1}', pg_temp.b('{00000000-0000-4000-8000-000000000001}'), pg_temp.b('{t}'), NULL, pg_temp.b('{"{}"}'), NULL)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_consume_keyed('parker', 'SELECT 1', '{s}', NULL, pg_temp.b('{00000000-0000-4000-8000-000000000001}'), pg_temp.b('{t}'), NULL, pg_temp.b('{"{}"}'), NULL)$$);
SELECT pg_temp.explain($$SELECT * FROM inbox_consume_keyed('parker', 'SELECT 1', '{s,NULL}', '{1-1,1-2}', pg_temp.b('{00000000-0000-4000-8000-000000000001,00000000-0000-4000-8000-000000000002}'), pg_temp.b('{t,t}'), NULL, pg_temp.b('{"{}","{}"}'), NULL)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_consume_keyed('parker', 'SELECT 1', '{s,s}', '{NULL,1-2}', pg_temp.b('{00000000-0000-4000-8000-000000000001,00000000-0000-4000-8000-000000000002}'), pg_temp.b('{t,t}'), NULL, pg_temp.b('{"{}","{}"}'), NULL)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_consume_keyed('parker', 'SELECT 1', '{s}', '{1-1}', pg_temp.b('{00000000-0000-4000-8000-000000000001}'), pg_temp.b('{t}'), NULL, pg_temp.b('{"{}"}'), NULL, NULL)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_consume_keyed('parker', 'SELECT 1', '{s}', '{1-1}', pg_temp.b('{00000000-0000-4000-8000-000000000001}'), pg_temp.b('{t}'), NULL, pg_temp.b('{"{}"}'), NULL, false, NULL)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_consume_keyed(NULL, 'SELECT 1', '{s}', '{1-1}', pg_temp.b('{00000000-0000-4000-8000-000000000001}'), pg_temp.b('{t}'), NULL, pg_temp.b('{"{}"}'), NULL)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_consume_keyed('parker', NULL, '{s}', '{1-1}', pg_temp.b('{00000000-0000-4000-8000-000000000001}'), pg_temp.b('{t}'), NULL, pg_temp.b('{"{}"}'), NULL)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_consume_keyed('parker', '', '{s}', '{1-1}', pg_temp.b('{00000000-0000-4000-8000-000000000001}'), pg_temp.b('{t}'), NULL, pg_temp.b('{"{}"}'), NULL)$$);
SELECT pg_temp.explain($$SELECT * FROM inbox_consume_keyed('parker', 'SELECT 1', '{s}', '{1-1,1-2}', pg_temp.b('{00000000-0000-4000-8000-000000000001,00000000-0000-4000-8000-000000000002}'), pg_temp.b('{t,t}'), NULL, pg_temp.b('{"{}","{}"}'), NULL)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_consume_keyed('parker', 'SELECT 1', '{s,s}', '{1-1}', pg_temp.b('{00000000-0000-4000-8000-000000000001,00000000-0000-4000-8000-000000000002}'), pg_temp.b('{t,t}'), NULL, pg_temp.b('{"{}","{}"}'), NULL)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_consume_keyed('parker', 'SELECT 1', '{s,s}', '{1-1,1-2}', pg_temp.b('{00000000-0000-4000-8000-000000000001,00000000-0000-4000-8000-000000000002}'), pg_temp.b('{t,t}'), pg_temp.b('{k}'), pg_temp.b('{"{}","{}"}'), NULL)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_consume_keyed('parker', 'SELECT 1', '{s,s}', '{1-1,1-2}', pg_temp.b('{00000000-0000-4000-8000-000000000001}'), pg_temp.b('{t,t}'), NULL, pg_temp.b('{"{}","{}"}'), NULL)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_consume_keyed('parker', 'SELECT 1', '{{s},{s}}', '{1-1,1-2}', pg_temp.b('{00000000-0000-4000-8000-000000000001,00000000-0000-4000-8000-000000000002}'), pg_temp.b('{t,t}'), NULL, pg_temp.b('{"{}","{}"}'), NULL)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_consume_keyed('parker', 'SELECT 1', '[0:1]={s,s}', '{1-1,1-2}', pg_temp.b('{00000000-0000-4000-8000-000000000001,00000000-0000-4000-8000-000000000002}'), pg_temp.b('{t,t}'), NULL, pg_temp.b('{"{}","{}"}'), NULL)$$);
SELECT pg_temp.explain($$SELECT * FROM pg_temp.consume('parker', array_fill('k'::text, ARRAY[65]), ARRAY(SELECT i FROM generate_series(1, 65) i), iso => true)$$);
-- The consumer's name is checked as everywhere else.
SELECT pg_temp.try($$SELECT * FROM inbox_consume_keyed('', 'SELECT 1', '{}', '{}', '{}', '{}', NULL, '{}', NULL)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_consume_keyed(repeat('c', 256), 'SELECT 1', '{}', '{}', '{}', '{}', NULL, '{}', NULL)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_consume_keyed(E'park\x01er', 'SELECT 1', '{}', '{}', '{}', '{}', NULL, '{}', NULL)$$);
-- A handler that cannot run in a function is refused, as by
-- inbox_consume(), also when some entries of the batch park.
SELECT pg_temp.try($$SELECT * FROM inbox_consume_keyed('parker', 'COMMIT', '{"",""}', '{8-1,8-2}', pg_temp.b('{00000000-0000-4000-8000-000000008001,00000000-0000-4000-8000-000000008002}'), pg_temp.b('{t,t}'), pg_temp.b('{A,B}'), pg_temp.b('{"{}","{}"}'), NULL)$$);
-- Keyless batches (keys NULL) take the fast path; headers are kept as
-- received when an entry parks.
SELECT * FROM inbox_consume_keyed('parker', 'SELECT 1', '{"",""}', '{8-3,8-4}', pg_temp.b('{00000000-0000-4000-8000-000000008003,00000000-0000-4000-8000-000000008004}'), pg_temp.b('{t,t}'), NULL, pg_temp.b('{"{}","{}"}'), NULL);
SELECT * FROM inbox_consume_keyed('parker', 'SELECT 1', '{""}', '{8-5}', pg_temp.b('{00000000-0000-4000-8000-000000008005}'), pg_temp.b('{t}'), pg_temp.b('{A}'), pg_temp.b('{"{}"}'), pg_temp.b('{"{\"trace\": \"x\\u0000\"}"}'));
SELECT entry_id, convert_from(headers, 'UTF8') AS headers FROM outbox.parked_entries WHERE entry_id = '8-5';
-- An empty batch is an empty result, after the consumer check.
SELECT count(*) AS empty FROM inbox_consume_keyed('parker', 'SELECT 1', '{}', '{}', '{}', '{}', NULL, '{}', NULL);
SELECT pg_temp.try($$SELECT * FROM inbox_consume_keyed('unknown', 'SELECT 1', '{}', '{}', '{}', '{}', NULL, '{}', NULL)$$);
-- A parked key's entry with an entry id that is none is refused, not
-- stored; an entry without payload parks as received (the drain finds it
-- malformed).
SELECT pg_temp.explain($$SELECT * FROM inbox_consume_keyed('parker', 'SELECT 1', '{""}', '{x-1}', pg_temp.b('{00000000-0000-4000-8000-000000000001}'), pg_temp.b('{t}'), pg_temp.b('{A}'), pg_temp.b('{"{}"}'), NULL)$$);
SELECT * FROM inbox_consume_keyed('parker', 'SELECT 1', '{""}', '{7-1}', pg_temp.b('{00000000-0000-4000-8000-000000000001}'), pg_temp.b('{t}'), pg_temp.b('{A}'), '{NULL}', NULL);
SELECT entry_id, payload FROM outbox.parked_entries WHERE entry_id = '7-1';
-- The entries themselves, called directly: their arrays are checked too.
SELECT pg_temp.try($$SELECT * FROM outbox.parked_match('parker', NULL, '{}', '{}')$$);
SELECT pg_temp.try($$SELECT * FROM outbox.parked_match('parker', '{s}', '{}', '{1-1}')$$);
SELECT pg_temp.try($$SELECT * FROM outbox.parked_match('parker', '{s}', '{x}', '{NULL}')$$);
SELECT * FROM outbox.parked_match('parker', '{"",orders,""}', '{A,A,NULL}', '{5-1,5-1,5-2}');
SELECT * FROM outbox.parked_match('parker', '{"",orders}', NULL, '{5-1,5-1}');
SELECT pg_temp.try($$SELECT outbox.parked_add('parker', '{s}', '{1-1}', NULL, NULL, '{NULL}', NULL, NULL)$$);
SELECT pg_temp.try($$SELECT outbox.parked_add('parker', '{s}', '{1-1}', NULL, NULL, NULL, NULL, NULL)$$);
SELECT pg_temp.try($$SELECT outbox.parked_add('parker', '{s}', '{1-1,1-2}', NULL, NULL, '{k}', NULL, NULL)$$);
SELECT pg_temp.try($$SELECT outbox.parked_add('parker', '{s}', '{1-1}', '{a,b}', NULL, '{k}', NULL, NULL)$$);
SELECT outbox.parked_add('parker', '{"",orders}', '{5-2,5-3}', NULL, NULL, '{A,A}', NULL, NULL) AS not_parked;
SELECT pg_temp.try($$SELECT outbox.parked_settle('parker', 's', NULL, false, '{}', false)$$);
SELECT pg_temp.try($$SELECT outbox.parked_settle('parker', 's', 'k', false, NULL, false)$$);
SELECT pg_temp.try($$SELECT outbox.parked_settle('parker', 's', 'k', NULL, '{}', false)$$);
SELECT pg_temp.try($$SELECT outbox.parked_settle('parker', 's', 'k', false, '{}', NULL)$$);
SELECT outbox.parked_settle('parker', 's', 'not parked', true, '{1-1}', true) AS not_parked;

--
-- Privileges: a consumer's role acts for its own consumers only (42501
-- for another's); a role that is no consumer may call none of them; the
-- bodies are granted to nobody.
--
CREATE ROLE regress_park_owner IN ROLE outbox_consumer;
CREATE ROLE regress_park_stranger IN ROLE outbox_consumer;
CREATE ROLE regress_park_nobody;
GRANT EXECUTE ON FUNCTION park_apply(text, jsonb) TO PUBLIC;
GRANT INSERT ON park_applied TO PUBLIC;
GRANT USAGE ON SEQUENCE park_applied_seq_seq TO PUBLIC;
GRANT SELECT ON park_fail TO PUBLIC;
SELECT inbox_consumer_create('owned', 'regress_park_owner');
SELECT * FROM pg_temp.park('owned', 'orders', '1-1', pg_temp.fields('A', 1), 'failed', 'P0001', 1, false);
CREATE TEMP TABLE privileged (n integer, q text);
GRANT SELECT ON privileged TO PUBLIC;
INSERT INTO privileged VALUES
    (1, $$SELECT pg_temp.statuses('owned', '{A,B}', '{7001,7002}')$$),
    (2, $$SELECT * FROM inbox_park_key('owned', 'orders', '1-3', pg_temp.fields('C', 3), 'failed', 'P0001', 1, false)$$),
    (3, $$SELECT * FROM outbox.parked_match('owned', '{orders}', '{A}', '{1-9}')$$),
    (4, $$SELECT outbox.parked_add('owned', '{orders}', '{1-9}', NULL, NULL, '{A}', NULL, NULL)$$),
    (5, $$SELECT outbox.parked_settle('owned', 'orders', 'A', false, '{}', false)$$),
    (6, $$SELECT * FROM outbox.parked_match_unchecked('owned', '{orders}', '{A}', '{1-9}')$$),
    (7, $$SELECT outbox.parked_add_unchecked('owned', '{orders}', '{1-9}', NULL, NULL, '{A}', NULL, NULL)$$),
    (8, $$SELECT outbox.parked_settle_unchecked('owned', 'orders', 'A', false, '{}', false)$$),
    (9, $$SELECT * FROM outbox.inbox_park_key_unchecked('owned', 'orders', '1-3', NULL, 'r', NULL, 1, false)$$),
    (10, $$SELECT count(*) FROM outbox.parked_keys$$),
    (11, $$SELECT count(*) FROM outbox.parked_entries$$),
    (12, $$DELETE FROM outbox.parked_keys$$);
SET ROLE regress_park_owner;
SELECT n, pg_temp.try(q) FROM privileged ORDER BY n;
RESET ROLE;
SET ROLE regress_park_stranger;
SELECT n, pg_temp.try(q) FROM privileged ORDER BY n;
RESET ROLE;
SET ROLE regress_park_nobody;
SELECT n, pg_temp.try(q) FROM privileged ORDER BY n;
RESET ROLE;
SET ROLE outbox_admin;
SELECT n, pg_temp.try(q) FROM privileged WHERE n IN (3, 10, 11, 12) ORDER BY n;
RESET ROLE;
SELECT stream, convert_from(key, 'UTF8') AS key, state, head_entry_id, parked FROM outbox.parked_keys WHERE consumer = 'owned' ORDER BY 1, 2;
SELECT stream, entry_id FROM outbox.parked_entries WHERE consumer = 'owned' ORDER BY 1, 2;

-- Clean up.
TRUNCATE outbox.inbox, outbox.dead_letters, outbox.parked_keys, outbox.parked_entries RESTART IDENTITY;
DELETE FROM outbox.consumers;
REVOKE ALL ON park_applied, park_fail FROM PUBLIC;
REVOKE ALL ON SEQUENCE park_applied_seq_seq FROM PUBLIC;
REVOKE ALL ON FUNCTION park_apply(text, jsonb) FROM PUBLIC;
DROP ROLE regress_park_owner, regress_park_stranger, regress_park_nobody;
DROP TABLE park_applied, park_fail;
DROP FUNCTION park_apply(text, jsonb);
