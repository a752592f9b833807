#!/usr/bin/env bash
# Moving a database between the engines (scripts/move-engine.sh): from the
# C engine to the SQL engine and back, with live groups (xid8 order, one
# of them for some topics, one sharded), a consumer with inbox rows and
# dead letters. Events are emitted before each move and drained; the move
# keeps the settings, the groups with their cursors, the consumers, the
# inbox and the dead letters; every group publishes every event of its
# topics and shard exactly once, in order, across both moves, at rising
# positions; the inbox still refuses a redelivery (false) and a forged
# event (OB001) after each move; the dead letters are still replayed.
# Parked keys (consume --on-failure park-key) move with their parked
# entries: a dead key, a retrying one and one draining past a skipped dead
# letter survive both moves as they were, and then drain, in order. A copy
# made before keys could park (no parked tables, dead letters without
# skipped_at and skipped_by) is imported too.
# A move that cannot be made (a group with events it has not published, a
# relay leading a group) is refused whole, naming the group.
#
# Runs against the server in PG* (pg_virtualenv, preloaded; both engines'
# extensions installed); prints one "ok" / "not ok" line per check and
# exits non-zero if any failed.
set -uo pipefail

. "$(dirname "$0")/tap.bash"
move="$(cd "$(dirname "$0")/../.." && pwd)/scripts/move-engine.sh"
q() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$@"; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
db=engine_move

dropdb --if-exists "$db" >/dev/null 2>&1
createdb "$db"
q "$db" <<'SQL' >/dev/null
CREATE EXTENSION pg_outbox;
UPDATE outbox.config SET retention = '14 days', inbox_retention = '30 days', premake = 6;
SELECT outbox_group_create('billing', ordering => 'xid8', start_at => 'beginning');
SELECT outbox_group_create('audit', topics => ARRAY['orders'], ordering => 'xid8', start_at => 'beginning');
SELECT outbox_group_create('fanout', ordering => 'xid8', start_at => 'beginning', shards => 2);
SELECT outbox_lead('billing');
SELECT outbox_stream_template('billing', 'outbox:{topic}');
SELECT outbox_resign('billing');
DO $$ BEGIN CREATE ROLE move_ledger; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
SELECT inbox_consumer_create('ledger', 'move_ledger');
SELECT inbox_apply('ledger', ('00000000-0000-4000-8000-00000000000' || i)::uuid, jsonb_build_object('n', i))
  FROM generate_series(1, 9) i;
-- Two dead letters of events never applied: one replayed on each engine.
SELECT inbox_dead_letter('ledger', 'outbox:orders', '1-' || i, ('00000000-0000-4000-8000-0000000000a' || i)::uuid,
						 'orders', 'k' || i, jsonb_build_object('n', 100 + i), NULL, 'handler failed')
  FROM generate_series(1, 2) i;
CREATE TABLE applied (event_id uuid PRIMARY KEY, payload jsonb NOT NULL);
-- Parked keys of stream outbox:accounts: acct-7 dead at its event 5 with
-- 6, 7 and 8 parked; acct-8 retrying its event 10 with 11 parked; acct-9
-- dead at 12 and skipped (draining 13).
CREATE TABLE drained (n bigserial, key text, payload jsonb);
CREATE FUNCTION pg_temp.f(key text, n int) RETURNS bytea[] LANGUAGE sql AS $$
	SELECT ARRAY[convert_to('event_id', 'UTF8'), convert_to(format('00000000-0000-4000-8000-%s', lpad((500 + n)::text, 12, '0')), 'UTF8'),
				 convert_to('topic', 'UTF8'), convert_to('accounts', 'UTF8'), convert_to('key', 'UTF8'), convert_to(key, 'UTF8'),
				 convert_to('payload', 'UTF8'), convert_to(format('{"n": %s}', n), 'UTF8')]
