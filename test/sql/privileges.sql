-- Roles: writers emit, relays read the feed and move cursors, admins manage
-- groups; PUBLIC gets nothing.
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
GRANT EXECUTE ON FUNCTION pg_temp.try(text) TO PUBLIC;

CREATE ROLE regress_outbox_app IN ROLE outbox_writer;
CREATE ROLE regress_outbox_relay IN ROLE outbox_relay;
CREATE ROLE regress_outbox_admin IN ROLE outbox_admin;
CREATE ROLE regress_outbox_nobody;

TRUNCATE outbox.event;
SELECT outbox_group_create('priv', ordering => 'xid8');
-- A consumer of the admins' (the parked keys' calls name it).
SELECT inbox_consumer_create('priv_ledger', 'outbox_admin');

-- The calls each role might make.
CREATE TEMP TABLE calls (n int, q text);
GRANT SELECT ON calls TO PUBLIC;
INSERT INTO calls VALUES
    (1, $$SELECT outbox_emit('t', 'k', '{}')$$),
    (2, $$SELECT outbox_emit_many('t', NULL, ARRAY['{}']::jsonb[])$$),
    (3, $$SELECT * FROM outbox_fetch('priv')$$),
    (4, $$SELECT outbox_advance('priv', (SELECT cursor_position FROM outbox_groups('priv')))$$),
    (5, $$SELECT outbox_rewind('priv', 'now')$$),
    (6, $$SELECT * FROM outbox_group_stats()$$),
    (7, $$SELECT * FROM outbox.group_stats$$),
    (8, $$SELECT * FROM outbox.horizon_holders$$),
    (9, $$SELECT outbox_group_create('priv2')$$),
    (10, $$SELECT outbox_group_drop('priv2')$$),
    (11, $$SELECT count(*) FROM outbox.event$$),
    (12, $$SELECT count(*) FROM outbox.feed$$),
    (13, $$INSERT INTO outbox.event VALUES ('1', 1, gen_random_uuid(), 't', NULL, '{}', NULL, now())$$),
    (14, $$UPDATE outbox.groups SET cursor_seq = 0$$),
    (15, $$SELECT outbox.lead(1)$$),
    (16, $$SELECT outbox_lead('priv')$$),
    (17, $$SELECT outbox_resign('priv')$$),
    (18, $$SELECT outbox_reanchor('priv') IS NOT NULL$$),
    (19, $$SELECT count(*) >= 0 FROM outbox.horizon_holders_all()$$),
    (20, $$SELECT outbox.note_generation(1, 1)$$),
    (21, $$SELECT outbox.set_member('outbox.event'::regclass, false)$$),
    (22, $$SELECT count(*) FROM outbox_groups()$$),
    (23, $$SELECT count(*) FROM outbox_maintenance_status()$$),
    (24, $$SELECT count(*) FROM outbox.groups$$),
    (25, $$SELECT count(*) FROM outbox.maintenance$$),
    (26, $$SELECT count(*) FROM inbox_parked_keys('priv_ledger')$$),
    (27, $$SELECT count(*) FROM inbox_redrive('priv_ledger', 'k')$$),
    (28, $$SELECT count(*) FROM inbox_skip('priv_ledger', 'k')$$),
    (29, $$SELECT count(*) FROM inbox_redrive_step('priv_ledger', 'SELECT 1', 's', '\x6b')$$),
    (30, $$SELECT count(*) FROM outbox.parked_take('priv_ledger', 's', '\x6b', 1)$$),
    (31, $$SELECT count(*) FROM outbox.parked_keys$$),
    (32, $$SELECT count(*) FROM outbox.parked_entries$$);

SET ROLE regress_outbox_nobody;
SELECT n, pg_temp.try(q) FROM calls ORDER BY n;
RESET ROLE;

SET ROLE regress_outbox_app;
SELECT n, pg_temp.try(q) FROM calls ORDER BY n;
RESET ROLE;

SET ROLE regress_outbox_relay;
SELECT n, pg_temp.try(q) FROM calls ORDER BY n;
RESET ROLE;
SELECT outbox.resign(id) FROM outbox.groups WHERE name = 'priv';

SET ROLE regress_outbox_admin;
SELECT n, pg_temp.try(q) FROM calls ORDER BY n;
RESET ROLE;

-- What writers emitted is in the table, written as the table's owner.
SELECT count(*) AS emitted FROM outbox.event;

SELECT inbox_consumer_drop('priv_ledger');
SELECT outbox_group_drop('priv');
SELECT outbox_group_drop('priv2', true);
TRUNCATE outbox.event;
DROP ROLE regress_outbox_app, regress_outbox_relay, regress_outbox_admin, regress_outbox_nobody;
