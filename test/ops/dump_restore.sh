#!/usr/bin/env bash
# pg_dump and restore of a database that uses pg_outbox, in the three ways
# a DBA does it: custom format, custom format in one transaction, plain
# SQL through psql with ON_ERROR_STOP. Each must exit 0 and bring back the
# settings, the groups with their cursors and stream templates, the inbox's memory of applied
# events (dedupe still holds), the dead letters, the parked keys with their
# parked entries (which then drain) and the user's own data.
# Events are not carried (see docs/operations.md, "Dump and restore"): their
# transaction ids mean nothing in another cluster. Then the steps that page
# gives for a new cluster (started here with the test kit): the globals,
# whose only error is the superuser that exists already, the database made
# first, the restore, maintenance, which makes the sharded group's index
# that the dump does not carry.
#
# Runs against the server in PG* (pg_virtualenv, preloaded for the C
# engine), with the engine PG_OUTBOX_ENGINE names (tap.bash); prints one
# "ok" / "not ok" line per check and exits non-zero if any failed.
set -uo pipefail

. "$(dirname "$0")/tap.bash"
. "$(dirname "$0")/../../scripts/lib.sh"
q() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$@"; }
work=$(mktemp -d)
chmod 755 "$work"	# the new cluster's directory is made in it, as the postgres user
WORK=$work
trap 'stop_servers; rm -rf "$work"' EXIT

createdb src
q src -c "CREATE EXTENSION $EXT" >/dev/null
q src -v commit_order="$COMMIT_ORDER" <<'SQL' >/dev/null
UPDATE outbox.config SET retention = '14 days', inbox_retention = '30 days', premake = 6;
CREATE TABLE orders (id int PRIMARY KEY, total numeric NOT NULL);
INSERT INTO orders SELECT i, i * 10 FROM generate_series(1, 5) i;
SELECT outbox_group_create('billing', ordering => 'xid8', start_at => 'beginning');
SELECT outbox_group_create('audit', topics => ARRAY['orders'], ordering => :'commit_order', start_at => 'beginning');
SELECT outbox_group_create('fanout', ordering => 'xid8', start_at => 'beginning', shards => 2);
SELECT outbox_emit('orders', 'o' || i, jsonb_build_object('id', i)) FROM generate_series(1, 5) i;
-- Publish three (a maintenance run woken by the install may hold the
-- horizon for a moment).
DO $$
DECLARE
	last text;
BEGIN
	FOR i IN 1 .. 200 LOOP
		SELECT max(pos) INTO last FROM outbox_fetch('billing', 3);
		EXIT WHEN last IS NOT NULL;
		PERFORM pg_sleep(0.05);
	END LOOP;
	PERFORM outbox_advance('billing', last);
END
$$;
SELECT outbox_stream_template('billing', 'outbox:{topic}');
SELECT outbox_resign('billing');
SELECT outbox_group_set_stale('audit');
DO $$ BEGIN CREATE ROLE dump_ledger; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
SELECT inbox_consumer_create('ledger', 'dump_ledger');
SELECT inbox_apply('ledger', ('00000000-0000-4000-8000-00000000000' || i)::uuid, jsonb_build_object('n', i))
  FROM generate_series(1, 9) i;
SELECT inbox_dead_letter('ledger', 'outbox:orders', '1-1', NULL, 'orders', NULL, NULL, NULL, 'broken entry');
-- Parked keys of stream outbox:accounts: acct-7 dead at its event 5 (the
-- dead letter) with 6 and 7 parked; acct-9 dead at 8, skipped, 9 parked.
CREATE TABLE drained (n serial, key text, payload jsonb);
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
SELECT * FROM inbox_park_key('ledger', 'outbox:accounts', '8-1', pg_temp.f('acct-9', 8), 'handler failed', 'P0001', 3, true);
SELECT pg_temp.park('acct-7', '{6,7}');
SELECT pg_temp.park('acct-9', '{9}');
SELECT * FROM inbox_skip('ledger', 'acct-9');
-- Maintenance puts today's inbox rows in their day's partition (again
-- while the background run woken by the install holds the lock).
DO $$
BEGIN
	FOR i IN 1 .. 200 LOOP
		EXIT WHEN NOT EXISTS (SELECT 1 FROM outbox_maintain() WHERE action = 'skipped');
		PERFORM pg_sleep(0.05);
	END LOOP;