$$;
CREATE FUNCTION pg_temp.park(key text, ns int[]) RETURNS SETOF text LANGUAGE sql AS $$
	SELECT c.status
	  FROM inbox_consume_keyed('ledger', 'INSERT INTO drained (key, payload) VALUES ($2, $3)',
							   array_fill('outbox:accounts'::text, ARRAY[cardinality(ns)]),
							   ARRAY(SELECT n || '-1' FROM unnest(ns) n), ARRAY(SELECT (pg_temp.f(key, n))[2] FROM unnest(ns) n),
							   ARRAY(SELECT (pg_temp.f(key, n))[4] FROM unnest(ns) n), ARRAY(SELECT (pg_temp.f(key, n))[6] FROM unnest(ns) n),
							   ARRAY(SELECT (pg_temp.f(key, n))[8] FROM unnest(ns) n), NULL) c
$$;
SELECT * FROM inbox_park_key('ledger', 'outbox:accounts', '5-1', pg_temp.f('acct-7', 5), 'handler failed', 'P0001', 3, true);
SELECT * FROM inbox_park_key('ledger', 'outbox:accounts', '10-1', pg_temp.f('acct-8', 10), 'handler failed', 'P0001', 1, false);
SELECT * FROM inbox_park_key('ledger', 'outbox:accounts', '12-1', pg_temp.f('acct-9', 12), 'handler failed', 'P0001', 3, true);
SELECT pg_temp.park('acct-7', '{6,7,8}');
SELECT pg_temp.park('acct-8', '{11}');
SELECT pg_temp.park('acct-9', '{13}');
SELECT * FROM inbox_skip('ledger', 'acct-9');
SQL

# Emits events in three transactions (of two topics; one by
# outbox_emit_many()), and notes each one's id, topic and shard (of 2),
# in feed order, in $work/emitted.
batch=0
emit() {
	batch=$((batch + 1))
	q "$db" -F '|' >>"$work/emitted" <<SQL
SELECT id, 'orders', outbox.shard_of('orders', 'o$batch-' || i, 2)
  FROM generate_series(1, 3) i, outbox_emit('orders', 'o$batch-' || i, jsonb_build_object('batch', $batch, 'i', i)) id;
SELECT id, 'payments', outbox.shard_of('payments', 'p$batch', 2)
  FROM outbox_emit('payments', 'p$batch', jsonb_build_object('batch', $batch)) id;
SELECT id, 'payments', outbox.shard_of('payments', 'q$batch-' || o, 2)
  FROM outbox_emit_many('payments', ARRAY['q$batch-1', 'q$batch-2'], ARRAY['{"m": 1}', '{"m": 2}']::jsonb[])
	   WITH ORDINALITY AS e(id, o);
SQL
}

# Publishes what a group (or shard) has, as its relay would: fetches,
# notes "group|position|event id" in $work/published, advances; until
# nothing is left after its cursor (a maintenance run may hold the
# horizon a moment). The session ends: it leads the group no more.
drain() {
	local g
	for g in billing audit fanout/0 fanout/1; do
		q "$db" -F '|' -v g="$g" >>"$work/published" <<'SQL' || return 1
SELECT set_config('move_test.group', :'g', false) \g /dev/null
CREATE TEMP TABLE got (n bigserial, pos text, event_id uuid);
DO $$
DECLARE
	grp text := current_setting('move_test.group');
	g outbox.groups;
	last text;
	idle integer := 0;
BEGIN
	LOOP
		WITH f AS (SELECT * FROM outbox_fetch(grp, 4) WITH ORDINALITY AS f(pos, txid, seq, event_id, topic, key,
																	   payload, headers, created_at, o)),
			 kept AS (INSERT INTO pg_temp.got (pos, event_id) SELECT f.pos, f.event_id FROM f ORDER BY f.o)
		SELECT f.pos INTO last FROM f ORDER BY f.o DESC LIMIT 1;
		IF last IS NOT NULL THEN
			PERFORM outbox_advance(grp, last);
			CONTINUE;
		END IF;
		g := outbox.get_group(grp);
		EXIT WHEN NOT EXISTS (SELECT 1 FROM outbox.backlog(g.cursor_txid, g.cursor_seq, g.topics,
														   '18446744073709551615'::xid8, g.shard, g.shards));
		idle := idle + 1;
		IF idle > 400 THEN
			RAISE EXCEPTION 'group % does not drain', grp;
		END IF;
		PERFORM pg_sleep(0.05);
	END LOOP;
END
$$;
SELECT current_setting('move_test.group'), pos, event_id FROM pg_temp.got ORDER BY n;
SQL
	done
}

