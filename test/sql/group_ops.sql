-- Groups in operation: the stream template their relays publish with, the
-- bound of their last positions per stream, and the events an open
-- transaction holds back from them.
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

--
-- Stream templates: the first leader records its template for the whole
-- group; the template returned is the group's, which a relay compares with
-- its own.
--
SELECT outbox_group_create('tpl', ordering => 'xid8');
SELECT outbox_group_create('tpl3', ordering => 'xid8', shards => 3);
SELECT group_name, shard, stream_template FROM outbox_groups('tpl');
-- Only the leader records.
SELECT pg_temp.try($$SELECT outbox_stream_template('tpl', 'outbox:{topic}')$$);
SELECT outbox_lead('tpl');
SELECT outbox_stream_template('tpl', 'outbox:{topic}') AS recorded;
SELECT outbox_stream_template('tpl', 'other:{topic}') AS group_template;
SELECT stream_template FROM outbox_groups('tpl');
-- What no group may record.
SELECT pg_temp.try($$SELECT outbox_stream_template('tpl', NULL)$$);
SELECT pg_temp.try($$SELECT outbox_stream_template('tpl', '')$$);
SELECT pg_temp.try($$SELECT outbox_stream_template('tpl', repeat('x', 1025))$$);
SELECT pg_temp.try($$SELECT outbox_stream_template(NULL, 'x')$$);
SELECT pg_temp.try($$SELECT outbox_stream_template('nope', 'x')$$);
SELECT pg_temp.try($$SELECT outbox_stream_template('tpl3', 'x:{shard}')$$);
SELECT pg_temp.try($$UPDATE outbox.groups SET stream_template = '' WHERE name = 'tpl'$$);
-- A sharded group: the first shard's leader records the template of every
-- shard; another shard's leader finds it.
SELECT outbox_lead('tpl3/1') AS leads, outbox_stream_template('tpl3/1', 'outbox:{topic}:{shard}') AS recorded;
SELECT outbox_lead('tpl3/2') AS leads, outbox_stream_template('tpl3/2', 'x:{topic}:{shard}') AS group_template;
SELECT shard, stream_template FROM outbox_groups('tpl3');

-- Changing it: refused while a relay leads the group (this session here).
SELECT outbox_advance('tpl', (SELECT cursor_position FROM outbox_groups('tpl')), '{"outbox:a": "1-1"}');
SELECT pg_temp.try($$SELECT outbox_group_set_stream_template('tpl', 'v2:{topic}')$$);
DO $$
DECLARE
    detail text;
    hint text;
BEGIN
    PERFORM outbox_group_set_stream_template('tpl3', 'y:{topic}:{shard}');
EXCEPTION WHEN object_in_use THEN
    GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
    RAISE WARNING 'detail: %; hint: %', replace(detail, pg_backend_pid()::text, '<pid>'), hint;
END
$$;
SELECT outbox_resign('tpl'), outbox_resign('tpl3/1'), outbox_resign('tpl3/2');
-- With no leader: the new template, and the old streams' positions gone.
SELECT outbox_group_set_stream_template('tpl', 'v2:{topic}') AS previous;
SELECT stream_template, streams FROM outbox_groups('tpl');
SELECT outbox_lead('tpl') AS leads, outbox_stream_template('tpl', 'outbox:{topic}') AS group_template;
SELECT outbox_resign('tpl');
-- NULL forgets it: the next leader records its own.
SELECT outbox_group_set_stream_template('tpl', NULL) AS previous;
SELECT outbox_lead('tpl') AS leads, outbox_stream_template('tpl', 'v3:{topic}') AS recorded;
SELECT outbox_resign('tpl');
SELECT outbox_group_set_stream_template('tpl3', 'y:{topic}:{shard}') AS previous;
SELECT shard, stream_template FROM outbox_groups('tpl3');
SELECT pg_temp.try($$SELECT outbox_group_set_stream_template('tpl3/1', 'x')$$);
SELECT pg_temp.try($$SELECT outbox_group_set_stream_template('nope', 'x')$$);
SELECT pg_temp.try($$SELECT outbox_group_set_stream_template(NULL, 'x')$$);
SELECT pg_temp.try($$SELECT outbox_group_set_stream_template('tpl', '')$$);
SELECT pg_temp.try($$SELECT outbox_group_set_stream_template('tpl', repeat('x', 1025))$$);
-- Relays record; only admins change.
SET ROLE outbox_relay;
SELECT pg_temp.try($$SELECT outbox_group_set_stream_template('tpl', 'r:{topic}')$$);
SELECT pg_temp.try($$SELECT outbox_stream_template('tpl', 'r:{topic}')$$);
RESET ROLE;
SET ROLE outbox_writer;
SELECT pg_temp.try($$SELECT outbox_stream_template('tpl', 'w:{topic}')$$);
RESET ROLE;
SET ROLE outbox_admin;
SELECT outbox_group_set_stream_template('tpl', 'a:{topic}') AS previous;
RESET ROLE;

