-- W3C trace context: what outbox_emit() and outbox_emit_many() take from
-- the headers or the settings pg_outbox.traceparent / pg_outbox.tracestate,
-- what they drop (one warning per call, OB006, never an error), and what a
-- handler gets from inbox_consume() and inbox_replay(): $6 and the settings.
\set VERBOSITY default
SET client_min_messages = warning;
\set tp '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'
\set tp2 '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00'

-- The headers an event was written with.
CREATE FUNCTION pg_temp.emit(headers jsonb, payload jsonb DEFAULT '{}') RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    id uuid := outbox_emit('trace', NULL, payload, headers);
BEGIN
    RETURN (SELECT e.headers FROM outbox.event e WHERE e.event_id = id);
END
$$;
CREATE FUNCTION pg_temp.emit_many(headers jsonb[]) RETURNS SETOF jsonb LANGUAGE plpgsql AS $$
DECLARE
    ids uuid[] := ARRAY(SELECT outbox_emit_many('trace', NULL, array_fill('{}'::jsonb, ARRAY[cardinality(headers)]), headers));
BEGIN
    RETURN QUERY SELECT e.headers FROM unnest(ids) WITH ORDINALITY u(id, o) JOIN outbox.event e ON e.event_id = u.id ORDER BY u.o;
END
$$;

-- Nothing set, no trace context in the headers: the headers as given.
SELECT pg_temp.emit(NULL) AS none, pg_temp.emit('{"a": 1}') AS given;

-- From the settings: added to NULL or to the headers given.
SET pg_outbox.traceparent = :'tp';
SELECT pg_temp.emit(NULL) AS from_setting;
SET pg_outbox.tracestate = 'rojo=00f067aa0ba902b7, congo=t61rcWkgMzE';
SELECT pg_temp.emit('{"a": 1}') AS from_settings;
SELECT * FROM pg_temp.emit_many(ARRAY[NULL, '{"b": 2}']::jsonb[]);

-- The headers first: a "traceparent" of the headers is the source, with
-- the headers' tracestate only; the settings are not read.
SELECT pg_temp.emit(jsonb_build_object('traceparent', :'tp2')) AS headers_only;
SELECT pg_temp.emit(jsonb_build_object('traceparent', :'tp2', 'tracestate', 'k=v')) AS headers_both;
SET pg_outbox.traceparent = 'not a traceparent';
SELECT pg_temp.emit(jsonb_build_object('traceparent', :'tp2')) AS bad_setting_unread;
RESET pg_outbox.traceparent;
RESET pg_outbox.tracestate;

-- SET LOCAL: for the transaction only.
BEGIN;
SET LOCAL pg_outbox.traceparent = :'tp2';
SELECT pg_temp.emit(NULL) AS in_transaction;
COMMIT;
SELECT pg_temp.emit(NULL) AS after_commit, current_setting('pg_outbox.traceparent') AS setting;

-- What is not valid is dropped with a warning, the event written; the
-- warning's SQLSTATE is OB006.
\set VERBOSITY sqlstate
SELECT pg_temp.emit('{"traceparent": "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}') AS dropped;
\set VERBOSITY default
-- The traceparent of the headers (its tracestate goes with it).
SELECT pg_temp.emit('{"traceparent": "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "a=1", "x": 1}') AS version_01;
SELECT pg_temp.emit('{"traceparent": "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}') AS version_ff;
SELECT pg_temp.emit('{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-1"}') AS length_54;
SELECT pg_temp.emit('{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-011"}') AS length_56;
SELECT pg_temp.emit('{"traceparent": "00-00000000000000000000000000000000-b7ad6b7169203331-01"}') AS zero_trace_id;
SELECT pg_temp.emit('{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01"}') AS zero_parent_id;
SELECT pg_temp.emit('{"traceparent": "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01"}') AS upper_case;
SELECT pg_temp.emit('{"traceparent": "00_0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}') AS no_dash;
SELECT pg_temp.emit('{"traceparent": 42}') AS number;
SELECT pg_temp.emit('{"traceparent": null}') AS json_null;
SELECT pg_temp.emit('{"traceparent": ["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"]}') AS json_array;
SELECT pg_temp.emit('{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0\u0001"}') AS control_char;
-- The tracestate of the headers (the traceparent stays).
SELECT pg_temp.emit(jsonb_build_object('traceparent', :'tp', 'tracestate', 'A=1')) AS upper_key;
SELECT pg_temp.emit(jsonb_build_object('traceparent', :'tp', 'tracestate', 'a=1,b')) AS no_equals;
SELECT pg_temp.emit(jsonb_build_object('traceparent', :'tp', 'tracestate', 'a=')) AS empty_value;
SELECT pg_temp.emit(jsonb_build_object('traceparent', :'tp', 'tracestate', 'a=b=c')) AS equals_in_value;
SELECT pg_temp.emit(jsonb_build_object('traceparent', :'tp', 'tracestate', E'a=1\tb')) AS tab;
SELECT pg_temp.emit(jsonb_build_object('traceparent', :'tp', 'tracestate', 'a=ü')) AS non_ascii;
SELECT pg_temp.emit(jsonb_build_object('traceparent', :'tp', 'tracestate', 'k=' || repeat('v', 511))) AS bytes_513;
SELECT pg_temp.emit(jsonb_build_object('traceparent', :'tp', 'tracestate', 'k=' || repeat('v', 256) || ',j=' || repeat('v', 251))) ->> 'tracestate' IS NOT NULL AS bytes_512;
SELECT pg_temp.emit(jsonb_build_object('traceparent', :'tp', 'tracestate',
                                       (SELECT string_agg('k' || i || '=v', ',') FROM generate_series(1, 33) i))) AS members_33;