# What a move must keep (not the generation, which it bumps).
snapshot() {
	q "$db" <<'SQL'
SELECT 'config', partition_width, premake, retention, inbox_retention, retire_mode, lock_timeout, max_group_lag FROM outbox.config;
SELECT 'group', id, name, shard, shards, topics, ordering, cursor, epoch, stale, streams, stream_template, created_at FROM outbox.groups ORDER BY name, shard;
SELECT 'consumer', consumer, owner, created_at FROM inbox_consumers();
SELECT 'inbox', consumer, event_id, payload, applied_at FROM outbox.inbox ORDER BY consumer, event_id;
SELECT 'dead', id, consumer, event_id, stream, entry_id, topic, key, payload, fields, reason, deliveries, first_failed_at, replayed_at, skipped_at, skipped_by FROM outbox.dead_letters ORDER BY id;
SELECT 'parked key', * FROM outbox.parked_keys ORDER BY consumer, stream, key_hash;
SELECT 'parked entry', * FROM outbox.parked_entries ORDER BY consumer, stream, entry_id;
SELECT 'applied', event_id, payload FROM applied ORDER BY event_id;
SQL
}

engine() { q "$db" -c "SELECT engine FROM outbox.engine()"; }
move_to() { "$move" --to "$1" -d "$db" >"$work/move-$1" 2>&1 || { cat "$work/move-$1" >&2; return 1; }; }

# The inbox after a move: a redelivery is a duplicate, a forged event
# with a known id an identity conflict; a dead letter is replayed once.
inbox_checks() {
	local on=$1 dl=$2
	check "on the $on engine: a redelivered event is still a duplicate" \
		eq "$(q "$db" -c "SELECT inbox_apply('ledger', '00000000-0000-4000-8000-000000000003', '{\"n\": 3}')")" f
	check "on the $on engine: the same id with another payload is still refused (OB001)" \
		bash -c "psql -X -q -At -v VERBOSITY=verbose -d $db -c \"SELECT inbox_apply('ledger', '00000000-0000-4000-8000-000000000003', '{\\\"n\\\": 4}')\" 2>&1 | grep -q '^ERROR:  OB001: event .* was already applied'"
	check "on the $on engine: dead letter $dl is replayed" \
		eq "$(q "$db" -c "SELECT inbox_replay($dl, 'INSERT INTO applied VALUES (\$5, \$3)')")" applied
	check "on the $on engine: the replayed event is then a duplicate" \
		eq "$(q "$db" -c "SELECT inbox_apply('ledger', event_id, payload) FROM outbox.dead_letters WHERE id = $dl")" f
}

emit

# Refused whole while a group has events it has not published.
snapshot >"$work/before"
"$move" --to sql -d "$db" >"$work/out" 2>&1
check "a move with events not published is refused" test $? -ne 0
check "the refusal names the group and says why" \
	grep -q 'ERROR:  group "audit" has events it has not published' "$work/out"
check "after the refusal the database is still on the C engine" eq "$(engine)" c
snapshot >"$work/after"
check "after the refusal the state is unchanged" diff -u "$work/before" "$work/after"

check "the events before the first move are published" drain

# A prepared transaction that emitted would hold the move's locks: refused
# by name; once it is rolled back, nothing of it is left to publish.
q "$db" -c "BEGIN" -c "SELECT outbox_emit('orders', 'prepared', '{}')" -c "PREPARE TRANSACTION 'move_prepared'" >/dev/null
check "the copy is refused while a prepared transaction holds a lock on the state" \
	bash -c "PGOPTIONS='-c lock_timeout=10s' psql -X -q -At -d $db -c \"SELECT * FROM outbox_export_state()\" 2>&1 |
			 grep -q 'prepared transaction \"move_prepared\" holds locks on the tables of pg_outbox'"
q "$db" -c "ROLLBACK PREPARED 'move_prepared'"