--
-- The last positions per stream: when a stream not recorded before comes,
-- the record keeps every position above the cursor and the most recently
-- written others up to pg_outbox.max_group_streams, and forgets positions
-- whose events retention removed.
--
SELECT outbox.pruned_streams('{"a": "5-1", "b": "3-0", "c": "9-9", "d": "x", "e": "2-0"}', 2, '4-0', '2-0');
SELECT outbox.pruned_streams('{"a": "5-1", "b": "3-0"}', 1, '9-0', '0-0');
SELECT outbox.pruned_streams('{}', 1, '9-0', '0-0');
SET pg_outbox.max_group_streams = 3;
SELECT outbox_group_create('many', ordering => 'xid8');
SELECT outbox_lead('many');
CREATE FUNCTION pg_temp.advance(streams jsonb) RETURNS jsonb LANGUAGE sql AS $$
    SELECT outbox_advance('many', (SELECT cursor_position FROM outbox_groups('many')), streams);
    SELECT streams FROM outbox_groups('many');
$$;
SELECT pg_temp.advance('{"s1": "1-1", "s2": "1-2"}');
SELECT pg_temp.advance('{"s3": "1-3"}');
-- A fourth stream: the least recently written one goes.
SELECT pg_temp.advance('{"s4": "1-4"}');
-- A stream written again is no new stream: nothing goes.
SELECT pg_temp.advance('{"s2": "1-5"}');
SELECT pg_temp.advance('{"s5": "1-6"}');
-- Positions above the cursor (left by a rewind) stay, whatever the bound.
UPDATE outbox.groups SET streams = streams || jsonb_build_object('ahead', (cursor_txid::text::numeric + 5) || '-0')
 WHERE name = 'many';
SELECT array_agg(k ORDER BY k) AS streams FROM jsonb_object_keys(pg_temp.advance('{"s6": "1-7"}')) k;
SELECT outbox_rewind('many', 'now') IS NOT NULL AS rewound;
UPDATE outbox.groups SET streams = '{"s1": "1-1", "s2": "1-2", "bad": "x"}' WHERE name = 'many';
-- Positions whose events retention removed go, and what is no position.
CREATE TEMP TABLE retired AS SELECT retired_txid, retired_seq FROM outbox.maintenance;
UPDATE outbox.maintenance SET retired_txid = '1', retired_seq = 1;
SELECT pg_temp.advance('{"s3": "1-3"}');
UPDATE outbox.maintenance m SET retired_txid = r.retired_txid, retired_seq = r.retired_seq FROM retired r;
-- (Only a superuser sets the bound, 1 or more, on the C engine:
-- test/sql/engine_c.sql.)
RESET pg_outbox.max_group_streams;
SELECT outbox_resign('many');

--
-- What an open transaction holds back: events of committed transactions
-- above the horizon are not "waiting" (no relay may publish them yet) but
-- "held_back", with the age of the oldest.
--
SELECT outbox_group_create('held', ARRAY['held'], ordering => 'xid8');
SELECT outbox_group_create('heldsh', ARRAY['held'], ordering => 'xid8', shards => 2);
SELECT waiting, held_back, oldest_held_back_age FROM outbox_group_stats('held');
BEGIN;
SELECT pg_current_xact_id() IS NOT NULL AS has_xid;
PREPARE TRANSACTION 'pg_outbox_held_back';
SELECT outbox_emit('held', 'k1', '{}') IS NOT NULL AS emitted;
SELECT outbox_emit('held', 'k2', '{}') IS NOT NULL AS emitted;
SELECT outbox_emit('other', 'k3', '{}') IS NOT NULL AS emitted;
SELECT group_name, waiting, oldest_waiting_age, held_back, oldest_held_back_age IS NOT NULL AS has_age,
       held_by_gid
  FROM outbox_group_stats('held');
SELECT sum(held_back) AS held_back_in_shards, sum(waiting) AS waiting_in_shards FROM outbox_group_stats('heldsh');
SELECT count(*) AS fetched FROM outbox_fetch('held');
COMMIT PREPARED 'pg_outbox_held_back';
SELECT group_name, waiting, held_back, oldest_held_back_age, held_by_gid FROM outbox_group_stats('held');
SELECT sum(held_back) AS held_back_in_shards, sum(waiting) AS waiting_in_shards FROM outbox_group_stats('heldsh');
SELECT count(*) AS fetched FROM outbox_fetch('held');

SELECT outbox_group_drop(g) FROM unnest(ARRAY['tpl', 'tpl3', 'many', 'held', 'heldsh']) g;
