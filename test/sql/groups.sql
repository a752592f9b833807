-- Groups: create, list, drop, and their errors.
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

SELECT outbox_group_create('billing-relay', ordering => 'xid8');
SELECT outbox_group_create('audit', ARRAY['orders', 'payments'], 'beginning', 'xid8');
SELECT outbox_group_create('shard.0:a_b', ordering => 'xid8');

-- 'now' starts at the horizon, 'beginning' at zero; no group is led yet.
SELECT name, topics, cursor_txid > '0' AND cursor_txid <= outbox.horizon() AS from_now, cursor_seq,
       cursor_txid = '0' AS at_beginning, advanced_at
  FROM outbox.groups ORDER BY name;
SELECT group_name, topics, leader_pid, waiting FROM outbox_group_stats();
-- One group's statistics (counting only its backlog); none for a name
-- that is no group.
SELECT group_name, waiting FROM outbox_group_stats('audit');
SELECT count(*) FROM outbox_group_stats('no-such-group');

SELECT pg_temp.try($$SELECT outbox_group_create('billing-relay')$$);
SELECT pg_temp.try($$SELECT outbox_group_create(NULL)$$);
SELECT pg_temp.try($$SELECT outbox_group_create('')$$);
SELECT pg_temp.try($$SELECT outbox_group_create('-x')$$);
SELECT pg_temp.try($$SELECT outbox_group_create('has space')$$);
SELECT pg_temp.try($$SELECT outbox_group_create(repeat('g', 64))$$);
SELECT pg_temp.try($$SELECT outbox_group_create(repeat('g', 63))$$);
SELECT pg_temp.try($$SELECT outbox_group_create('t1', ARRAY[]::text[])$$);
SELECT pg_temp.try($$SELECT outbox_group_create('t2', ARRAY['a', NULL])$$);
SELECT pg_temp.try($$SELECT outbox_group_create('t3', ARRAY['a', ''])$$);
SELECT pg_temp.try($$SELECT outbox_group_create('t4', NULL, 'yesterday')$$);
SELECT pg_temp.try($$SELECT outbox_group_create('t5', NULL, NULL)$$);

SELECT outbox_group_drop('shard.0:a_b');
SELECT outbox_group_drop(repeat('g', 63));
SELECT pg_temp.try($$SELECT outbox_group_drop('shard.0:a_b')$$);
SELECT outbox_group_drop('shard.0:a_b', if_exists => true);
SELECT pg_temp.try($$SELECT outbox_group_drop(NULL)$$);

-- The relay calls name unknown groups clearly.
SELECT pg_temp.try($$SELECT * FROM outbox_fetch('nope')$$);
SELECT pg_temp.try($$SELECT outbox_advance('nope', '1-1')$$);
SELECT pg_temp.try($$SELECT outbox_rewind('nope', 'now')$$);

SELECT name FROM outbox.groups ORDER BY name;
SELECT outbox_group_drop('billing-relay'), outbox_group_drop('audit');
