-- Stream entries with hostile content. inbox_consume() takes each field as
-- bytes and decodes it per entry: a bad one fails alone ('malformed', with
-- its SQLSTATE) and every other entry of the batch applies. Dead letters
-- keep an entry's fields exactly as received.
TRUNCATE outbox.inbox, outbox.dead_letters RESTART IDENTITY;
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
CREATE FUNCTION pg_temp.u(t text) RETURNS bytea LANGUAGE sql AS $$ SELECT convert_to(t, 'UTF8') $$;

SELECT inbox_consumer_create('hostile', current_user::regrole);
CREATE TABLE seen (event_id uuid, topic text, key text, payload jsonb, headers jsonb);
CREATE FUNCTION record_seen(topic text, key text, payload jsonb, headers jsonb, event_id uuid)
RETURNS void LANGUAGE sql AS $$ INSERT INTO seen VALUES (event_id, topic, key, payload, headers) $$;

-- One batch: valid entries between bad ones of every kind.
CREATE TABLE batch (ord int, what text, event_id bytea, topic bytea, key bytea, payload bytea, headers bytea);
INSERT INTO batch VALUES
    (1, 'valid', pg_temp.u('00000000-0000-4000-8000-000000000001'), pg_temp.u('t'), pg_temp.u('k'), pg_temp.u('{"n": 1}'), NULL),
    (2, 'payload with invalid UTF-8', pg_temp.u('00000000-0000-4000-8000-000000000002'), pg_temp.u('t'), NULL, '\x7b226e223a22ff227d', NULL),
    (3, 'NUL byte in the topic', pg_temp.u('00000000-0000-4000-8000-000000000003'), '\x7400', NULL, pg_temp.u('{"n": 3}'), NULL),
    (4, 'payload with \u0000', pg_temp.u('00000000-0000-4000-8000-000000000004'), pg_temp.u('t'), NULL, pg_temp.u('{"a": "\u0000"}'), NULL),
    (5, 'valid, non-ASCII', pg_temp.u('00000000-0000-4000-8000-000000000005'), pg_temp.u('tëst'), pg_temp.u('ключ'), pg_temp.u('{"n": "日本", "q": "\"\\"}'), pg_temp.u('{"h": 1}')),
    (6, 'event id not a uuid', pg_temp.u('not-a-uuid'), pg_temp.u('t'), NULL, pg_temp.u('{}'), NULL),
    (7, 'event id invalid UTF-8', '\xff', pg_temp.u('t'), NULL, pg_temp.u('{}'), NULL),
    (8, 'no event id', NULL, pg_temp.u('t'), NULL, pg_temp.u('{}'), NULL),
    (9, 'no topic', pg_temp.u('00000000-0000-4000-8000-000000000009'), NULL, NULL, pg_temp.u('{}'), NULL),
    (10, 'no payload', pg_temp.u('00000000-0000-4000-8000-00000000000a'), pg_temp.u('t'), NULL, NULL, NULL),
    (11, 'NUL byte in the key', pg_temp.u('00000000-0000-4000-8000-00000000000b'), pg_temp.u('t'), '\x6b006b', pg_temp.u('{}'), NULL),
    (12, 'headers not JSON', pg_temp.u('00000000-0000-4000-8000-00000000000c'), pg_temp.u('t'), NULL, pg_temp.u('{}'), pg_temp.u('{oops')),
    (13, 'payload number out of range', pg_temp.u('00000000-0000-4000-8000-00000000000d'), pg_temp.u('t'), NULL, pg_temp.u('{"n": 1e1000000}'), NULL),
    (14, 'empty payload', pg_temp.u('00000000-0000-4000-8000-00000000000e'), pg_temp.u('t'), NULL, '\x', NULL),
    (15, 'truncated UTF-8 sequence', pg_temp.u('00000000-0000-4000-8000-00000000000f'), pg_temp.u('t'), NULL, '\x7b226e223a22e282227d', NULL),
    (16, 'valid', pg_temp.u('00000000-0000-4000-8000-000000000010'), pg_temp.u('t'), NULL, pg_temp.u('[1, 2]'), NULL);