SELECT pg_temp.emit(jsonb_build_object('traceparent', :'tp', 'tracestate',
                                       (SELECT string_agg('k' || i || '=v', ',') FROM generate_series(1, 32) i))) ->> 'tracestate' IS NOT NULL AS members_32;
SELECT pg_temp.emit(jsonb_build_object('traceparent', :'tp', 'tracestate', ' a=1 ,, t@sys=x y,' || repeat('k', 256) || '=v ')) ->> 'tracestate' IS NOT NULL AS valid_members;
SELECT pg_temp.emit(jsonb_build_object('traceparent', :'tp', 'tracestate', true)) AS state_not_string;
SELECT pg_temp.emit('{"tracestate": "a=1", "x": 1}') AS state_alone;

-- The settings: a bad value never fails a SET, only the emit that would
-- use it drops it.
SET pg_outbox.traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331';
SELECT pg_temp.emit(NULL) AS setting_length_52;
SELECT set_config('pg_outbox.traceparent', repeat('0', 1000000), false) IS NOT NULL AS huge_setting;
SELECT pg_temp.emit('{"x": 1}') AS setting_huge;
SELECT set_config('pg_outbox.traceparent', :'tp', false) IS NOT NULL;
SELECT set_config('pg_outbox.tracestate', E'a=1\u0001', false) IS NOT NULL;
SELECT pg_temp.emit(NULL) AS setting_state_control_char;
SELECT set_config('pg_outbox.tracestate', repeat('x', 100000), false) IS NOT NULL;
SELECT pg_temp.emit(NULL) AS setting_state_huge;
RESET pg_outbox.traceparent;
SET pg_outbox.tracestate = 'a=1';
SELECT pg_temp.emit(NULL) AS setting_state_alone;
RESET pg_outbox.tracestate;

-- One warning for a call, naming the first value dropped.
SET pg_outbox.traceparent = 'ff';
SELECT * FROM pg_temp.emit_many(ARRAY[NULL, '{"traceparent": "x"}', '{"tracestate": "a=1"}']::jsonb[]);
SELECT * FROM pg_temp.emit_many(ARRAY['{"a": 1}', '{"traceparent": 1, "a": 2}', '{"traceparent": "x"}', NULL]::jsonb[]);
RESET pg_outbox.traceparent;
SELECT * FROM pg_temp.emit_many(ARRAY['{"a": 1}', '{"tracestate": "a=1"}', '{"traceparent": "x"}']::jsonb[]);

-- The settings' trace context where it would make the event too large:
-- dropped, the event written without it.
SET pg_outbox.max_payload_size = 1024;
SET pg_outbox.traceparent = :'tp';
SELECT pg_temp.emit(NULL, jsonb_build_object('x', repeat('a', 960))) AS too_large;
SELECT pg_temp.emit(NULL, jsonb_build_object('x', repeat('a', 100))) AS fits;
RESET pg_outbox.traceparent;
RESET pg_outbox.max_payload_size;

-- A session that sets a bad value before pg_outbox is loaded (the
-- setting is a placeholder then): the SET succeeds, the emit drops it.
\c -
SET client_min_messages = warning;
SET pg_outbox.traceparent = 'set before loading';
SELECT outbox_emit('trace', NULL, '{}') IS NOT NULL AS emitted;
RESET pg_outbox.traceparent;

-- The validation both engines share, against the shared vectors of
-- test/vectors/trace_context.txt: the cases whose result differs from the
-- vector (none), then how many were checked.
CREATE TEMP TABLE vector_lines (n serial, line text);
\copy vector_lines (line) FROM 'test/vectors/trace_context.txt'
CREATE TEMP TABLE vectors AS
SELECT n, f[1] AS kind, f[2] AS value, f[3] AS expected
  FROM (SELECT n, string_to_array(line, ' | ') AS f FROM vector_lines
         WHERE line <> '' AND line NOT LIKE '#%') v;
SELECT n, kind, value, expected, fault
  FROM vectors,
       LATERAL (SELECT CASE kind WHEN 'traceparent' THEN outbox.traceparent_fault(value)
                                 ELSE outbox.tracestate_fault(value) END AS fault) f
 WHERE (fault IS NULL) IS DISTINCT FROM (expected = 'valid')
 ORDER BY n;
