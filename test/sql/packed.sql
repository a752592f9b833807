-- outbox_fetch_packed(): the batch of outbox_fetch() in one value, each
-- field exactly the text the relay would otherwise format from the rows.
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

-- The packed format, read in SQL (pack.c describes it).
CREATE FUNCTION pg_temp.u32(b bytea, o int) RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
    SELECT (get_byte(b, o)::bigint << 24) | (get_byte(b, o + 1) << 16) | (get_byte(b, o + 2) << 8) | get_byte(b, o + 3)
$$;
CREATE FUNCTION pg_temp.header(b bytea, OUT magic text, OUT count bigint, OUT first_age_us bigint)
LANGUAGE sql IMMUTABLE AS $$
    SELECT convert_from(substring(b FROM 1 FOR 4), 'UTF8'), pg_temp.u32(b, 4),
           (pg_temp.u32(b, 8) << 32 | pg_temp.u32(b, 12))
$$;
CREATE FUNCTION pg_temp.unpack(b bytea)
RETURNS TABLE (n int, pos text, event_id text, topic text, key text, payload text, headers text, created_at text)
LANGUAGE plpgsql AS $$
DECLARE
    o int := 16;
    f text[];
    len bigint;
BEGIN
    FOR i IN 1 .. (pg_temp.header(b)).count LOOP
        f := '{}';
        FOR j IN 1 .. 7 LOOP
            len := pg_temp.u32(b, o);
            IF len = 4294967295 THEN
                f := f || NULL::text;
                o := o + 4;
            ELSE
                f := f || convert_from(substring(b FROM o + 5 FOR len::int), 'UTF8');
                o := o + 4 + len::int;
            END IF;
        END LOOP;
        n := i; pos := f[1]; event_id := f[2]; topic := f[3]; key := f[4];
        payload := f[5]; headers := f[6]; created_at := f[7];
        RETURN NEXT;
    END LOOP;
    IF o <> length(b) THEN
        RAISE EXCEPTION 'packed batch of % bytes ends at %', length(b), o;
    END IF;
END
$$;

-- What the relay formats from outbox_fetch()'s rows.
CREATE FUNCTION pg_temp.rows(g text, size int)
RETURNS TABLE (n int, pos text, event_id text, topic text, key text, payload text, headers text, created_at text)
LANGUAGE sql AS $$
    SELECT ordinality::int, pos, event_id::text, topic, key, payload::text, headers::text,
           to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
      FROM outbox_fetch(g, size) WITH ORDINALITY
$$;

-- Both agree on every field of every event: the count of those that differ.
CREATE FUNCTION pg_temp.differ(g text, size int) RETURNS bigint LANGUAGE sql AS $$
    SELECT count(*) FROM (
        (SELECT * FROM pg_temp.rows(g, size) EXCEPT ALL SELECT * FROM pg_temp.unpack(outbox_fetch_packed(g, size)))
        UNION ALL
        (SELECT * FROM pg_temp.unpack(outbox_fetch_packed(g, size)) EXCEPT ALL SELECT * FROM pg_temp.rows(g, size))
    ) d
$$;

TRUNCATE outbox.event;
SELECT outbox_group_create('packed', ordering => 'xid8');
SELECT outbox_group_create('packed-payments', ARRAY['payments'], ordering => 'xid8');

-- An empty batch: the header alone, no age.
SELECT length(outbox_fetch_packed('packed')) AS bytes, (pg_temp.header(outbox_fetch_packed('packed'))).*;