check "the copy is refused while a session leads a group" \
	bash -c "psql -X -q -At -d $db -c \"SELECT outbox_lead('fanout/1'); SELECT * FROM outbox_export_state()\" 2>&1 |
			 grep -q 'group \"fanout/1\" is being published'"
check "the copy is refused into a schema that exists" \
	bash -c "psql -X -q -At -d $db -c \"SELECT * FROM outbox_export_state('public')\" 2>&1 | grep -q 'schema \"public\" already exists'"
check "only outbox_admin may copy the state" \
	bash -c "psql -X -q -At -d $db -c \"SET ROLE move_ledger; SELECT * FROM outbox_export_state()\" 2>&1 | grep -q 'permission denied'"
check "the state is imported only from a copy pg_outbox's owner made" \
	bash -c "psql -X -q -At -d $db -c \"BEGIN; CREATE ROLE move_planter; CREATE SCHEMA planted AUTHORIZATION move_planter;
										  SELECT * FROM outbox_import_state('planted')\" 2>&1 |
			 grep -q 'schema \"planted\" is not owned by role'"
check "the state is not imported into a database that has one" \
	bash -c "psql -X -q -At -d $db -c \"BEGIN; SELECT count(*) FROM outbox_export_state('cp'); SELECT * FROM outbox_import_state('cp')\" 2>&1 |
			 grep -q 'has a state of its own already'"

# C -> SQL.
snapshot >"$work/before"
check "the move to the SQL engine exits 0" move_to sql
check "the database is on the SQL engine" eq "$(engine)" sql
snapshot >"$work/after"
check "the move to the SQL engine keeps settings, groups, cursors, consumers, inbox, dead letters and parked keys" \
	diff -u "$work/before" "$work/after"
check "nobody leads a group after the move" \
	eq "$(q "$db" -c "SELECT count(*) FROM outbox.groups WHERE leader_pid IS NOT NULL")" 0
check "the inbox rows are in their day partitions" \
	eq "$(q "$db" -c "SELECT count(*) FROM outbox.inbox_default")" 0
check "the copy is dropped" eq "$(q "$db" -c "SELECT count(*) FROM pg_namespace WHERE nspname = 'outbox_move'")" 0
inbox_checks SQL 1

emit
check "the events emitted on the SQL engine are published" drain

# SQL -> C.
snapshot >"$work/before"
check "the move back to the C engine exits 0" move_to c
check "the database is on the C engine" eq "$(engine)" c
snapshot >"$work/after"
check "the move back keeps settings, groups, cursors, consumers, inbox, dead letters and parked keys" \
	diff -u "$work/before" "$work/after"
inbox_checks C 2

emit
check "the events emitted after the move back are published" drain

# The parked keys, moved twice, drain: acct-7 once redriven (its dead
# letter first, then 6, 7 and 8), acct-9 past its skipped dead letter;
# acct-8 still retries its head.
check "after both moves, acct-8 is still retrying and acct-7 waits for a redrive" \
	eq "$(q "$db" -c "SELECT string_agg(key || ' ' || state || ' ' || parked, ', ' ORDER BY key) FROM inbox_parked_keys('ledger')")" \
	"acct-7 dead 3, acct-8 retrying 1, acct-9 draining 1"
check "acct-7 is redriven" \
	eq "$(q "$db" -c "SELECT result FROM inbox_redrive('ledger', 'acct-7')")" requested
step() {
	q "$db" -c "SELECT applied || ' ' || coalesce(key_state, 'un-parked')
				  FROM inbox_redrive_step('ledger', 'INSERT INTO drained (key, payload) VALUES (\$2, \$3)', 'outbox:accounts',
										  convert_to('$1', 'UTF8'))"
}
check "acct-7's first step applies its dead letter alone" eq "$(step acct-7)" "1 draining"
check "acct-7's next step applies its parked entries and un-parks it" eq "$(step acct-7)" "3 un-parked"
check "acct-9's step applies its parked entry, not the skipped dead letter" eq "$(step acct-9)" "1 un-parked"
check "the drained events are applied in order" \
	eq "$(q "$db" -c "SELECT string_agg(key || ':' || (payload->>'n'), ' ' ORDER BY n) FROM drained")" \
	"acct-7:5 acct-7:6 acct-7:7 acct-7:8 acct-9:13"
