-- What only the C engine has, of what the shared tests would otherwise
-- assert (C_ONLY_REGRESS in the Makefile; the SQL engine's own answers are
-- in test/sql/engine_sql.sql):
--
-- * Its settings are configuration parameters that pg_outbox.so defines,
--   so PostgreSQL checks a value when it is set (bounds, units, who may set
--   it) and SHOW has a default. Without the library the same names are
--   placeholders: any role may set any text, which the SQL engine checks
--   where it reads it.
-- * A fetch keeps its batch in a memory context of the session (fetch.c),
--   given back once the batch is read.
-- * The functions that the SQL engine runs as the extension's owner run
--   as their caller.
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

-- The settings and their defaults, once the library is loaded.
LOAD 'pg_outbox';
SHOW pg_outbox.max_payload_size;
SHOW pg_outbox.notify;
SHOW pg_outbox.max_group_streams;

-- pg_outbox.max_payload_size: 1 kB to 256 MB.
SELECT pg_temp.try($$SET pg_outbox.max_payload_size = 10$$);
RESET pg_outbox.max_payload_size;

-- The lease each leader sets for itself: 100 ms to 1 hour, refused outside.
SELECT pg_temp.try($$SET pg_outbox.lease = '99ms'$$);
SELECT pg_temp.try($$SET pg_outbox.lease = '61min'$$);
SELECT pg_temp.try($$SET pg_outbox.lease = '-1s'$$);
SELECT pg_temp.try($$SET pg_outbox.lease = 'soon'$$);
SELECT pg_temp.try($$SET pg_outbox.lease = '99999999999999999999'$$);
RESET pg_outbox.lease;

-- pg_outbox.max_group_streams: only a superuser sets the bound, 1 or more.
SET ROLE outbox_admin;
SELECT pg_temp.try($$SET pg_outbox.max_group_streams = 1$$);
RESET ROLE;
SELECT pg_temp.try($$SET pg_outbox.max_group_streams = 0$$);
RESET pg_outbox.max_group_streams;

-- A batch's rows are kept in memory of the session that outlives the
-- calling query, for the next batch; the memory of a large batch is given
-- back once the batch is read.
TRUNCATE outbox.event;
SELECT outbox_group_create('memory', ordering => 'xid8', start_at => 'beginning');
SELECT count(*) FROM outbox_emit_many('small', NULL, (SELECT array_agg(jsonb_build_object('i', i)) FROM generate_series(1, 10) i));
SELECT a.key, b.key FROM outbox_fetch('memory', 2) a FULL JOIN outbox_fetch('memory', 3) b USING (pos);
SELECT total_bytes > 0 AS kept FROM pg_backend_memory_contexts WHERE name = 'pg_outbox fetch';
SET work_mem = '64MB';
SELECT count(*) FROM outbox_emit_many('bulk',
    (SELECT array_agg(i::text) FROM generate_series(1, 20000) i),
    (SELECT array_agg(jsonb_build_object('pad', repeat('x', 500))) FROM generate_series(1, 20000)));
SELECT count(*) > 20000 AS all_there, sum(octet_length(payload::text)) > 8 * 1024 * 1024 AS large
  FROM outbox_fetch('memory', 30000);
SELECT total_bytes < 1024 * 1024 AS given_back FROM pg_backend_memory_contexts WHERE name = 'pg_outbox fetch';
RESET work_mem;
SELECT outbox_group_drop('memory');
TRUNCATE outbox.event;

-- * Who runs the functions that the SQL engine runs as the extension's
--   owner (install.sql leaves their security out): here, the caller.
SELECT p.proname, pg_get_function_identity_arguments(p.oid) AS args, p.prosecdef, p.proconfig
  FROM pg_proc p
 WHERE p.proname IN ('outbox_emit', 'outbox_emit_many', 'inbox_consumer_check', 'inbox_dead_letter', 'dead_letter_take', 'outbox_relay_waiting',
                     'parked_match', 'parked_add', 'parked_settle', 'inbox_park_key',
                     'parked_take', 'inbox_parked_keys', 'inbox_redrive', 'inbox_skip')
 ORDER BY 1, 2;
SELECT to_regproc('outbox.notify_relays') AS notify_relays, to_regproc('outbox.consumer_check') AS consumer_check;