-- Payloads and headers that test every path of the JSON writer: escapes
-- of every control character, quotes and backslashes, text beyond ASCII,
-- numbers in every form, root scalars, empty and nested containers,
-- objects and arrays longer than the offset stride of jsonb (32), deep
-- nesting, and a long (compressed) string.
CREATE TEMP TABLE corpus (n serial, j jsonb);
INSERT INTO corpus (j) VALUES
    ('{}'), ('[]'), ('null'), ('true'), ('false'), ('0'), ('-0'), ('"scalar"'), ('""'),
    ('1.50'), ('-123.456e-7'), ('1e100'), ('12345678901234567890123456789'), ('0.000000000000000000001'),
    ('{"a": 1, "b": [true, false, null, 2.5, "x"], "c": {"d": {}, "e": []}}'),
    ('[[[[[]]]], {"": ""}, [{}]]'),
    ('{"quote": "a\"b", "backslash": "a\\b", "slash": "a/b", "tab": "a\tb", "nl": "a\nb", "cr": "\r", "ff": "\f", "bs": "\b"}'),
    ('{"keys \"quoted\" and \\ too": "v", "ключ": "значение", "emoji 🎉": "日本語", "\u007f": "\u007f"}'),
    (to_jsonb(repeat('long text ', 20000))),
    ((SELECT jsonb_object_agg('k' || i, i) FROM generate_series(1, 100) i)),
    ((SELECT jsonb_agg(CASE WHEN i % 3 = 0 THEN to_jsonb(i) WHEN i % 3 = 1 THEN to_jsonb('s' || i) ELSE jsonb_build_object('i', i) END)
        FROM generate_series(1, 100) i)),
    ((SELECT jsonb_object_agg(repeat('k', i), repeat('v', 100 - i)) FROM generate_series(1, 70) i)),
    (to_jsonb((SELECT string_agg(chr(c), '') FROM generate_series(1, 127) c))),
    ((SELECT jsonb_object_agg(chr(c), chr(c)) FROM generate_series(1, 40) c));
-- 300 levels of nesting.
INSERT INTO corpus (j) SELECT (repeat('[', 150) || repeat('{"a": ', 150) || '1' || repeat('}', 150) || repeat(']', 150))::jsonb;
-- Random documents built from the others.
INSERT INTO corpus (j)
SELECT jsonb_build_object('id', i, 'parts', (SELECT jsonb_agg(j ORDER BY n) FROM corpus WHERE (n * 7 + i) % 5 = 0 AND n < 27),
                          'n', (i * 1.25)::numeric, 'neg', -i, 'text', md5(i::text))
  FROM generate_series(1, 50) i;
