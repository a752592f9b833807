-- The SQL engine's consumer checks (SQL_ENGINE_REGRESS). A SECURITY DEFINER
-- function cannot see the role that called it, and PL/pgSQL cannot call
-- what that role may not, so where the C engine checks current_user the SQL
-- engine checks the role the session acts as (SET ROLE's, else the session
-- user), and outbox.inbox_record(), which inbox_consume() calls as its
-- caller, is granted to consumers but refuses a consumer the role may not
-- act for, as if it were not granted.
\set VERBOSITY terse
SET client_min_messages = warning;
TRUNCATE outbox.inbox, outbox.dead_letters RESTART IDENTITY;
DELETE FROM outbox.consumers;

CREATE FUNCTION pg_temp.try(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN sqlstate || ': ' || sqlerrm;
END
$$;
GRANT EXECUTE ON FUNCTION pg_temp.try(text) TO PUBLIC;

CREATE ROLE regress_sqlengine_owner IN ROLE outbox_consumer;
CREATE ROLE regress_sqlengine_other IN ROLE outbox_consumer;
SELECT inbox_consumer_create('mine', 'regress_sqlengine_owner');
SELECT inbox_consumer_create('theirs', 'regress_sqlengine_other');

-- outbox.inbox_record() for a consumer of the role: it records, once (the
-- second event of the batch repeats the first one's id).
SET ROLE regress_sqlengine_owner;
SELECT outbox.inbox_record('mine', ARRAY['00000000-0000-4000-8000-000000000001'::uuid, '00000000-0000-4000-8000-000000000001'],
                           ARRAY['{"n": 1}'::jsonb, '{"n": 2}']);
SELECT inbox_apply('mine', '00000000-0000-4000-8000-000000000001', '{"n": 1}');
-- Another role's consumer, an unregistered one, bad arguments: refused
-- before anything is read or written.
SELECT pg_temp.try($$SELECT outbox.inbox_record('theirs', ARRAY['00000000-0000-4000-8000-000000000002'::uuid], ARRAY['{}'::jsonb])$$);
SELECT pg_temp.try($$SELECT outbox.inbox_record('unregistered', ARRAY['00000000-0000-4000-8000-000000000002'::uuid], ARRAY['{}'::jsonb])$$);
SELECT pg_temp.try($$SELECT outbox.inbox_record(NULL, ARRAY['00000000-0000-4000-8000-000000000002'::uuid], ARRAY['{}'::jsonb])$$);
SELECT pg_temp.try($$SELECT outbox.inbox_record('mine', ARRAY['00000000-0000-4000-8000-000000000002'::uuid], ARRAY[]::jsonb[])$$);
SELECT pg_temp.try($$SELECT outbox.inbox_record('mine', ARRAY[NULL, '00000000-0000-4000-8000-000000000002'::uuid], ARRAY['{}'::jsonb, NULL])$$);
SELECT pg_temp.try($$SELECT outbox.inbox_record('mine', ARRAY['00000000-0000-4000-8000-000000000002'::uuid, NULL], ARRAY[NULL, '{}'::jsonb])$$);
RESET ROLE;
SELECT consumer, event_id, payload FROM outbox.inbox ORDER BY consumer, event_id;

-- Inside a SECURITY DEFINER function, the role the session acts as is
-- checked, not the function's owner (the C engine checks the owner).
CREATE FUNCTION apply_as(consumer text, event_id uuid) RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, public
AS $$ SELECT inbox_apply(consumer, event_id, '{}') $$;
ALTER FUNCTION apply_as(text, uuid) OWNER TO regress_sqlengine_owner;
GRANT EXECUTE ON FUNCTION apply_as(text, uuid) TO regress_sqlengine_other;
SET ROLE regress_sqlengine_other;
SELECT pg_temp.try($$SELECT apply_as('mine', '00000000-0000-4000-8000-000000000003')$$);
SELECT apply_as('theirs', '00000000-0000-4000-8000-000000000003');
RESET ROLE;
SET ROLE regress_sqlengine_owner;
SELECT apply_as('mine', '00000000-0000-4000-8000-000000000004');
RESET ROLE;
SELECT consumer, event_id FROM outbox.inbox WHERE event_id > '00000000-0000-4000-8000-000000000002' ORDER BY consumer, event_id;

DROP FUNCTION apply_as(text, uuid);
TRUNCATE outbox.inbox, outbox.dead_letters;
DELETE FROM outbox.consumers;
DROP ROLE regress_sqlengine_owner, regress_sqlengine_other;
