-- An event too large to publish: a fetch stops its batch before it, then
-- refuses it alone (OB004) at little cost, and outbox_skip() passes it
-- with a record.
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

-- The whole error: SQLSTATE, message, detail and hint.
CREATE FUNCTION pg_temp.error(q text, OUT state text, OUT message text, OUT detail text, OUT hint text)
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT, detail = PG_EXCEPTION_DETAIL,
                            hint = PG_EXCEPTION_HINT;
END
$$;

-- The packed batch's positions (pack.c's format, each field with its length).
CREATE FUNCTION pg_temp.packed_positions(b bytea) RETURNS text[] LANGUAGE plpgsql AS $$
DECLARE
    o int := 16;
    out text[] := '{}';
    len bigint;
BEGIN
    FOR i IN 1 .. get_byte(b, 7) LOOP
        FOR j IN 1 .. 7 LOOP
            len := (get_byte(b, o)::bigint << 24) | (get_byte(b, o + 1) << 16) | (get_byte(b, o + 2) << 8) | get_byte(b, o + 3);
            IF j = 1 THEN
                out := out || convert_from(substring(b FROM o + 5 FOR len::int), 'UTF8');
            END IF;
            o := o + 4 + CASE WHEN len = 4294967295 THEN 0 ELSE len::int END;
        END LOOP;
    END LOOP;
    RETURN out;
END
$$;

-- Positions relative to the first event: "e<n>" for the n-th event (by
-- key), so that the output does not depend on transaction ids.
CREATE FUNCTION pg_temp.names(positions text[]) RETURNS text LANGUAGE sql AS $$
    SELECT coalesce(string_agg(e.key, ' ' ORDER BY p.n), '')
      FROM unnest(positions) WITH ORDINALITY p(pos, n)
      JOIN outbox.event e ON p.pos = (e.txid::text::numeric + coalesce((SELECT max(epoch) FROM outbox.groups WHERE name = 'skip'), 0)) || '-' || e.seq
$$;
CREATE FUNCTION pg_temp.pos_of(k text) RETURNS text LANGUAGE sql AS $$
    SELECT (e.txid::text::numeric + (SELECT epoch FROM outbox.groups WHERE name = 'skip')) || '-' || e.seq
      FROM outbox.event e WHERE e.key = k
$$;

TRUNCATE outbox.event;
SELECT outbox_group_create('skip', start_at => 'beginning', ordering => 'xid8');

-- Events e1, e2, e3, then "big", stored in the table directly as an event
-- of a version that did not check the size of JSON text would be: 2,100
-- numbers of 131,072 digits, some kilobytes stored and 275 MB as text,
-- more than any event may print as. Then e5 and e6.
BEGIN;
SELECT count(outbox_emit('t', 'e' || i, jsonb_build_object('i', i))) AS emitted FROM generate_series(1, 3) i;
INSERT INTO outbox.event (txid, seq, event_id, topic, key, payload, headers, created_at)
SELECT pg_current_xact_id(), 4, gen_random_uuid(), 't', 'big', jsonb_agg('1e131071'::jsonb), NULL, now()
  FROM generate_series(1, 2100);
COMMIT;
SELECT count(outbox_emit('t', 'e' || i, jsonb_build_object('i', i))) AS emitted FROM generate_series(5, 6) i;
SELECT pg_column_size(payload) < 65536 AS small_stored, outbox.json_text_size(payload) AS text_size
  FROM outbox.event WHERE key = 'big';

-- The batch stops before it, in both forms: the events before it are
-- published.
SELECT pg_temp.names(pg_temp.packed_positions(outbox_fetch_packed('skip'))) AS packed_batch;
SELECT pg_temp.names(array_agg(pos ORDER BY n)) AS rows_batch FROM outbox_fetch('skip') WITH ORDINALITY f(pos, txid, seq, event_id, topic, key, payload, headers, created_at, n);
SELECT pg_temp.names(pg_temp.packed_positions(outbox_fetch_packed('skip', 100, pg_temp.pos_of('e1')))) AS after_e1;
SELECT outbox_advance('skip', pg_temp.pos_of('e3'));

-- Alone first in its batch, it is refused, naming the group, the
-- position, the size and the way out; every time, in both forms.
SELECT state, message = format('event at position %s of group "skip" is too large to publish', pg_temp.pos_of('big')) AS message_names_it,
       detail, hint = format('Pass it with SELECT outbox_skip(''skip'', ''%s'', ''<reason>''): the group goes on after it, and outbox.skipped_events records it.', pg_temp.pos_of('big')) AS hint_says_how
  FROM pg_temp.error($$SELECT outbox_fetch_packed('skip')$$);
SELECT state FROM pg_temp.error($$SELECT outbox_fetch_packed('skip')$$);
SELECT state FROM pg_temp.error($$SELECT * FROM outbox_fetch('skip')$$);
-- The same with "after", as the relay reads ahead.
SELECT state FROM pg_temp.error(format($$SELECT outbox_fetch_packed('skip', 100, %L)$$, pg_temp.pos_of('e2')));