-- A character to escape, or one just beside the limits (0x1f, 0x20,
-- 0x7f, bytes above 0x7f), at every offset of the first three 8-byte
-- words, with text of every length after it.
INSERT INTO corpus (j)
SELECT jsonb_build_object(repeat('k', o) || c, repeat('a', o) || c || repeat('b', l))
  FROM generate_series(0, 17) o, generate_series(0, 9, 3) l,
       unnest(ARRAY[chr(1), chr(31), ' ', '"', '\', chr(127), 'é', '€', 'x"y\z' || chr(10)]) c;

SELECT count(*) IS NOT NULL AS emitted FROM (
    SELECT outbox_emit(CASE WHEN n % 4 = 0 THEN 'payments' ELSE 'orders' END,
                       CASE WHEN n % 3 = 0 THEN NULL ELSE 'key "' || n || '" ' || chr(9) || ' é' END,
                       j, CASE WHEN n % 2 = 0 THEN NULL ELSE jsonb_build_object('trace', n, 'h', j) END)
      FROM corpus ORDER BY n) e;

-- Every event, in one batch and in batches of 7, and through a topic filter.
SELECT (pg_temp.header(outbox_fetch_packed('packed', 1000))).count = (SELECT count(*) FROM corpus) AS all_events;
SELECT pg_temp.differ('packed', 1000) AS differ_all, pg_temp.differ('packed', 7) AS differ_7,
       pg_temp.differ('packed-payments', 1000) AS differ_payments;
SELECT count(*) AS payments FROM pg_temp.unpack(outbox_fetch_packed('packed-payments')) WHERE topic = 'payments';
-- The JSON text equals jsonb's own output, character for character.
SELECT count(*) AS json_differs FROM pg_temp.unpack(outbox_fetch_packed('packed', 1000)) u
  JOIN outbox.event e ON e.event_id::text = u.event_id
 WHERE u.payload IS DISTINCT FROM e.payload::text OR u.headers IS DISTINCT FROM e.headers::text;
-- The age of the first event is its age.
SELECT (pg_temp.header(outbox_fetch_packed('packed'))).first_age_us BETWEEN 0 AND
       extract(epoch FROM clock_timestamp() - (SELECT min(created_at) FROM outbox.event)) * 1e6 AS age_bounded;

-- The batch of a position after the cursor.
SELECT pg_temp.differ('packed', 3) AS differ_first_3;
SELECT count(*) AS after_fourth FROM pg_temp.unpack(outbox_fetch_packed('packed', 1000,
    (SELECT pos FROM outbox_fetch('packed', 4) OFFSET 3)));

-- Arguments are those of outbox_fetch(), refused the same way.
SELECT pg_temp.try($$SELECT outbox_fetch_packed('packed', 0)$$) AS zero;
SELECT pg_temp.try($$SELECT outbox_fetch_packed('packed', 1000, 'not a position')$$) AS bad_after;
SELECT pg_temp.try($$SELECT outbox_fetch_packed('no such group')$$) AS unknown;
SELECT pg_temp.try($$SELECT outbox_fetch_packed('packed', 10, NULL, '11 seconds')$$) AS long_wait;
SELECT pg_temp.try($$SELECT outbox_fetch_packed(NULL)$$) AS null_group;

-- A batch holds at most 64 MB: it stops before an event that would take it
-- past them. Four events of 22 MB each come in batches of two and two, in
-- order.
TRUNCATE outbox.event;
SELECT outbox_group_drop('packed');
SELECT outbox_group_create('packed', ordering => 'xid8');
SET pg_outbox.max_payload_size = '80MB';
SELECT count(outbox_emit('big', NULL, jsonb_build_object('i', i, 's', repeat(chr(64 + i), 22 * 1024 * 1024))))
  FROM generate_series(1, 4) i;
SELECT (h).count AS first_batch, (h).first_age_us >= 0 AS aged, length(outbox_fetch_packed('packed')) <= 64 * 1024 * 1024 AS within_cap
  FROM (SELECT pg_temp.header(outbox_fetch_packed('packed')) AS h) b;
SELECT n, pos = (SELECT pos FROM outbox_fetch('packed', 4) OFFSET 1 + n LIMIT 1) AS in_order, left(payload, 10) AS payload
  FROM pg_temp.unpack(outbox_fetch_packed('packed', 1000, (SELECT pos FROM outbox_fetch('packed', 2) OFFSET 1)));
-- An event larger than the cap comes alone: the batch before it stops
-- before it, and the next batch holds it and nothing else. Numbers print
-- with their digits: 520 numbers of 131,072 digits print as 68 MB.
TRUNCATE outbox.event;
SELECT outbox_emit('small', 'a', '{"i": 1}') IS NOT NULL AS a,
       outbox_emit('numbers', 'b', jsonb_agg('1e131071'::jsonb)) IS NOT NULL AS b,
       outbox_emit('small', 'c', '{"i": 3}') IS NOT NULL AS c
  FROM generate_series(1, 520);
SELECT outbox.json_text_size(payload) > 64 * 1024 * 1024 AS over_cap FROM outbox.event WHERE key = 'b';
SELECT string_agg(key, ' ' ORDER BY n) AS first_batch FROM pg_temp.unpack(outbox_fetch_packed('packed'));
SELECT string_agg(key, ' ' ORDER BY n) AS alone, sum(length(payload)) AS payload_bytes
  FROM pg_temp.unpack(outbox_fetch_packed('packed', 1000, (SELECT pos FROM outbox_fetch('packed', 1))));
SELECT string_agg(key, ' ' ORDER BY n) AS after_it
  FROM pg_temp.unpack(outbox_fetch_packed('packed', 1000, (SELECT pos FROM outbox_fetch('packed', 2) OFFSET 1)));
RESET pg_outbox.max_payload_size;

-- Only relays and admins may call it.
SELECT has_function_privilege('outbox_relay', 'outbox_fetch_packed(text, integer, text, interval)', 'EXECUTE') AS relay,
       has_function_privilege('outbox_writer', 'outbox_fetch_packed(text, integer, text, interval)', 'EXECUTE') AS writer,
       has_function_privilege('public', 'outbox_fetch_packed(text, integer, text, interval)', 'EXECUTE') AS public;

SELECT outbox_group_drop('packed');
SELECT outbox_group_drop('packed-payments');
TRUNCATE outbox.event;
