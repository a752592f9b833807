-- The C engine names the entry whose handler raised in the error's
-- context ("inbox_consume() handler for event ..."), so that a failing
-- batch says which event to look at. PL/pgSQL cannot add a line to an
-- error's context, so the SQL engine does not (C_ONLY_REGRESS).
\set VERBOSITY terse
SET client_min_messages = warning;
SELECT inbox_consumer_create('ledger', current_user::regrole);
DO $$
DECLARE
    c text;
BEGIN
    PERFORM inbox_consume('ledger', 'SELECT 1 / ($3->>''d'')::int',
        ARRAY[convert_to('00000000-0000-4000-8000-0000000000f1', 'UTF8'), convert_to('00000000-0000-4000-8000-0000000000f2', 'UTF8')],
        ARRAY[convert_to('t', 'UTF8'), convert_to('t', 'UTF8')], NULL,
        ARRAY[convert_to('{"d": 1}', 'UTF8'), convert_to('{"d": 0}', 'UTF8')], NULL);
EXCEPTION WHEN division_by_zero THEN
    GET STACKED DIAGNOSTICS c = PG_EXCEPTION_CONTEXT;
    RAISE WARNING '%', split_part(c, E'\n', 2);
END
$$;
SELECT count(*) AS nothing_applied FROM outbox.inbox WHERE consumer = 'ledger';
SELECT inbox_consumer_drop('ledger');