-- outbox_skip(): its hostile arguments, refused without a change.
SELECT pg_temp.try($$SELECT outbox_skip('skip', NULL, 'r')$$) AS null_position;
SELECT pg_temp.try(format($$SELECT outbox_skip('skip', %L, NULL)$$, pg_temp.pos_of('big'))) AS null_reason;
SELECT pg_temp.try(format($$SELECT outbox_skip('skip', %L, '  ')$$, pg_temp.pos_of('big'))) AS blank_reason;
SELECT pg_temp.try($$SELECT outbox_skip(NULL, '1-1', 'r')$$) AS null_group;
SELECT pg_temp.try($$SELECT outbox_skip('no such group', '1-1', 'r')$$) AS unknown_group;
SELECT pg_temp.try($$SELECT outbox_skip('skip', 'not a position', 'r')$$) AS bad_position;
SELECT pg_temp.try($$SELECT outbox_skip('skip', '-1-1', 'r')$$) AS negative_position;
-- Only the group's next event: not one behind it, nor one after it, nor
-- a position where no event is.
SELECT state, message = format('position %s is not the next event of group "skip"', pg_temp.pos_of('e3')) AS message_ok,
       detail = format('The group''s next event is at %s (its cursor is at %s).', pg_temp.pos_of('big'), pg_temp.pos_of('e3')) AS detail_ok
  FROM pg_temp.error(format($$SELECT outbox_skip('skip', %L, 'r')$$, pg_temp.pos_of('e3')));
SELECT state FROM pg_temp.error(format($$SELECT outbox_skip('skip', %L, 'r')$$, pg_temp.pos_of('e5')));
SELECT state FROM pg_temp.error(format($$SELECT outbox_skip('skip', %L, 'r')$$, pg_temp.pos_of('e3') || '0'));
SELECT cursor_position = pg_temp.pos_of('e3') AS cursor_unmoved, generation FROM outbox_groups('skip');
SELECT count(*) AS records FROM outbox.skipped_events;

-- The skip: the cursor passes that event alone, the generation is bumped
-- as by a rewind, and the record keeps a copy of the event.
SELECT outbox_skip('skip', pg_temp.pos_of('big'), 'a payload of 2,100 numbers of 131,072 digits') = pg_temp.pos_of('big') AS new_cursor;
SELECT cursor_position = pg_temp.pos_of('big') AS cursor_past_it, generation FROM outbox_groups('skip');
SELECT s.group_name, s.shard, s.pos = pg_temp.pos_of('big') AS pos, s.seq, s.topic, s.key,
       (s.event_id, s.payload, s.txid) = (e.event_id, e.payload, e.txid) AS copied, s.headers, s.text_size, s.reason,
       s.skipped_by = session_user AS by_me, s.skipped_at BETWEEN now() - interval '1 minute' AND now() AS just_now
  FROM outbox.skipped_events s JOIN outbox.event e ON e.key = 'big';
SELECT pg_temp.names(pg_temp.packed_positions(outbox_fetch_packed('skip'))) AS then_published;
-- Skipped once: the same position again is no longer the next event.
SELECT state FROM pg_temp.error(format($$SELECT outbox_skip('skip', %L, 'again')$$, pg_temp.pos_of('big')));
SELECT outbox_advance('skip', pg_temp.pos_of('e6'));
-- Nothing waits: nothing to skip.
SELECT state, detail = format('The group has no event waiting after its cursor, %s.', pg_temp.pos_of('e6')) AS detail_ok
  FROM pg_temp.error(format($$SELECT outbox_skip('skip', %L, 'r')$$, pg_temp.pos_of('e6')));

-- A re-anchored group: positions carry the epoch, and so do the error and
-- the skip.
SELECT outbox_reanchor('skip') IS NOT NULL AS reanchored;
UPDATE outbox.groups SET epoch = epoch + 1000 WHERE name = 'skip';
BEGIN;
INSERT INTO outbox.event (txid, seq, event_id, topic, key, payload, headers, created_at)
SELECT pg_current_xact_id(), 1, gen_random_uuid(), 't', 'big2', '{}', jsonb_build_object('h', jsonb_agg('-1e-16383'::jsonb)), now()
  FROM generate_series(1, 20000);
COMMIT;
SELECT outbox.json_text_size(headers) AS headers_text_size FROM outbox.event WHERE key = 'big2';
SELECT state, message = format('event at position %s of group "skip" is too large to publish', pg_temp.pos_of('big2')) AS shifted
  FROM pg_temp.error($$SELECT outbox_fetch_packed('skip')$$);
SELECT outbox_skip('skip', pg_temp.pos_of('big2'), 'headers of 20,000 tiny numbers') = pg_temp.pos_of('big2') AS skipped;
SELECT count(*) AS records, sum(text_size) FILTER (WHERE key = 'big2') AS big2_text_size FROM outbox.skipped_events;

-- Only admins skip, and read the record.
SELECT r AS role, has_function_privilege(r, 'outbox_skip(text, text, text)', 'EXECUTE') AS skip,
       has_table_privilege(r, 'outbox.skipped_events', 'SELECT') AS read_record,
       has_table_privilege(r, 'outbox.skipped_events', 'INSERT') AS write_record,
       has_function_privilege(r, 'outbox.json_text_size(jsonb)', 'EXECUTE') AS text_size
  FROM unnest(ARRAY['outbox_admin', 'outbox_relay', 'outbox_writer', 'outbox_consumer', 'public']) r;

SELECT outbox_group_drop('skip');
TRUNCATE outbox.event, outbox.skipped_events;
