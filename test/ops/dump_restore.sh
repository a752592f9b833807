#!/usr/bin/env bash
# pg_dump and restore of a database that uses pg_outbox, in the three ways
# a DBA does it: custom format, custom format in one transaction, plain
# SQL through psql with ON_ERROR_STOP. Each must exit 0 and bring back the
# settings, the groups with their cursors and stream templates, the inbox's memory of applied
# events (dedupe still holds), the dead letters and the user's own data.
# Events are not carried (see README, "Dump and restore"): their
# transaction ids mean nothing in another cluster.
#
# Runs against the server in PG* (pg_virtualenv, preloaded for the C
# engine), with the engine PG_OUTBOX_ENGINE names (tap.bash); prints one
# "ok" / "not ok" line per check and exits non-zero if any failed.
set -uo pipefail

. "$(dirname "$0")/tap.bash"
q() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$@"; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

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
SELECT 'dead', consumer, stream, entry_id, reason FROM outbox.dead_letters ORDER BY id;
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
	check "restore ($way) brings back settings, groups, cursors, inbox, dead letters and data" \
		diff -u "$work/src" "$work/$db"
	check "restore ($way): a redelivered event is still a duplicate" \
		test "$(q "$db" -c "SELECT inbox_apply('ledger', '00000000-0000-4000-8000-000000000003', '{\"n\": 3}')")" = f
	check "restore ($way): the same id with another payload is still a conflict (OB001)" \
		bash -c "psql -X -q -At -d $db -c \"SELECT inbox_apply('ledger', '00000000-0000-4000-8000-000000000003', '{\\\"n\\\": 4}')\" 2>&1 | grep -q 'already applied'"
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

finish