-- Each entry in its own subtransaction: every bad one fails alone.
CREATE TABLE isolated AS
SELECT b.ord, b.what, c.status, c.error_code, c.error_message
  FROM inbox_consume('hostile', 'SELECT record_seen($1, $2, $3, $4, $5)',
                     (SELECT array_agg(event_id ORDER BY ord) FROM batch),
                     (SELECT array_agg(topic ORDER BY ord) FROM batch),
                     (SELECT array_agg(key ORDER BY ord) FROM batch),
                     (SELECT array_agg(payload ORDER BY ord) FROM batch),
                     (SELECT array_agg(headers ORDER BY ord) FROM batch),
                     isolate => true) c
  JOIN batch b USING (ord);
SELECT * FROM isolated ORDER BY ord;
-- The valid entries applied, once, with their content intact.
SELECT event_id, topic, key, payload, headers FROM seen ORDER BY event_id;
SELECT event_id FROM outbox.inbox ORDER BY event_id;

-- As one batch, without subtransactions: the checks find every malformed
-- entry without raising, with the same SQLSTATE and message as the casts;
-- only what the conversion to jsonb alone finds (a number beyond numeric's
-- range) raises, for the whole call.
TRUNCATE outbox.inbox, seen;
SELECT pg_temp.try($$SELECT * FROM inbox_consume('hostile', 'SELECT record_seen($1, $2, $3, $4, $5)',
                     (SELECT array_agg(event_id ORDER BY ord) FROM batch),
                     (SELECT array_agg(topic ORDER BY ord) FROM batch),
                     (SELECT array_agg(key ORDER BY ord) FROM batch),
                     (SELECT array_agg(payload ORDER BY ord) FROM batch),
                     (SELECT array_agg(headers ORDER BY ord) FROM batch))$$);
SELECT count(*) AS nothing_applied FROM seen;
DELETE FROM batch WHERE what = 'payload number out of range';
SELECT b.ord, i.status, c.status IS NOT DISTINCT FROM i.status AND c.error_code IS NOT DISTINCT FROM i.error_code
       AND c.error_message IS NOT DISTINCT FROM i.error_message AS as_isolated
  FROM inbox_consume('hostile', 'SELECT record_seen($1, $2, $3, $4, $5)',
                     (SELECT array_agg(event_id ORDER BY ord) FROM batch),
                     (SELECT array_agg(topic ORDER BY ord) FROM batch),
                     (SELECT array_agg(key ORDER BY ord) FROM batch),
                     (SELECT array_agg(payload ORDER BY ord) FROM batch),
                     (SELECT array_agg(headers ORDER BY ord) FROM batch)) c
  JOIN (SELECT row_number() OVER (ORDER BY ord) AS n, * FROM batch) b ON b.n = c.ord
  JOIN isolated i ON i.ord = b.ord
 ORDER BY b.ord;
SELECT event_id, topic, key, payload, headers FROM seen ORDER BY event_id;

-- Event ids in every form uuid_in() takes, and forms it refuses.
SELECT c.ord, c.status, c.error_message
  FROM inbox_consume('hostile', 'SELECT 1',
                     ARRAY[pg_temp.u('{00000000-0000-4000-8000-000000000031}'), pg_temp.u('0000000000004000800000000000003200'),
                           pg_temp.u('00000000000040008000000000000032'), pg_temp.u('0000-0000-0000-4000-8000-0000-0000-0033'),
                           pg_temp.u('00000000-0000-4000-8000-00000000003G'), pg_temp.u('{00000000-0000-4000-8000-000000000034'),
                           pg_temp.u('00000000-0000-4000-8000-000000000035}'), pg_temp.u('00000000--0000-4000-8000-000000000036'),
                           pg_temp.u('-00000000-0000-4000-8000-000000000037'), pg_temp.u(''),
                           pg_temp.u('00000000-0000-4000-8000-0000000000AB')],
                     array_fill(pg_temp.u('t'), ARRAY[11]), NULL, array_fill(pg_temp.u('{}'), ARRAY[11]), NULL) c
 ORDER BY c.ord;

