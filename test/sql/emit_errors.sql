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
SET pg_outbox.max_payload_size = 10;
RESET pg_outbox.max_payload_size;
-- 5 MB of headers under the default 1 MB cap.
SELECT pg_temp.try($$SELECT outbox_emit('t', 'k', '{}', jsonb_build_object('h', repeat('h', 5000000)))$$);

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

-- Only the two "ok" calls above wrote a row.
SELECT count(*) AS rows_written FROM outbox.event;
TRUNCATE outbox.event;
