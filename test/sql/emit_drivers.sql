-- outbox_emit() and outbox_emit_many() as client drivers call them.
--
-- node-postgres sends every parameter without a type, and pgx prepares its
-- statements without types: the server takes them from the function. That
-- works only while each name has one signature that takes the call's
-- arguments; a second outbox_emit_many() taking text[] would make all these
-- calls ambiguous (42725). psycopg sends a Python list of str as text[] in
-- binary parameters (%b), for which there is no function (42883): the
-- caller casts ($3::jsonb[]) or sends a list of psycopg's Jsonb, which is
-- jsonb[] in either format. This file pins both.
\set VERBOSITY terse
SET client_min_messages = warning;
TRUNCATE outbox.event;

-- Parameters without a type resolve to the one signature.
PREPARE untyped_emit AS SELECT outbox_emit($1, $2, $3, $4, $5) IS NOT NULL AS emitted;
PREPARE untyped_many AS SELECT count(*) FROM outbox_emit_many($1, $2, $3, $4, $5);
PREPARE untyped_many3 AS SELECT count(*) FROM outbox_emit_many($1, $2, $3);
SELECT name, parameter_types FROM pg_prepared_statements WHERE name LIKE 'untyped%' ORDER BY name;
EXECUTE untyped_emit('t', NULL, '{"a": 1}', '{"source": "test"}', NULL);
EXECUTE untyped_many('t', '{k1,NULL}', '{"{\"a\": 2}","{\"a\": 3}"}', '{NULL,"{\"h\": 1}"}', NULL);
EXECUTE untyped_many3('t', NULL, '{"[4]","5"}');

-- text[] payloads, as psycopg sends lists of str in binary: no function
-- without a cast.
PREPARE texts(text, text[], text[]) AS SELECT count(*) FROM outbox_emit_many($1, $2, $3);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
PREPARE texts_cast(text, text[], text[], text[]) AS
    SELECT count(*) FROM outbox_emit_many($1, $2, $3::jsonb[], $4::jsonb[]);
EXECUTE texts_cast('t', NULL, ARRAY['{"a": 6}', '[7]'], NULL);
EXECUTE texts_cast('t', NULL, ARRAY[]::text[], NULL);

-- Hostile elements through the cast: each is refused with its SQLSTATE, and
-- nothing is written. Invalid JSON fails in the cast, which does not name the
-- element; what outbox_emit_many() checks names it.
EXECUTE texts_cast('t', NULL, ARRAY['{"a": 8}', '{"a": '], NULL);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
EXECUTE texts_cast('t', NULL, ARRAY['{"a": 8}', 'not json'], NULL);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
EXECUTE texts_cast('t', NULL, ARRAY['{"a": 8}', '"\u0000"'], NULL);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
EXECUTE texts_cast('t', NULL, ARRAY['{"a": 8}', NULL], NULL);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
EXECUTE texts_cast('t', NULL, ARRAY['{}', '{}'], ARRAY[NULL, '[]']);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
EXECUTE texts_cast('t', NULL, ARRAY['{}', '{}'], ARRAY['{"h": 1}', 'not json']);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
EXECUTE texts_cast('t', ARRAY['k'], ARRAY['{}', '{}'], NULL);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
EXECUTE texts_cast('t', NULL, ARRAY['{}', '{}'], ARRAY['{}']);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
EXECUTE texts_cast('t', NULL, ARRAY[ARRAY['{}'], ARRAY['{}']], NULL);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
EXECUTE texts_cast('t', NULL, ARRAY['{}', '{"x": "' || repeat('x', 1100000) || '"}'], NULL);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
EXECUTE texts_cast('t', NULL, ARRAY['{}', '{}'], ARRAY[NULL, '{"x": "' || repeat('x', 1100000) || '"}']);
\echo SQLSTATE :LAST_ERROR_SQLSTATE

-- Only the calls that returned a count wrote rows: 1 + 2 + 2 + 2.
SELECT count(*) AS rows_written FROM outbox.event;
SELECT key, payload, headers FROM outbox.event ORDER BY txid, seq;
DEALLOCATE ALL;
TRUNCATE outbox.event;