END
$$;
SQL

snapshot() {
	q "$1" <<'SQL'
SELECT 'config', partition_width, premake, retention, inbox_retention, retire_mode FROM outbox.config;
SELECT 'group', name, shard, shards, topics, ordering, cursor, stale, streams, stream_template FROM outbox.groups ORDER BY name, shard;
SELECT 'inbox', consumer, event_id, payload FROM outbox.inbox ORDER BY consumer, event_id;
SELECT 'dead', id, consumer, stream, entry_id, reason, fields, replayed_at, skipped_at, skipped_by FROM outbox.dead_letters ORDER BY id;
SELECT 'parked key', * FROM outbox.parked_keys ORDER BY consumer, stream, key_hash;
SELECT 'parked entry', * FROM outbox.parked_entries ORDER BY consumer, stream, entry_id;
SELECT 'consumer', consumer, owner FROM inbox_consumers();
SELECT 'orders', id, total FROM orders ORDER BY id;
SQL
}
snapshot src >"$work/src"
check "the source has inbox rows in day partitions" \
	test "$(q src -c "SELECT count(*) FROM outbox.inbox_default")" = 0

pg_dump -Fc -d src -f "$work/src.dump"
pg_dump -d src -f "$work/src.sql"

# The group's next batch is the event emitted after the restore (a
# maintenance run may hold the horizon for a moment).
fetches_new() {
	local i
	for i in $(seq 1 100); do
		[ "$(q "$1" -c "SELECT string_agg(key, ',') FROM outbox_fetch('billing', 100)")" = new ] && return 0
		sleep 0.05
	done
	return 1
}

# Restored statement by statement, the database keeps the background
# maintenance off until the restore ends: a run woken by CREATE EXTENSION
# would premake the inbox day partitions that the dump brings too.
restore_custom() {
	createdb "$1" && q "$1" -c "ALTER DATABASE $1 SET pg_outbox.background_maintenance = off" &&
		pg_restore --exit-on-error -d "$1" "$work/src.dump" &&
		q "$1" -c "ALTER DATABASE $1 RESET pg_outbox.background_maintenance"
}
restore_single() { createdb "$1" && pg_restore --exit-on-error --single-transaction -d "$1" "$work/src.dump"; }
restore_plain() {
	createdb "$1" && q "$1" -c "ALTER DATABASE $1 SET pg_outbox.background_maintenance = off" &&
		psql -X -q -v ON_ERROR_STOP=1 -d "$1" -f "$work/src.sql" >/dev/null &&
		q "$1" -c "ALTER DATABASE $1 RESET pg_outbox.background_maintenance"
}

for way in custom single plain; do
	db="dst_$way"
	check "restore ($way) exits 0" "restore_$way" "$db"
	snapshot "$db" >"$work/$db"
	check "restore ($way) brings back settings, groups, cursors, inbox, dead letters, parked keys and data" \
		diff -u "$work/src" "$work/$db"
	check "restore ($way): a redelivered event is still a duplicate" \
		test "$(q "$db" -c "SELECT inbox_apply('ledger', '00000000-0000-4000-8000-000000000003', '{\"n\": 3}')")" = f
	check "restore ($way): the same id with another payload is still a conflict (OB001)" \
		bash -c "psql -X -q -At -d $db -c \"SELECT inbox_apply('ledger', '00000000-0000-4000-8000-000000000003', '{\\\"n\\\": 4}')\" 2>&1 | grep -q 'already applied'"
	check "restore ($way): the parked keys drain, in order" \
		eq "$(q "$db" <<'SQL'
SELECT result FROM inbox_redrive('ledger', 'acct-7');
PREPARE step(text) AS
	SELECT applied || ' ' || coalesce(key_state, 'un-parked')
	  FROM inbox_redrive_step('ledger', 'INSERT INTO drained (key, payload) VALUES ($2, $3)', 'outbox:accounts',
							  convert_to($1, 'UTF8'));