SELECT kind, count(*) FILTER (WHERE expected = 'valid') AS valid, count(*) FILTER (WHERE expected = 'invalid') AS invalid
  FROM vectors GROUP BY kind ORDER BY kind;
-- The reasons.
SELECT v, outbox.traceparent_fault(v)
  FROM unnest(ARRAY['00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01',
                    '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-ff',
                    '',
                    'ü0-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0',
                    '0g-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01']) v;
SELECT left(v, 40) AS v, outbox.tracestate_fault(v)
  FROM unnest(ARRAY['', ',', 'a=1', 'a-b_c*d/e=1', '0a@b=1', 'a@0b=1', 'a@b@c=1', 'a@bcdefghijklmnop=1',
                    repeat('a', 241) || '@b=1', repeat('a', 242) || '@b=1', repeat('a', 257) || '=1',
                    'a=' || repeat('v', 256), 'a=' || repeat('v', 257), 'a= v', 'a=v v', '=v']) v;
SELECT outbox.trace_context(jsonb_build_object('traceparent', :'tp', 'tracestate', 'a=1')),
       outbox.trace_context(jsonb_build_object('traceparent', :'tp', 'tracestate', 'A')),
       outbox.trace_context('{"traceparent": "x", "tracestate": "a=1"}'),
       outbox.trace_context('[1]');

-- Consuming: a handler gets the entry's valid traceparent as $6 and sees
-- the entry's trace context in the settings; an event it emits carries
-- it (one trace, A -> B), and the caller's settings come back after.
CREATE FUNCTION pg_temp.b(a text[]) RETURNS bytea[] LANGUAGE sql AS
    $$ SELECT array_agg(convert_to(x, 'UTF8') ORDER BY o) FROM unnest(a) WITH ORDINALITY u(x, o) $$;
CREATE TABLE trace_seen (consumer text, event_id uuid, p6 text, traceparent text, tracestate text);
DELETE FROM outbox.consumers WHERE name IN ('trace_batch', 'trace_isolated');
SELECT inbox_consumer_create(c, current_user::regrole) FROM unnest(ARRAY['trace_batch', 'trace_isolated']) c;
SET pg_outbox.traceparent = :'tp2';
SET pg_outbox.tracestate = 'caller=1';
SELECT c, r.ord, r.status, r.error_code
  FROM unnest(ARRAY['trace_batch', 'trace_isolated']) c,
       inbox_consume(c,
           'WITH s AS (INSERT INTO trace_seen VALUES ($2, $5, $6, current_setting(''pg_outbox.traceparent''), current_setting(''pg_outbox.tracestate'')))
            SELECT outbox_emit(''chained'', $2 || ''/'' || $5::text, $3)',
           pg_temp.b(ARRAY['00000000-0000-4000-8000-00000000a001', '00000000-0000-4000-8000-00000000a002',
                           '00000000-0000-4000-8000-00000000a003', '00000000-0000-4000-8000-00000000a004']),
           pg_temp.b(ARRAY['t', 't', 't', 't']),
           pg_temp.b(ARRAY[c, c, c, c]),
           pg_temp.b(ARRAY['{}', '{}', '{}', '{}']),
           pg_temp.b(ARRAY['{"traceparent": "' || :'tp' || '", "tracestate": "a=1"}',
                           NULL,
                           '{"traceparent": "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "a=1"}',
                           '{"traceparent": "' || :'tp' || '", "tracestate": "A=1"}']),
           c = 'trace_isolated') r
 ORDER BY 1, 2;
SELECT current_setting('pg_outbox.traceparent') = :'tp2' AS caller_traceparent_back,
       current_setting('pg_outbox.tracestate') AS caller_tracestate;
SELECT consumer, right(event_id::text, 4) AS event, p6, traceparent, tracestate FROM trace_seen ORDER BY 1, 2;
SELECT e.key, e.headers FROM outbox.event e WHERE e.topic = 'chained' ORDER BY e.key;

-- inbox_replay(): the same for a dead letter's event.
TRUNCATE trace_seen;
SELECT inbox_replay(inbox_dead_letter('trace_batch', 's', '1-1', '00000000-0000-4000-8000-00000000a005', 't', NULL, '{}',
                                      jsonb_build_object('traceparent', :'tp', 'tracestate', 'b=2'), 'test'),
                    'INSERT INTO trace_seen VALUES (''replay'', $5, $6, current_setting(''pg_outbox.traceparent''), current_setting(''pg_outbox.tracestate''))');
SELECT consumer, right(event_id::text, 4) AS event, p6, traceparent, tracestate FROM trace_seen;
SELECT current_setting('pg_outbox.traceparent') = :'tp2' AS caller_traceparent_back;
RESET pg_outbox.traceparent;
RESET pg_outbox.tracestate;

DROP TABLE trace_seen;
SELECT inbox_consumer_drop(c, true) FROM unnest(ARRAY['trace_batch', 'trace_isolated']) c;
