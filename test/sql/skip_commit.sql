-- outbox_skip() in a commit-ordered group (needs pg_outbox preloaded):
-- positions are "<ticket>-<seq>", and the group's next event is read as a
-- fetch reads it, the commit horizon first.
\set VERBOSITY terse
SET client_min_messages = warning;

CREATE FUNCTION pg_temp.state(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN sqlstate;
END
$$;
-- The position of the event with this key in commit order.
CREATE FUNCTION pg_temp.pos_of(k text) RETURNS text LANGUAGE sql AS $$
    SELECT c.ticket || '-' || e.seq FROM outbox.event e JOIN outbox.commit_log c ON c.txid = e.txid WHERE e.key = k
$$;

TRUNCATE outbox.event, outbox.commit_log;
SELECT outbox_group_create('skipc', start_at => 'beginning', ordering => 'commit');
SELECT outbox_emit('t', 'a', '{}') IS NOT NULL AS a;
-- "big" shares the transaction (and the ticket) of "b", which emitted.
BEGIN;
SELECT outbox_emit('t', 'b', '{}') IS NOT NULL AS b;
INSERT INTO outbox.event (txid, seq, event_id, topic, key, payload, headers, created_at)
SELECT pg_current_xact_id(), 2, gen_random_uuid(), 't', 'big', jsonb_agg('1e131071'::jsonb), NULL, now()
  FROM generate_series(1, 2100);
COMMIT;
SELECT outbox_emit('t', 'c', '{}') IS NOT NULL AS c;

SELECT string_agg(key, ' ' ORDER BY n) AS batch FROM outbox_fetch('skipc') WITH ORDINALITY f(pos, txid, seq, event_id, topic, key, payload, headers, created_at, n);
SELECT outbox_advance('skipc', pg_temp.pos_of('b'));
SELECT pg_temp.state($$SELECT outbox_fetch_packed('skipc')$$) AS refused;
-- Not at REPEATABLE READ: its snapshot could hide the group's next event.
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT pg_temp.state(format($$SELECT outbox_skip('skipc', %L, 'r')$$, pg_temp.pos_of('big'))) AS repeatable_read;
ROLLBACK;
SELECT pg_temp.state(format($$SELECT outbox_skip('skipc', %L, 'r')$$, pg_temp.pos_of('c'))) AS not_next;
SELECT outbox_skip('skipc', pg_temp.pos_of('big'), 'too large') = pg_temp.pos_of('big') AS skipped;
SELECT string_agg(key, ' ' ORDER BY n) AS then_published FROM outbox_fetch('skipc') WITH ORDINALITY f(pos, txid, seq, event_id, topic, key, payload, headers, created_at, n);
SELECT pos = pg_temp.pos_of('big') AS recorded, key, reason FROM outbox.skipped_events;

SELECT outbox_group_drop('skipc');
TRUNCATE outbox.event, outbox.commit_log, outbox.skipped_events;
