-- Bad input gets a clear error with a proper SQLSTATE and writes nothing.
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

TRUNCATE outbox.event;

SELECT pg_temp.try($$SELECT outbox_emit(NULL, 'k', '{}')$$);
SELECT pg_temp.try($$SELECT outbox_emit('', 'k', '{}')$$);
SELECT pg_temp.try($$SELECT outbox_emit(repeat('t', 256), 'k', '{}')$$);
SELECT pg_temp.try($$SELECT outbox_emit(repeat('t', 255), 'k', '{}')$$);
SELECT pg_temp.try($$SELECT outbox_emit('t', repeat('k', 1025), '{}')$$);
SELECT pg_temp.try($$SELECT outbox_emit('t', repeat('k', 1024), '{}')$$);
SELECT pg_temp.try($$SELECT outbox_emit('t', 'k', NULL)$$);
SELECT pg_temp.try($$SELECT outbox_emit('t', 'k', '{}', '[1, 2]')$$);
SELECT pg_temp.try($$SELECT outbox_emit('t', 'k', '{}', '"text"')$$);

-- pg_outbox.max_payload_size: 1 MB by default, superuser-settable.
SELECT pg_temp.try($$SELECT outbox_emit('t', 'k', jsonb_build_object('x', repeat('x', 1100000)))$$);
SET pg_outbox.max_payload_size = '4kB';
SELECT pg_temp.try($$SELECT outbox_emit('t', 'k', jsonb_build_object('x', repeat('x', 5000)))$$);
SELECT pg_temp.try($$SELECT outbox_emit('t', 'k', jsonb_build_object('x', repeat('x', 3000)))$$);
-- Headers count too: payload and headers go into one stream entry.
SELECT pg_temp.try($$SELECT outbox_emit('t', 'k', '{}', jsonb_build_object('h', repeat('h', 5000)))$$);
SELECT pg_temp.try($$SELECT outbox_emit('t', 'k', jsonb_build_object('x', repeat('x', 2000)), jsonb_build_object('h', repeat('h', 2000)))$$);
SELECT pg_temp.try($$SELECT outbox_emit('t', 'k', jsonb_build_object('x', repeat('x', 1500)), jsonb_build_object('h', repeat('h', 1500)))$$);
SELECT pg_temp.try($$SELECT outbox_emit_many('t', NULL, ARRAY['{}', '{}']::jsonb[], ARRAY[NULL, jsonb_build_object('h', repeat('h', 5000))])$$);
RESET pg_outbox.max_payload_size;
-- 5 MB of headers under the default 1 MB cap.
SELECT pg_temp.try($$SELECT outbox_emit('t', 'k', '{}', jsonb_build_object('h', repeat('h', 5000000)))$$);

-- The limit holds for the payload as JSON text too, as the relay publishes
-- it: jsonb stores a number in a few bytes whatever its digits, and a
-- control character in a string prints as 6 bytes ("\u0001").
SET pg_outbox.max_payload_size = '4kB';
SELECT pg_temp.try($$SELECT outbox_emit('t', 'k', '1e131071')$$) AS huge_number;
SELECT pg_temp.try($$SELECT outbox_emit('t', 'k', '-1e-16383')$$) AS tiny_number;
SELECT pg_temp.try($$SELECT outbox_emit('t', 'k', '{"n": 1e131071}')$$) AS in_an_object;
SELECT pg_temp.try($$SELECT outbox_emit('t', 'k', (repeat('[', 50) || '1e5000' || repeat(']', 50))::jsonb)$$) AS nested_arrays;
SELECT pg_temp.try($$SELECT outbox_emit('t', 'k', (SELECT jsonb_agg(123456789012) FROM generate_series(1, 300)))$$) AS many_small_numbers;
SELECT pg_temp.try($$SELECT outbox_emit('t', 'k', to_jsonb(repeat(chr(1), 1000)))$$) AS control_characters;
SELECT pg_temp.try($$SELECT outbox_emit('t', 'k', jsonb_build_object(repeat(chr(31), 1000), 1))$$) AS control_characters_in_a_key;
-- Just at the limit (4096 bytes of text) and just over, stored far below it.
SELECT pg_temp.try($$SELECT outbox_emit('t', 'k', '1e4095')$$) AS at_limit, pg_temp.try($$SELECT outbox_emit('t', 'k', '1e4096')$$) AS over;
SELECT pg_temp.try($$SELECT outbox_emit('t', 'k', to_jsonb(repeat(chr(1), 682)))$$) AS at_limit_less_4,
       pg_temp.try($$SELECT outbox_emit('t', 'k', to_jsonb(repeat(chr(1), 683)))$$) AS over_by_4;
-- Escapes of two bytes, each kind, around the limit: 2 + 2 * 2047 = 4096.
SELECT pg_temp.try($$SELECT outbox_emit('t', 'k', to_jsonb(repeat(E'\b\f\n\r\t"\\', 292) || E'\n\n\n'))$$) AS at_limit_escapes,
       pg_temp.try($$SELECT outbox_emit('t', 'k', to_jsonb(repeat(E'\b\f\n\r\t"\\', 292) || E'\n\n\n\n'))$$) AS over_escapes;
