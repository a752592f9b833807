-- What only the SQL engine does (make installcheck-sql-engine runs this
-- file on it alone): its refusals, where the C engine has what SQL and
-- PL/pgSQL cannot give, and the ways its emission differs in form.
\set VERBOSITY terse
\set SHOW_CONTEXT never
SET client_min_messages = warning;

CREATE FUNCTION pg_temp.try(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN sqlstate || ': ' || sqlerrm;
END
$$;

SELECT engine, version = (SELECT extversion FROM pg_extension WHERE extname = 'pg_outbox_sql') AS version_matches
  FROM outbox.engine();

-- No commit order: groups are xid8-ordered by default, and whatever makes
-- or reads a commit-ordered group is refused (0A000), naming the C engine.
SELECT outbox.commit_order_available();
SELECT outbox_group_create('by_default');
SELECT name, ordering FROM outbox.groups WHERE name = 'by_default';
SELECT outbox_group_drop('by_default');
\set VERBOSITY default
SELECT outbox_group_create('by_commit', ordering => 'commit');
\set VERBOSITY terse
SELECT pg_temp.try($$SELECT outbox_group_create('by_commit', start_at => 'beginning', ordering => 'commit')$$) AS from_beginning,
       pg_temp.try($$SELECT outbox_group_create('by_commit', ordering => 'commit', shards => 4)$$) AS sharded;
SELECT pg_temp.try($$SELECT outbox.commit_horizon()$$) AS commit_horizon;
SELECT pg_temp.try($$SELECT outbox.commit_order_lock()$$) AS commit_order_lock;
-- Nothing was made by the refusals.
SELECT count(*) AS groups FROM outbox.groups;

-- No background worker: nothing records maintenance runs (55000), and
-- nothing is woken at commit.
\set VERBOSITY default
SELECT * FROM outbox_maintenance_databases();
\set VERBOSITY terse
SELECT outbox.maintenance_wake();
-- The maintenance lock is a transaction-level advisory lock.
BEGIN;
SELECT outbox.try_maintenance_lock() AS first, outbox.try_maintenance_lock() AS again;
SELECT locktype, classid, objid, objsubid, mode FROM pg_locks
 WHERE pid = pg_backend_pid() AND locktype = 'advisory';
COMMIT;
SELECT count(*) AS advisory_locks_after_commit FROM pg_locks
 WHERE pid = pg_backend_pid() AND locktype = 'advisory';

-- Emission writes as the extension's owner: callers need EXECUTE on the
-- functions, not INSERT on the table (the privileges test shows both).
-- So do the inbox's consumer check, dead letters and the entries of
-- parked keys, which read and write tables their callers cannot (the C
-- engine's functions run as their callers and check in C; install.sql
-- leaves these out).
SELECT p.proname, pg_get_function_identity_arguments(p.oid) AS args, p.prosecdef, p.proconfig
  FROM pg_proc p
 WHERE p.proname IN ('outbox_emit', 'outbox_emit_many', 'inbox_consumer_check', 'inbox_dead_letter', 'dead_letter_take', 'outbox_relay_waiting',
                     'parked_match', 'parked_add', 'parked_settle', 'inbox_park_key',
                     'parked_take', 'inbox_parked_keys', 'inbox_redrive', 'inbox_skip',
                     'consumer_check')
 ORDER BY 1, 2;
-- Relays are woken by a deferred constraint trigger, queued by the first
-- event of each transaction.
SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = 'outbox.event'::regclass;

TRUNCATE outbox.event;

-- A rolled-back savepoint that holds a transaction's first event takes
-- the transaction's numbering with it: the next event is numbered 1 again
-- (the C engine goes on from the rolled-back numbers). Positions stay
-- unique and in emission order.
BEGIN;
SAVEPOINT s;
SELECT outbox_emit('t', 'rolled back', '1') IS NOT NULL AS emitted;
ROLLBACK TO SAVEPOINT s;
SELECT outbox_emit('t', 'first kept', '2') IS NOT NULL AS emitted;
SAVEPOINT s2;
SELECT outbox_emit('t', 'rolled back too', '3') IS NOT NULL AS emitted;
ROLLBACK TO SAVEPOINT s2;
SELECT count(*) FROM outbox_emit_many('t', ARRAY['many 1', 'many 2'], ARRAY['4', '5']::jsonb[]);
SELECT key, seq FROM outbox.event WHERE txid = pg_current_xact_id() ORDER BY seq;
COMMIT;

-- Generated event ids are version 7 UUIDs: the time in their first 48
-- bits, the version, the variant.
SELECT count(*) AS ids,
       count(*) FILTER (WHERE substr(event_id::text, 15, 1) = '7') AS version_7,
       count(*) FILTER (WHERE substr(event_id::text, 20, 1) IN ('8', '9', 'a', 'b')) AS rfc_variant,
       count(*) FILTER (WHERE abs(extract(epoch FROM created_at) * 1000
                                  - ('x' || lpad(replace(substr(event_id::text, 1, 13), '-', ''), 16, '0'))::bit(64)::bigint) < 1) AS time_of_creation
  FROM outbox.event;

-- pg_outbox.max_payload_size without pg_outbox.so is a placeholder: any
-- text may be set, and emission checks it as the C engine's SET would.
SET pg_outbox.max_payload_size = '4kB';
SELECT pg_temp.try($$SELECT outbox_emit('t', 'k', jsonb_build_object('x', repeat('x', 5000)))$$) AS over_4kb,
       pg_temp.try($$SELECT outbox_emit('t', 'k', jsonb_build_object('x', repeat('x', 3000)))$$) AS under_4kb;
SET pg_outbox.max_payload_size = '8192';
SELECT pg_temp.try($$SELECT outbox_emit('t', 'k', jsonb_build_object('x', repeat('x', 5000)))$$) AS under_8192;
SET pg_outbox.max_payload_size = 10;
SELECT pg_temp.try($$SELECT outbox_emit('t', 'k', '{}')$$) AS too_small;
SET pg_outbox.max_payload_size = '1TB';
SELECT pg_temp.try($$SELECT outbox_emit('t', 'k', '{}')$$) AS too_large;
SET pg_outbox.max_payload_size = 'lots';
SELECT pg_temp.try($$SELECT outbox_emit('t', 'k', '{}')$$) AS not_a_size;
SELECT pg_temp.try($$SELECT outbox_emit_many('t', NULL, ARRAY['{}']::jsonb[])$$) AS not_a_size_many;
RESET pg_outbox.max_payload_size;

-- pg_outbox.today, which only a superuser sets on the C engine (PostgreSQL
-- checks who sets it there), is a placeholder here: taken in the session
-- of a superuser or a member of outbox_admin, refused in any other, so
-- that a relay's role cannot move maintenance's day ahead to drop inbox
-- days still retained.
CREATE ROLE engine_sql_relay IN ROLE outbox_relay;
CREATE ROLE engine_sql_admin IN ROLE outbox_admin;
SET SESSION AUTHORIZATION engine_sql_relay;
SET pg_outbox.today = '2100-01-01';
SELECT pg_temp.try($$SELECT outbox_maintain()$$) AS today_by_relay;
RESET pg_outbox.today;
SELECT pg_temp.try($$SELECT outbox_maintain()$$) AS reset;
SET SESSION AUTHORIZATION engine_sql_admin;
SELECT set_config('pg_outbox.today', (current_date + 1)::text, false) IS NOT NULL AS tomorrow;
SELECT pg_temp.try($$SELECT outbox_maintain()$$) AS today_by_admin;
RESET pg_outbox.today;
RESET SESSION AUTHORIZATION;
DROP ROLE engine_sql_relay, engine_sql_admin;
TRUNCATE outbox.event;

-- A value read from a table may be stored compressed, or with a short
-- header: its size as jsonb is counted as the C engine counts it, from the
-- value detoasted (the C engine prints the same errors).
CREATE TEMP TABLE stored (n int, p jsonb, h jsonb);
INSERT INTO stored VALUES (1, jsonb_build_object('x', repeat('x', 1100000)), NULL),
                          (2, '{"a": 1}', jsonb_build_object('h', repeat('h', 1100000))),
                          (3, '{"s": "small"}', '{"t": "tiny"}');
SELECT n, pg_column_compression(p) IS NOT NULL AS p_compressed, pg_column_compression(h) IS NOT NULL AS h_compressed
  FROM stored ORDER BY n;
\set VERBOSITY default
SELECT outbox_emit('t', 'k', p, h) FROM stored WHERE n = 1;
SELECT outbox_emit('t', 'k', p, h) FROM stored WHERE n = 2;
SELECT count(*) FROM outbox_emit_many('t', NULL, (SELECT array_agg(p ORDER BY n) FROM stored),
                                      (SELECT array_agg(h ORDER BY n) FROM stored));
\set VERBOSITY terse
SELECT outbox_emit('t', 'k', p, h) IS NOT NULL AS emitted FROM stored WHERE n = 3;
SELECT payload, headers FROM outbox.event WHERE key = 'k' AND headers IS NOT NULL;

-- The shard of an event is the C engine's (CRC-32C): fixed values, also
-- of multibyte text.
SELECT outbox.shard_of('orders', 'k1', 4) AS a, outbox.shard_of('orders', NULL, 7) AS b,
       outbox.shard_of('a', '', 256) AS c, outbox.shard_of('é', 'ü', 256) AS d,
       outbox.shard_of('orders', 'k1', NULL) AS e;
SELECT pg_temp.try($$SELECT outbox.shard_of('t', 'k', 0)$$) AS zero_shards;

TRUNCATE outbox.event;

-- An event refused as too large (OB004) is remembered (two sequences), so
-- that a relay holding at it does not have it printed again at each fetch:
-- the second refusal comes from the memory (shown by changing the size it
-- holds), another group's fetch leaves it, and its own group forgets it
-- once past it. (Its first printing takes a few seconds.)
CREATE FUNCTION pg_temp.refusal(g text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    PERFORM outbox_fetch_packed(g, 10);
    RETURN 'fetched';
EXCEPTION WHEN OTHERS THEN
    RETURN sqlstate || ': ' || regexp_replace(sqlerrm, 'position [0-9]+-', 'position N-');
END
$$;
CREATE FUNCTION pg_temp.remembered(OUT key_set boolean, OUT group_name text, OUT size bigint) LANGUAGE sql AS $$
    SELECT pg_sequence_last_value('outbox.fetch_refused_key') IS NOT NULL,
           (SELECT name FROM outbox.groups WHERE id = pg_sequence_last_value('outbox.fetch_refused_size') >> 32),
           pg_sequence_last_value('outbox.fetch_refused_size') & 4294967295
$$;
SELECT outbox_group_create('held', start_at => 'beginning');
SELECT outbox_group_create('other', start_at => 'beginning');
INSERT INTO outbox.event (txid, seq, event_id, topic, key, payload, headers, created_at)
SELECT pg_current_xact_id(), 1, gen_random_uuid(), 't', 'big', jsonb_agg('1e131071'::jsonb), NULL, now()
  FROM generate_series(1, 2100);
SELECT outbox_emit('t', 'after', '{}') IS NOT NULL AS emitted;
SELECT outbox_skip('other', (SELECT txid || '-' || seq FROM outbox.event WHERE key = 'big'), 'too large') IS NOT NULL AS skipped;
SELECT * FROM pg_temp.remembered();
SELECT pg_temp.refusal('held') AS first_refusal;
SELECT * FROM pg_temp.remembered();
SELECT setval('outbox.fetch_refused_size', (pg_sequence_last_value('outbox.fetch_refused_size') >> 32 << 32) | 999999999);
CREATE FUNCTION pg_temp.refused_size(g text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    d text;
BEGIN
    PERFORM outbox_fetch_packed(g, 10);
    RETURN 'fetched';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS d = PG_EXCEPTION_DETAIL;
    RETURN sqlstate || ': ' || substring(d FROM 'print as ([0-9]+) bytes');
END
$$;
SELECT pg_temp.refused_size('held') AS from_memory;
-- Another group, past the event, fetches and leaves the memory as it is.
SELECT pg_temp.refusal('other') AS other_group;
SELECT * FROM pg_temp.remembered();
-- Passed with outbox_skip(), the event is forgotten by its group's next fetch.
SELECT outbox_skip('held', (SELECT txid || '-' || seq FROM outbox.event WHERE key = 'big'), 'too large') IS NOT NULL AS skipped;
SELECT pg_temp.refusal('held') AS after_skip;
SELECT * FROM pg_temp.remembered();
SELECT outbox_group_drop('held'), outbox_group_drop('other');
TRUNCATE outbox.event;