-- The checks read JSON as its conversion does, escapes decoded, numbers
-- not: a syntax error or \u0000 anywhere makes the entry malformed, even
-- after a number beyond numeric's range, which alone raises (as one
-- batch; with isolate it fails its entry); so does the first entry that
-- raises, before later ones, and nesting beyond the stack raises in both.
CREATE FUNCTION pg_temp.consume(payloads text[], headers text[], isolate boolean) RETURNS SETOF text
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT * FROM inbox_consume('hostile', 'SELECT 1',
                 (SELECT array_agg(convert_to(gen_random_uuid()::text, 'UTF8')) FROM unnest(payloads)),
                 array_fill(pg_temp.u('t'), ARRAY[cardinality(payloads)]), NULL,
                 (SELECT array_agg(convert_to(p, 'UTF8') ORDER BY o) FROM unnest(payloads) WITH ORDINALITY u(p, o)),
                 (SELECT array_agg(convert_to(h, 'UTF8') ORDER BY o) FROM unnest(headers) WITH ORDINALITY u(h, o)),
                 isolate) LOOP
        RETURN NEXT r.ord || ' ' || r.status || coalesce(' ' || r.error_code || ' ' || r.error_message, '');
    END LOOP;
EXCEPTION WHEN OTHERS THEN
    RETURN NEXT 'raised ' || sqlstate || ': ' || sqlerrm;
END
$$;
SELECT v.n, w.isolate, pg_temp.consume(ARRAY['{}', v.payload], NULL, w.isolate)
  FROM (VALUES (1, '[1e1000000]'), (2, '{"n": 1e1000000, oops'), (3, '[1e1000000, "\u0000"]'),
               (4, '["\u0000", oops'), (5, '"\ud800\u0041"'), (6, '[1e1000000, "\ud800"]'), (7, '1e1000000 oops'),
               (8, '"\x"'), (9, repeat('[', 100000)), (10, '{"a": "\u00e9\uD83D\uDE00"}')) v(n, payload),
       (VALUES (false), (true)) w(isolate)
 ORDER BY v.n, w.isolate;
SELECT pg_temp.consume(ARRAY['[1e1000000]'], ARRAY['{oops'], false);
SELECT pg_temp.consume(ARRAY['[1]'], ARRAY['[1e1000000]'], true);
SELECT pg_temp.consume(ARRAY['{oops', '[1e1000000]', repeat('[', 100000)], NULL, false);
SELECT pg_temp.consume(ARRAY['{oops', '[1e1000000]', repeat('[', 100000)], NULL, true);
SELECT pg_temp.consume(ARRAY[repeat('[', 100000), '[1e1000000]'], NULL, false);
TRUNCATE outbox.inbox;

-- Arrays that cannot be read as a batch fail the call, before any entry.
SELECT pg_temp.try($$SELECT * FROM inbox_consume('hostile', 'SELECT 1', '[0:0]={"\\x31"}', '[0:0]={"\\x31"}', NULL, '[0:0]={"\\x31"}', NULL)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_consume('hostile', 'SELECT 1', '{{"\\x31"}}', '{{"\\x31"}}', NULL, '{{"\\x31"}}', NULL)$$);
SELECT pg_temp.try($$SELECT * FROM inbox_consume('hostile', 'SELECT 1', '{"\\x31"}', '{"\\x31"}', '{}', '{"\\x31"}', NULL)$$);

-- A large entry (4 MB of JSON) applies; a large malformed one fails alone.
SELECT status, error_code, left(error_message, 60) AS error_message
  FROM inbox_consume('hostile', 'SELECT 1',
                     ARRAY[pg_temp.u('00000000-0000-4000-8000-000000000020'), pg_temp.u('00000000-0000-4000-8000-000000000021')],
                     ARRAY[pg_temp.u('t'), pg_temp.u('t')], NULL,
                     ARRAY[pg_temp.u('["' || repeat('x', 4000000) || '"]'), pg_temp.u('["' || repeat('x', 4000000) || '"') || '\xff'::bytea],
                     NULL);