-- Payload and headers count together: 2048 + 2048 bytes, then one more.
SELECT pg_temp.try($$SELECT outbox_emit('t', 'k', '1e2047', '{"n": 1e2040}')$$) AS both_at_limit,
       pg_temp.try($$SELECT outbox_emit('t', 'k', '1e2047', '{"n": 1e2041}')$$) AS both_over;
-- The set-based variant names the element, and writes nothing.
SELECT pg_temp.try($$SELECT outbox_emit_many('t', NULL, ARRAY['{}', '1e5000']::jsonb[])$$) AS many;
SELECT pg_temp.try($$SELECT outbox_emit_many('t', NULL, ARRAY['{}', '{}']::jsonb[], ARRAY[NULL, '{"h": -1e-5000}']::jsonb[])$$) AS many_headers;
-- The whole error of one: what it prints as, against the limit.
\set VERBOSITY default
SELECT outbox_emit('t', 'k', '1e131071');
SELECT outbox_emit('t', 'k', '{}', jsonb_build_object('h', repeat(chr(1), 1000)));
\set VERBOSITY terse
RESET pg_outbox.max_payload_size;
-- Under the default 1 MB: 1e131071 prints as 131,072 bytes and passes;
-- seven of them in an array too, eight do not (1,048,592 bytes).
SELECT pg_temp.try($$SELECT outbox_emit('t', 'k', '1e131071')$$) AS default_limit;
SELECT pg_temp.try($$SELECT outbox_emit('t', 'k', (SELECT jsonb_agg('1e131071'::jsonb) FROM generate_series(1, 7)))$$) AS seven,
       pg_temp.try($$SELECT outbox_emit('t', 'k', (SELECT jsonb_agg('1e131071'::jsonb) FROM generate_series(1, 8)))$$) AS eight;
-- Computed exactly as jsonb prints them, whatever the value.
SELECT count(*) AS sizes, count(*) FILTER (WHERE outbox.json_text_size(j) <> octet_length(j::text)) AS differ
  FROM (VALUES ('1e131071'::jsonb), ('-1e-16383'), ('0'), ('-0'), ('0.000'), ('-0.5'), ('1.50'), ('9999'), ('10000'),
               ('99999999'), ('100000000'), ('-123.456e-7'), ('1e-1'), ('12345678901234567890.0987654321'),
               (to_jsonb('NaN'::numeric)), (to_jsonb('Infinity'::numeric)), (to_jsonb('-Infinity'::numeric)),
               (to_jsonb(1.5::numeric(20, 10))), ('null'), ('true'), ('false'), ('""'), ('{}'), ('[]'),
               ('{"a": [1, {"b": null}], "": "", "c\td": "e\u001ff"}'),
               (to_jsonb((SELECT string_agg(chr(c), '') FROM generate_series(1, 300) c))),
               ((SELECT jsonb_agg(i * 1.5) FROM generate_series(-50, 50) i)),
               ((SELECT jsonb_object_agg('k' || i, repeat('v', i)) FROM generate_series(1, 70) i))) v(j);

-- Read-only transactions cannot emit.
BEGIN READ ONLY;
SELECT pg_temp.try($$SELECT outbox_emit('t', 'k', '{}')$$);
ROLLBACK;

-- The set-based variant checks every element and writes nothing on error.
SELECT pg_temp.try($$SELECT outbox_emit_many(NULL, NULL, ARRAY['{}']::jsonb[])$$);
SELECT pg_temp.try($$SELECT outbox_emit_many('', NULL, ARRAY['{}']::jsonb[])$$);
SELECT pg_temp.try($$SELECT outbox_emit_many('t', NULL, NULL)$$);
SELECT pg_temp.try($$SELECT outbox_emit_many('t', NULL, ARRAY['{}', NULL]::jsonb[])$$);
SELECT pg_temp.try($$SELECT outbox_emit_many('t', ARRAY['a'], ARRAY['{}', '{}']::jsonb[])$$);
SELECT pg_temp.try($$SELECT outbox_emit_many('t', ARRAY['a', repeat('k', 1025)], ARRAY['{}', '{}']::jsonb[])$$);
SELECT pg_temp.try($$SELECT outbox_emit_many('t', NULL, ARRAY['{}', '{}']::jsonb[], ARRAY[NULL, '[]']::jsonb[])$$);
SELECT pg_temp.try($$SELECT outbox_emit_many('t', NULL, ARRAY['{}', '{}']::jsonb[], ARRAY['{}']::jsonb[])$$);
SELECT pg_temp.try($$SELECT outbox_emit_many('t', NULL, ARRAY['{}']::jsonb[], NULL, ARRAY[]::uuid[])$$);
SELECT pg_temp.try($$SELECT outbox_emit_many('t', NULL, ARRAY[['{}'], ['{}']]::jsonb[])$$);
SELECT pg_temp.try($$SELECT outbox_emit_many('t', NULL, ARRAY['{}', jsonb_build_object('x', repeat('x', 1100000))])$$);

-- Only the "ok" calls above wrote a row.
SELECT count(*) AS rows_written FROM outbox.event;
TRUNCATE outbox.event;
