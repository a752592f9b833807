-- What CREATE EXTENSION made (the test harness created the extension).
\set VERBOSITY terse
SET client_min_messages = warning;

-- The API lives in the extension's schema, storage in schema "outbox".
-- Both engines make the same functions, except where docs/engines.md's list of
-- the engines' differences says otherwise: the SQL engine runs a few as
-- the extension's owner (prosecdef and pins_settings are shown as NULL
-- for those here; test/sql/engine_c.sql and engine_sql.sql show them) and
-- has three functions of its own: outbox.notify_relays(), its trigger that
-- wakes relays, outbox.consumer_check(), the body of
-- inbox_consumer_check() that its functions running as the owner call, and
-- outbox.emit_trace(), the trace context of emitted events (in C in emit.c).
SELECT n.nspname, p.proname, pg_get_function_identity_arguments(p.oid) AS args,
       p.provolatile, p.proisstrict, p.proparallel,
       CASE WHEN NOT o.engine_own THEN p.prosecdef END AS prosecdef,
       CASE WHEN NOT o.engine_own THEN p.proconfig IS NOT NULL END AS pins_settings,
       obj_description(p.oid, 'pg_proc') IS NOT NULL AS documented
  FROM pg_proc p
  JOIN pg_namespace n ON n.oid = p.pronamespace
  JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
  JOIN pg_extension x ON x.oid = d.refobjid AND x.extname = 'pg_outbox'
  CROSS JOIN LATERAL (SELECT p.proname IN ('outbox_emit', 'outbox_emit_many', 'inbox_consumer_check',
                                           'inbox_dead_letter', 'dead_letter_take', 'outbox_relay_waiting',
                     'parked_match', 'parked_add', 'parked_settle', 'inbox_park_key',
                     'parked_take', 'inbox_parked_keys', 'inbox_redrive', 'inbox_skip') AS engine_own) o
 WHERE NOT (n.nspname = 'outbox' AND p.proname IN ('notify_relays', 'consumer_check', 'emit_trace'))
 ORDER BY 1, 2, 3;

-- Every SECURITY DEFINER function pins its search_path.
SELECT p.proname
  FROM pg_proc p
 WHERE p.prosecdef AND p.proname LIKE 'outbox%'
   AND NOT coalesce('search_path=pg_catalog, pg_temp' = ANY (p.proconfig), false);

-- A function that turns a planner method off turns JIT off too: a query
-- that must use the method anyway looks expensive enough to be compiled,
-- which costs far more than running it.
SELECT p.proname
  FROM pg_proc p
 WHERE p.pronamespace IN ('outbox'::regnamespace, (SELECT extnamespace FROM pg_extension WHERE extname = 'pg_outbox'))
   AND EXISTS (SELECT 1 FROM unnest(p.proconfig) c WHERE c ~ '^enable_[a-z_]+=off$')
   AND NOT 'jit=off' = ANY (p.proconfig);

-- Tables, views and their comments.
SELECT c.relname, c.relkind, obj_description(c.oid, 'pg_class') IS NOT NULL AS documented
  FROM pg_class c
 WHERE c.relnamespace = 'outbox'::regnamespace AND c.relkind IN ('r', 'p', 'v')
   AND c.relname !~ '^(event|inbox|commit_log)_[0-9]+$'
 ORDER BY 1;

-- Partitions cover the current transaction id and the configured headroom,
-- and a default partition catches anything beyond.
SELECT count(*) FILTER (WHERE c.relname ~ '^event_[0-9]+$') >= 5 AS premade,
       count(*) FILTER (WHERE c.relname = 'event_default') AS default_partition
  FROM pg_inherits i
  JOIN pg_class c ON c.oid = i.inhrelid
 WHERE i.inhparent = 'outbox.event'::regclass;

SELECT EXISTS (
    SELECT 1 FROM outbox.partition_bounds()
     WHERE lower <= pg_current_xact_id() AND pg_current_xact_id() < upper) AS current_partition_exists;

-- Every partition has the (txid, seq) index.
SELECT count(*) = 0 AS all_partitions_indexed
  FROM pg_inherits i
 WHERE i.inhparent = 'outbox.event'::regclass
   AND NOT EXISTS (SELECT 1 FROM pg_index x
                    WHERE x.indrelid = i.inhrelid AND x.indisprimary
                      AND x.indkey::text = '1 2');

-- Settings.
SELECT partition_width, premake FROM outbox.config;

-- Roles exist; installing into a second database reuses them.
SELECT rolname, rolcanlogin FROM pg_roles WHERE rolname LIKE 'outbox\_%' ORDER BY 1;
\set regress_db :DBNAME
CREATE DATABASE regress_outbox_second;
\c regress_outbox_second
SET client_min_messages = warning;
CREATE EXTENSION pg_outbox;
SELECT extversion FROM pg_extension WHERE extname = 'pg_outbox';
\c :regress_db
DROP DATABASE regress_outbox_second;
\set VERBOSITY terse
SET client_min_messages = warning;

-- Creating it again fails cleanly.
CREATE EXTENSION pg_outbox;