EXECUTE step('acct-7');
EXECUTE step('acct-7');
EXECUTE step('acct-9');
SELECT string_agg(key || ':' || (payload->>'n'), ' ' ORDER BY n) FROM drained;
SELECT count(*) FROM inbox_parked_keys('ledger');
SQL
)" "requested
1 draining
2 un-parked
1 un-parked
acct-7:5 acct-7:6 acct-7:7 acct-9:9
0"
	check "restore ($way): events are not carried" \
		test "$(q "$db" -c "SELECT count(*) FROM outbox.event")" = 0
	check "restore ($way): maintenance runs in the restored database" \
		q "$db" -c "SELECT count(*) FROM outbox_maintain()" -o /dev/null
	check "restore ($way): the index of the sharded group is there after maintenance" \
		test "$(q "$db" -c "SELECT count(*) FROM pg_class WHERE relname = 'event_shards_2_idx'")" = 1
	q "$db" -c "SELECT outbox_emit('orders', 'new', '{}')" >/dev/null
	check "restore ($way): emitting and fetching work" fetches_new "$db"
	check "restore ($way): each shard of the sharded group fetches the new event or nothing" \
		test "$(q "$db" -c "SELECT (SELECT count(*) FROM outbox_fetch('fanout/0', 10)) + (SELECT count(*) FROM outbox_fetch('fanout/1', 10))")" = 1
done

# Into a new cluster, as docs/operations.md says, step by step: the roles
# (pg_dumpall --globals-only; the one error is the superuser that initdb
# made, which exists already), the database created first, the
# background maintenance off in it during the restore, the restore, then
# maintenance, which makes the sharded group's index that the dump does
# not carry.
new_port=$(free_port)
preload=()
[ "$ENGINE" = sql ] || preload=("shared_preload_libraries = 'pg_outbox'")
check "a new cluster starts" pg_start "$work/new" "$new_port" "${preload[@]}" || { finish; exit; }
# psql, pg_restore and createdb against the new cluster.
new() { PGHOST=127.0.0.1 PGPORT=$new_port PGUSER=postgres PGPASSWORD= "$@"; }
pg_dumpall --globals-only | new psql -X -q -d postgres >/dev/null 2>"$work/globals.err"
check "new cluster: the globals restore with one error, the superuser that exists already" \
	eq "$(sed -n 's/^.*ERROR: *//p' "$work/globals.err")" "role \"${PGUSER:-postgres}\" already exists"
new pg_restore -d app "$work/src.dump" 2>"$work/err"
check "new cluster: pg_restore -d needs the database to exist" grep -q 'database "app" does not exist' "$work/err"
check "new cluster: createdb, background maintenance off, restore, maintenance back on" \
	new bash -c 'createdb app &&
		psql -X -q -v ON_ERROR_STOP=1 -d app -c "ALTER DATABASE app SET pg_outbox.background_maintenance = off" &&
		pg_restore --exit-on-error -d app "$1" &&
		psql -X -q -v ON_ERROR_STOP=1 -d app -c "ALTER DATABASE app RESET pg_outbox.background_maintenance"' - "$work/src.dump"
new psql -X -q -At -d app -c "SELECT count(*) FROM outbox_fetch('fanout/0', 10)" >"$work/out" 2>&1
check "new cluster: before maintenance the sharded group's index is missing, and a fetch says to run outbox_maintain()" \
	grep -q 'HINT:  Run outbox_maintain(), which makes it.' "$work/out"
new psql -X -q -v ON_ERROR_STOP=1 -d app -c "SELECT count(*) FROM outbox_maintain()" -o /dev/null
check "new cluster: after outbox_maintain() the index is there" \
	eq "$(new psql -X -q -At -d app -c "SELECT count(*) FROM pg_class WHERE relname = 'event_shards_2_idx'")" 1
snapshot_new() { new psql -X -q -At -v ON_ERROR_STOP=1 -d "$@"; }
check "new cluster: settings, groups, cursors, inbox, dead letters, parked keys and data are back" \
	diff -u "$work/src" <(q() { snapshot_new "$@"; }; snapshot app)
check "new cluster: the sharded group fetches" \
	eq "$(new psql -X -q -At -d app -c "SELECT (SELECT count(*) FROM outbox_fetch('fanout/0', 10)) + (SELECT count(*) FROM outbox_fetch('fanout/1', 10))")" 0

finish
