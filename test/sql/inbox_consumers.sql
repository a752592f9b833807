-- Consumers are bound to roles: outbox_admin registers each consumer with
-- the role whose members may act for it; every inbox function checks the
-- consumer it names (or the consumer of the dead letter it names).
TRUNCATE outbox.inbox, outbox.dead_letters RESTART IDENTITY;
DELETE FROM outbox.consumers;
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
-- The message, detail and hint of an error.
CREATE FUNCTION pg_temp.why(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    m text;
    d text;
    h text;
BEGIN
    EXECUTE q;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS m = MESSAGE_TEXT, d = PG_EXCEPTION_DETAIL, h = PG_EXCEPTION_HINT;
    RETURN sqlstate || ': ' || m || ' | ' || coalesce(d, '') || ' | ' || coalesce(h, '');
END
$$;
CREATE FUNCTION pg_temp.u(t text) RETURNS bytea LANGUAGE sql AS $$ SELECT convert_to(t, 'UTF8') $$;
GRANT EXECUTE ON FUNCTION pg_temp.try(text), pg_temp.why(text), pg_temp.u(text) TO PUBLIC;

CREATE ROLE regress_billing IN ROLE outbox_consumer;
CREATE ROLE regress_billing_worker IN ROLE regress_billing;
CREATE ROLE regress_shipping IN ROLE outbox_consumer;
CREATE ROLE regress_inbox_admin IN ROLE outbox_admin;
CREATE TABLE effects (consumer text, event_id uuid, payload jsonb);
GRANT ALL ON effects TO PUBLIC;
CREATE FUNCTION effect(consumer text, payload jsonb, event_id uuid) RETURNS void LANGUAGE sql AS
    $$ INSERT INTO effects VALUES (consumer, event_id, payload) $$;

-- The registry belongs to outbox_admin.
SET ROLE regress_inbox_admin;
SELECT inbox_consumer_create('billing', 'regress_billing');
SELECT inbox_consumer_create('shipping', 'regress_shipping');
SELECT consumer, owner, owner_exists FROM inbox_consumers();
RESET ROLE;
SET ROLE regress_billing;
SELECT pg_temp.try($$SELECT inbox_consumer_create('mine', 'regress_billing')$$);
SELECT pg_temp.try($$SELECT inbox_consumer_set_owner('shipping', 'regress_billing')$$);
SELECT pg_temp.try($$SELECT inbox_consumer_drop('shipping')$$);
SELECT pg_temp.try($$SELECT * FROM inbox_consumers()$$);
SELECT pg_temp.try($$SELECT count(*) FROM outbox.consumers$$);
SELECT pg_temp.try($$INSERT INTO outbox.consumers VALUES ('mine', 'regress_billing')$$);
RESET ROLE;

-- Hostile names and owners.
SET ROLE regress_inbox_admin;
SELECT pg_temp.try($$SELECT inbox_consumer_create('it''s "quoted"; DROP TABLE effects; --', 'regress_billing')$$);
SELECT pg_temp.try($$SELECT inbox_consumer_create(E'new\nline', 'regress_billing')$$);
SELECT pg_temp.try($$SELECT inbox_consumer_create(E'tab\there', 'regress_billing')$$);
SELECT pg_temp.try($$SELECT inbox_consumer_create(repeat('é', 127) || 'x', 'regress_billing')$$);
SELECT pg_temp.try($$SELECT inbox_consumer_create(repeat('é', 128), 'regress_billing')$$);
SELECT pg_temp.try($$SELECT inbox_consumer_create(repeat('x', 256), 'regress_billing')$$);
SELECT pg_temp.try($$SELECT inbox_consumer_create('', 'regress_billing')$$);
SELECT pg_temp.try($$SELECT inbox_consumer_create(NULL, 'regress_billing')$$);
SELECT pg_temp.try($$SELECT inbox_consumer_create('nobody', NULL)$$);
SELECT pg_temp.try($$SELECT inbox_consumer_create('nobody', '4000000000'::oid::regrole)$$);
SELECT pg_temp.try($$SELECT inbox_consumer_create('nobody', 'regress_no_such_role')$$);
SELECT pg_temp.try($$SELECT inbox_consumer_create('billing', 'regress_shipping')$$);
SELECT pg_temp.try($$SELECT inbox_consumer_set_owner('nobody', 'regress_billing')$$);
SELECT pg_temp.try($$SELECT inbox_consumer_drop('nobody')$$);
SELECT pg_temp.try($$SELECT inbox_consumer_drop('billing', NULL)$$);
SELECT consumer, octet_length(consumer) AS bytes, owner FROM inbox_consumers();
RESET ROLE;

-- A member of the owner acts for its consumer; nobody else does.
SET ROLE regress_billing_worker;
SELECT inbox_apply('billing', '00000000-0000-4000-8000-000000000001', '{"secret": "billing-1"}');
SELECT inbox_apply('it''s "quoted"; DROP TABLE effects; --', '00000000-0000-4000-8000-000000000001', '{}');
RESET ROLE;
SET ROLE regress_shipping;
-- Another role's consumer: refused before anything is read or written, by
-- every function that names a consumer or a dead letter.
SELECT pg_temp.try($$SELECT inbox_apply('billing', '00000000-0000-4000-8000-000000000001', '{"secret": "guess"}')$$);
SELECT pg_temp.try($$SELECT inbox_apply('billing', '00000000-0000-4000-8000-000000000002', '{"forged": true}')$$);
SELECT pg_temp.try($$SELECT * FROM inbox_consume('billing', 'SELECT 1', ARRAY[pg_temp.u('00000000-0000-4000-8000-000000000003')], ARRAY[pg_temp.u('t')], NULL, ARRAY[pg_temp.u('{}')], NULL)$$);
SELECT pg_temp.try($$SELECT inbox_dead_letter('billing', 's', '1-1', '00000000-0000-4000-8000-000000000001', NULL, NULL, '{}', NULL, 'forged')$$);
SELECT pg_temp.try($$SELECT inbox_dead_letter('billing', 's', '1-1', ARRAY[]::bytea[], 'forged')$$);
SELECT pg_temp.try($$SELECT inbox_consumer_check('billing')$$);
SELECT pg_temp.why($$SELECT inbox_apply('billing', '00000000-0000-4000-8000-000000000001', '{}')$$);
-- Unregistered names, NULL, empty and too long ones.
SELECT pg_temp.why($$SELECT inbox_apply('unregistered', '00000000-0000-4000-8000-000000000001', '{}')$$);
SELECT pg_temp.try($$SELECT inbox_apply(NULL, '00000000-0000-4000-8000-000000000001', '{}')$$);
SELECT pg_temp.try($$SELECT inbox_apply('', '00000000-0000-4000-8000-000000000001', '{}')$$);
SELECT pg_temp.try($$SELECT inbox_apply(repeat('x', 256), '00000000-0000-4000-8000-000000000001', '{}')$$);
SELECT pg_temp.try($$SELECT inbox_apply(E'new\nline', '00000000-0000-4000-8000-000000000001', '{}')$$);
SELECT pg_temp.try($$SELECT inbox_consumer_check(NULL)$$);
-- The bodies behind the checks are granted to nobody.
SELECT pg_temp.try($$SELECT outbox.inbox_apply_unchecked('billing', '00000000-0000-4000-8000-000000000002', '{}')$$);
SELECT pg_temp.try($$SELECT outbox.inbox_record('billing', ARRAY['00000000-0000-4000-8000-000000000001'::uuid], ARRAY['{}'::jsonb])$$);
SELECT pg_temp.try($$SELECT outbox.inbox_dead_letter_unchecked('billing', 's', '1-1', ARRAY[]::bytea[], 'r')$$);
SELECT pg_temp.try($$SELECT outbox.dead_letter_record('billing', 's', '1-1', NULL, NULL, NULL, NULL, NULL, NULL, 'r', NULL, 1)$$);
SELECT pg_temp.try($$SELECT outbox.dead_letter_take_unchecked(1)$$);
-- Its own consumer works, and an identity conflict shows only its own
-- payloads.
SELECT inbox_apply('shipping', '00000000-0000-4000-8000-000000000001', '{"secret": "shipping-1"}');
SELECT pg_temp.why($$SELECT inbox_apply('shipping', '00000000-0000-4000-8000-000000000001', '{"secret": "other"}')$$);
SELECT inbox_dead_letter('shipping', 's', '9-1', ARRAY[pg_temp.u('event_id'), pg_temp.u('00000000-0000-4000-8000-000000000009')], 'r') AS shipping_dl \gset
RESET ROLE;

-- billing's next event was not pre-marked by shipping: it applies.
SET ROLE regress_billing;
SELECT inbox_apply('billing', '00000000-0000-4000-8000-000000000002', '{"n": 2}');
SELECT * FROM inbox_consume('billing', 'SELECT effect(''billing'', $3, $5)',
    ARRAY[pg_temp.u('00000000-0000-4000-8000-000000000003')], ARRAY[pg_temp.u('t')], NULL, ARRAY[pg_temp.u('{"n": 3}')], NULL);
SELECT inbox_dead_letter('billing', 's', '5-1', '00000000-0000-4000-8000-000000000005', 't', NULL, '{"n": 5}', NULL, 'handler failed') AS billing_dl \gset
-- shipping's dead letter cannot be replayed or rewritten by billing; its
-- own can.
SELECT pg_temp.try(format('SELECT inbox_replay(%s, %L)', :shipping_dl, 'SELECT 1'));
SELECT pg_temp.try($$SELECT inbox_dead_letter('shipping', 's', '9-1', ARRAY[]::bytea[], 'rewritten')$$);
SELECT pg_temp.try($$SELECT inbox_replay(424242, 'SELECT 1')$$);
SELECT inbox_replay(:billing_dl, 'SELECT effect(''billing'', $3, $5)');
RESET ROLE;
SELECT consumer, event_id, payload FROM outbox.inbox ORDER BY consumer, event_id;
SELECT consumer, entry_id, reason, replayed_at IS NOT NULL AS replayed FROM outbox.dead_letters ORDER BY id;
SELECT consumer, event_id FROM effects ORDER BY consumer, event_id;

-- outbox_admin may act for every consumer.
SET ROLE regress_inbox_admin;
SELECT inbox_apply('shipping', '00000000-0000-4000-8000-000000000010', '{}');
RESET ROLE;

-- A consumer whose owner role was dropped: nobody but an admin acts for
-- it until an admin gives it an owner.
CREATE ROLE regress_gone IN ROLE outbox_consumer;
GRANT regress_gone TO regress_billing;
SELECT inbox_consumer_create('orphan', 'regress_gone');
SET ROLE regress_billing;
SELECT inbox_apply('orphan', '00000000-0000-4000-8000-000000000011', '{}');
RESET ROLE;
DROP ROLE regress_gone;
SELECT consumer, owner_exists FROM inbox_consumers() WHERE consumer = 'orphan';
SET ROLE regress_billing;
SELECT regexp_replace(pg_temp.why($$SELECT inbox_apply('orphan', '00000000-0000-4000-8000-000000000012', '{}')$$),
                      'OID \d+', 'OID n') AS why;
RESET ROLE;
SELECT inbox_consumer_set_owner('orphan', 'regress_billing');
SET ROLE regress_billing;
SELECT inbox_apply('orphan', '00000000-0000-4000-8000-000000000011', '{}');
RESET ROLE;

-- Dropping a consumer that still has inbox rows or dead letters is
-- refused, unless forget => true deletes them with it.
SELECT pg_temp.why($$SELECT inbox_consumer_drop('shipping')$$);
SELECT inbox_consumer_drop('shipping', forget => true);
SELECT count(*) AS shipping_rows FROM outbox.inbox WHERE consumer = 'shipping';
SELECT count(*) AS shipping_dead_letters FROM outbox.dead_letters WHERE consumer = 'shipping';
SELECT inbox_consumer_drop(repeat('é', 127) || 'x');
SET ROLE regress_shipping;
SELECT pg_temp.try($$SELECT inbox_apply('shipping', '00000000-0000-4000-8000-000000000001', '{}')$$);
RESET ROLE;
SELECT consumer, owner FROM inbox_consumers();

DROP TABLE effects;
DROP FUNCTION effect(text, jsonb, uuid);
TRUNCATE outbox.inbox, outbox.dead_letters;
DELETE FROM outbox.consumers;
DROP ROLE regress_billing_worker, regress_billing, regress_shipping, regress_inbox_admin;