check "acct-7's dead letter is replayed, acct-9's skipped" \
	eq "$(q "$db" -c "SELECT string_agg(entry_id || ' ' || (replayed_at IS NOT NULL) || ' ' || (skipped_at IS NOT NULL), ', ' ORDER BY id)
						FROM outbox.dead_letters WHERE stream = 'outbox:accounts'")" \
	"5-1 true false, 12-1 false true"
check "only acct-8 is still parked" \
	eq "$(q "$db" -c "SELECT string_agg(key || ' ' || state, ', ') FROM inbox_parked_keys('ledger')")" "acct-8 retrying"

# A copy made before keys could park, without the parked tables and the
# dead letters' skipped_at and skipped_by, is imported as it is.
check "a copy without parked keys is imported" \
	eq "$(q "$db" <<'SQL'
BEGIN;
SELECT count(*) FROM outbox_export_state('cp') \g /dev/null
DROP TABLE cp.parked_keys, cp.parked_entries;
ALTER TABLE cp.dead_letters DROP COLUMN skipped_at, DROP COLUMN skipped_by;
CREATE TEMP TABLE was AS SELECT id, entry_id FROM cp.dead_letters;
DROP EXTENSION pg_outbox;
CREATE EXTENSION pg_outbox_sql;
SELECT string_agg(object, ',' ORDER BY object) FILTER (WHERE action = 'restored') FROM outbox_import_state('cp');
SELECT count(*) FROM outbox.dead_letters d JOIN was w USING (id, entry_id) WHERE d.skipped_at IS NULL AND d.skipped_by IS NULL;
SELECT count(*) FROM outbox.parked_keys;
ROLLBACK;
SQL
)" "config,consumers,dead_letters,groups,inbox,skipped_events
4
0"

# Every group published every event of its topics and shard once, in
# feed order, at rising positions.
for g in billing audit fanout/0 fanout/1; do
	case $g in
	billing) want=$(cut -d'|' -f1 "$work/emitted") ;;
	audit) want=$(awk -F'|' '$2 == "orders" { print $1 }' "$work/emitted") ;;
	fanout/*) want=$(awk -F'|' -v s="${g#fanout/}" '$3 == s { print $1 }' "$work/emitted") ;;
	esac
	got=$(awk -F'|' -v g="$g" '$1 == g { print $3 }' "$work/published")
	check "group $g published each of its $(wc -l <<<"$want") events exactly once, in order, across both moves" \
		eq "$got" "$want"
	pos=$(awk -F'|' -v g="$g" '$1 == g { print $2 }' "$work/published")
	check "group $g published at rising positions" \
		eq "$pos" "$(sort -t- -k1,1n -k2,2n -u <<<"$pos")"
done
check "the 18 events emitted have 18 ids" test "$(cut -d'|' -f1 "$work/emitted" | sort -u | wc -l)" -eq 18

# A copy from another cluster re-anchors every group: its cursor moves to
# this server's horizon, its positions stay above all it published.
check "a copy imported with reanchor => true re-anchors every group" \
	eq "$(q "$db" <<'SQL'
BEGIN;
SELECT count(*) FROM outbox_export_state('cp') \g /dev/null
CREATE TEMP TABLE was AS SELECT name, shard, cursor FROM cp.groups;
DROP EXTENSION pg_outbox;
CREATE EXTENSION pg_outbox_sql;
SELECT string_agg(action, ',') FILTER (WHERE action = 'reanchored') FROM outbox_import_state('cp', reanchor => true);
SELECT bool_and((split_part(g.cursor, '-', 1)::numeric, split_part(g.cursor, '-', 2)::numeric)
				> (split_part(w.cursor, '-', 1)::numeric, split_part(w.cursor, '-', 2)::numeric))
  FROM outbox.groups g JOIN was w USING (name, shard);
ROLLBACK;
SQL
)" "reanchored,reanchored,reanchored,reanchored
t"

q postgres -c "DROP DATABASE $db" >/dev/null
finish