-- Dead letters from raw fields: names and values kept byte for byte (NUL,
-- invalid UTF-8, duplicate names, in the order received); each typed
-- column filled only when its field decodes (the first of duplicates).
SELECT inbox_dead_letter('hostile', 'outbox:t', '1-2',
                         ARRAY[pg_temp.u('event_id'), pg_temp.u('00000000-0000-4000-8000-000000000002'),
                               pg_temp.u('topic'), pg_temp.u('t'),
                               pg_temp.u('payload'), '\x7b226e223a22ff227d',
                               '\xff00', '\x00ff',
                               pg_temp.u('key'), pg_temp.u('first'),
                               pg_temp.u('key'), pg_temp.u('second')],
                         'field "payload": invalid byte sequence for encoding "UTF8": 0xff', '22021') AS dl_utf8 \gset
SELECT inbox_dead_letter('hostile', 'outbox:t', '1-4',
                         ARRAY[pg_temp.u('event_id'), pg_temp.u('00000000-0000-4000-8000-000000000004'),
                               pg_temp.u('topic'), '\x7400', pg_temp.u('payload'), pg_temp.u('{"a": "\u0000"}')],
                         'field "payload": unsupported Unicode escape sequence', '22P05') AS dl_nul \gset
SELECT inbox_dead_letter('hostile', 'outbox:t', '1-5', ARRAY[]::bytea[], 'entry without fields', '22004') IS NOT NULL AS recorded;
SELECT inbox_dead_letter('hostile', 'outbox:t', '1-6',
                         ARRAY[pg_temp.u('payload'), pg_temp.u('["' || repeat('y', 4000000) || '"') || '\xff'::bytea],
                         'large', '22021') AS dl_large \gset
SELECT entry_id, event_id, topic, key, payload, headers, sqlstate, cardinality(fields) AS nfields
  FROM outbox.dead_letters ORDER BY entry_id;
SELECT fields = ARRAY[pg_temp.u('event_id'), pg_temp.u('00000000-0000-4000-8000-000000000002'),
                      pg_temp.u('topic'), pg_temp.u('t'), pg_temp.u('payload'), '\x7b226e223a22ff227d',
                      '\xff00', '\x00ff', pg_temp.u('key'), pg_temp.u('first'), pg_temp.u('key'), pg_temp.u('second')] AS lossless
  FROM outbox.dead_letters WHERE id = :dl_utf8;
SELECT fields[4] = '\x7400' AND fields[6] = pg_temp.u('{"a": "\u0000"}') AS lossless FROM outbox.dead_letters WHERE id = :dl_nul;
SELECT octet_length(fields[2]) AS bytes, md5(fields[2]) = md5(pg_temp.u('["' || repeat('y', 4000000) || '"') || '\xff'::bytea) AS lossless
  FROM outbox.dead_letters WHERE id = :dl_large;
-- A second failure updates the row and keeps its fields.
SELECT inbox_dead_letter('hostile', 'outbox:t', '1-2', NULL, 'again', '22021', 3) = :dl_utf8 AS same_row;
SELECT cardinality(fields) AS nfields, deliveries, reason FROM outbox.dead_letters WHERE id = :dl_utf8;
SELECT pg_temp.try($$SELECT inbox_dead_letter('hostile', 's', '1-1', ARRAY[pg_temp.u('odd')], 'r')$$);
SELECT pg_temp.try($$SELECT inbox_dead_letter('hostile', 's', '1-1', '{{"\\x31","\\x32"}}'::bytea[], 'r')$$);
SELECT pg_temp.try($$SELECT inbox_dead_letter('hostile', 's', NULL, ARRAY[]::bytea[], 'r')$$);

-- A malformed dead letter cannot be replayed; it says why.
SELECT pg_temp.try(format('SELECT inbox_replay(%s, %L)', :dl_nul, 'SELECT 1'));
DO $$
DECLARE
    d text;
    h text;
BEGIN
    PERFORM inbox_replay((SELECT id FROM outbox.dead_letters WHERE entry_id = '1-4'), 'SELECT 1');
EXCEPTION WHEN object_not_in_prerequisite_state THEN
    GET STACKED DIAGNOSTICS d = PG_EXCEPTION_DETAIL, h = PG_EXCEPTION_HINT;
    RAISE WARNING '% / %', d, h;
END
$$;

DROP TABLE batch, seen, isolated;
DROP FUNCTION record_seen(text, text, jsonb, jsonb, uuid);
TRUNCATE outbox.inbox, outbox.dead_letters;
DELETE FROM outbox.consumers;
