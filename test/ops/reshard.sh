#!/usr/bin/env bash
# Changing a group's shard count, as docs/concepts.md ("Changing N") says:
#
# 1. A group without shards (topics {orders}) published by a relay to
#    Redis and applied by a consume worker, while an application keeps
#    emitting events of "orders" and of another topic, "payments", goes to
#    4 shards: the new group takes the old one's ordering and topics, the
#    old relay stops, every shard of the new group is rewound to the old
#    cursor (the documented query prints the outbox_rewind calls), the new
#    relay starts, the worker drains the old stream and moves to the new
#    ones, the old stream and consumer group go. Every "orders" event is in
#    exactly one stream entry and applied once; no "payments" event is in
#    a stream of the new group.
# 2. A group of 2 shards whose cursors straddle a power of ten (9xx-1 and
#    10xx-1: as text, the higher is the lower) goes to 4: the query picks
#    the numerically lowest cursor, so nothing is lost, and only events
#    between the two cursors are published twice.
#
# Runs against the server in PG*, with the engine PG_OUTBOX_ENGINE names
# (tap.bash), the relay PG_OUTBOX_RELAY (default build/relay/pg_outbox_relay)
# and a throwaway Redis started by the test kit (PG_OUTBOX_TESTKIT, see
# scripts/lib.sh); prints one "ok" / "not ok" line per check and exits
# non-zero if any failed. Stops what it started by PID.
set -uo pipefail

cd "$(dirname "$0")/../.."
. test/ops/tap.bash
. scripts/lib.sh
q() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$@"; }
RELAY=${PG_OUTBOX_RELAY:-$PWD/build/relay/pg_outbox_relay}
[ -x "$RELAY" ] || { echo "not ok 1 - the relay is built ($RELAY)"; echo "0 passed, 1 failed"; exit 1; }

throwaway_workspace reshard
PIDS=()
cleanup() {
	local pid
	touch "$WORK/stop-emitting"
	for pid in "${PIDS[@]}"; do stop_pid "$pid"; done
	stop_servers
	rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
redis_start "$WORK/redis" "$REDIS_PORT" || exit 1
redis() { redis-cli -p "$REDIS_PORT" "$@"; }

# Starts the relay in the background: relay NAME ARG... (its log in
# $WORK/NAME.log, its pid in $WORK/NAME.pid).
relay() {
	local name=$1
	shift
	"$RELAY" "$@" --pg "dbname=reshard" --redis "127.0.0.1:$REDIS_PORT" >"$WORK/$name.log" 2>&1 &
	PIDS+=($!)
	echo $! >"$WORK/$name.pid"
}
# Stops a relay started by relay, by its pid, and says whether it stopped
# with status 0 (SIGTERM: its batch finished).
stop_relay() {
	local pid
	pid=$(cat "$WORK/$1.pid")
	kill -TERM "$pid"
	wait "$pid"
}
# Waits (60 s at most) until an SQL condition holds in database reshard.
until_true() { until_sql 60 reshard "$1"; }
# The value of a field of XINFO GROUPS for a consumer group of a stream:
# group_info STREAM GROUP FIELD.
group_info() {
	redis XINFO GROUPS "$1" | awk -v g="$2" -v f="$3" '
		prev == "name" { in_group = ($0 == g) }
		in_group && prev == f { print; exit }
		{ prev = $0 }'
}
# The event ids of the entries of streams (field event_id), one a line.
event_ids() {
	local s
	for s in "$@"; do
		redis XRANGE "$s" - + | awk 'prev == "event_id" { print } { prev = $0 }'
	done
}

# The documented statements (docs/concepts.md, "Changing N"), for other
# groups than the page's: create OLD NEW, rewind_query OLD NEW.
create() { doc_block docs/concepts.md create | sed -e "s/'orders_v2'/'$2'/" -e "s/'orders'/'$1'/"; }
rewind_query() { doc_block docs/concepts.md rewind | sed -e "s/'orders_v2'/'$2'/" -e "s/'orders'/'$1'/"; }
check "docs/concepts.md has the statements" eval 'create a b >/dev/null && rewind_query a b >/dev/null'

createdb reshard
q reshard -v ext="$EXT" -v commit_order="$COMMIT_ORDER" >/dev/null <<'SQL'
CREATE EXTENSION :"ext";
SELECT outbox_group_create('orders', topics => ARRAY['orders'], ordering => :'commit_order');
DO $$ BEGIN CREATE ROLE reshard_ledger; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
SELECT inbox_consumer_create('ledger', 'reshard_ledger');
CREATE TABLE applied (n serial, topic text, key text, event_id uuid);
SQL

# ---- 1. No shards to 4, under load -----------------------------------------

relay old publish --group orders --stream 'outbox:{topic}'
relay old_worker consume --consumer ledger --stream outbox:orders \
	--handler 'INSERT INTO public.applied (topic, key, event_id) VALUES ($1, $2, $5)'
# The application: an "orders" and a "payments" event per transaction,
# until told to stop.
(
	i=0
	while [ ! -e "$WORK/stop-emitting" ]; do
		i=$((i + 1))
		q reshard -c "SELECT outbox_emit('orders', 'customer-' || ($i % 7), jsonb_build_object('n', $i)),
		                     outbox_emit('payments', 'customer-' || ($i % 7), jsonb_build_object('n', $i))" -o /dev/null
		sleep 0.02
	done
) &
PIDS+=($!)
check "the old relay publishes" until_true "SELECT count(*) >= 20 FROM applied"

# The documented steps. a) The new group, with the old one's ordering and
# topics.
check "the new group is created with the old one's ordering and topics" eval 'create orders orders_v2 | q reshard -o /dev/null'
check "... which it has" eq "$(q reshard -c "SELECT DISTINCT ordering || ' ' || topics::text || ' ' || shards FROM outbox_groups('orders_v2')")" \
	"$COMMIT_ORDER {orders} 4"
sleep 0.5
# b) Every relay of the old group stops.
check "the old relay stops (SIGTERM, exit 0)" stop_relay old
sleep 0.3	# events keep coming while no relay publishes
# c) Every shard of the new group goes to the lowest cursor of the old
# group's shards.
rewind_query orders orders_v2 | q reshard >"$WORK/rewind.out" 2>&1
check "the four rewinds ran, to the old cursor" \
	eq "$(q reshard -c "SELECT count(*) FILTER (WHERE n.cursor_position = o.cursor_position)
	                      FROM outbox_groups('orders_v2') n, outbox_groups('orders') o")" 4
# d) The new relay, with a template of other streams.
relay new publish --group 'orders_v2/*' --stream 'outbox:{topic}:{shard}'
# e) The worker finishes the old stream (nothing is added to it any more),
# then reads the new ones.
check "the worker drains the old stream (XINFO GROUPS: pending 0, lag 0)" \
	wait_for 60 '[ "$(group_info outbox:orders ledger pending)" = 0 ] && [ "$(group_info outbox:orders ledger lag)" = 0 ]'
check "the old worker stops (exit 0)" stop_relay old_worker
relay new_worker consume --consumer ledger --stream 'outbox:orders:{shard}' --shards 4 --pool \
	--handler 'INSERT INTO public.applied (topic, key, event_id) VALUES ($1, $2, $5)'
sleep 2
touch "$WORK/stop-emitting"
check "the new group publishes everything: every shard caught up" \
	until_true "SELECT bool_and(waiting = 0 AND coalesce(held_back, 0) = 0) FROM outbox_group_stats('orders_v2')"
check "every orders event is applied" \
	until_true "SELECT count(*) = (SELECT count(*) FROM outbox.event WHERE topic = 'orders') FROM applied"
sleep 1	# anything applied twice would show now
total=$(q reshard -c "SELECT count(*) FROM outbox.event WHERE topic = 'orders'")
echo "# $total orders events, $(event_ids outbox:orders | wc -l) in the old stream"
check "the new group published events too" test "$(event_ids outbox:orders:{0,1,2,3} | wc -l)" -gt 0
check "every orders event is in exactly one entry of the old and new streams" \
	eq "$(event_ids outbox:orders outbox:orders:{0,1,2,3} | sort | uniq -c | awk '$1 == 1' | wc -l)" "$total"
check "no entry twice" eq "$(event_ids outbox:orders outbox:orders:{0,1,2,3} | sort | uniq -d | wc -l)" 0
check "no payments event in any stream of the new group (or of the old)" \
	eq "$(redis --scan --pattern 'outbox:payments*' | wc -l)" 0
check "every entry of the new streams is an orders event" \
	eq "$(for s in outbox:orders:{0,1,2,3}; do redis XRANGE "$s" - +; done | awk 'prev == "topic" { print } { prev = $0 }' | sort -u)" orders
check "every orders event applied exactly once" \
	eq "$(q reshard -c "SELECT count(DISTINCT event_id) || ' ' || count(*) FROM applied a JOIN outbox.event e USING (event_id) WHERE e.topic = 'orders'")" \
	"$total $total"
# f) What is left of the old group.
check "the old consumer group and stream go" eval '[ "$(redis XGROUP DESTROY outbox:orders ledger)" = 1 ] && [ "$(redis DEL outbox:orders)" = 1 ]'
check "the old group is dropped" eq "$(q reshard -c "SELECT outbox_group_drop('orders')")" t
stop_relay new
stop_relay new_worker

# ---- 2. 2 shards to 4, cursors on either side of a power of ten -------------

# Transaction ids are burned (one a transaction) up to a few below a power
# of ten, then 12 events are emitted, a transaction each, alternating
# between the two shards, so that their ids straddle it.
q reshard -c "SELECT outbox_group_create('fan', topics => ARRAY['fan'], ordering => 'xid8', shards => 2, start_at => 'now')" -o /dev/null
now=$(q reshard -c "SELECT pg_current_xact_id()")
boundary=1
while [ "$boundary" -le $((now + 20)) ]; do boundary=$((boundary * 10)); done
q reshard >/dev/null <<SQL
DO \$\$
BEGIN
	WHILE pg_current_xact_id()::text::bigint < $((boundary - 6)) LOOP
		COMMIT;
	END LOOP;
END
\$\$;
SQL
q reshard >/dev/null <<'SQL'
DO $$
BEGIN
	FOR i IN 1 .. 12 LOOP
		PERFORM outbox_emit('fan', (SELECT 'key-' || j FROM generate_series(1, 1000) j
		                             WHERE outbox.shard_of('fan', 'key-' || j, 2) = i % 2 ORDER BY j LIMIT 1),
		                    jsonb_build_object('i', i));
		COMMIT;
	END LOOP;
END
$$;
SQL
# The old relays published: shard 0 up to its last event below the power
# of ten, shard 1 up to its first event above it.
# (Fetch and advance in one session: the one that leads.)
q reshard -o /dev/null -c "SELECT outbox_advance('fan/0', (SELECT pos FROM outbox_fetch('fan/0', 100) WHERE txid < '$boundary'
                                                         ORDER BY txid DESC, seq DESC LIMIT 1))" -c "SELECT outbox_resign('fan/0')"
q reshard -o /dev/null -c "SELECT outbox_advance('fan/1', (SELECT pos FROM outbox_fetch('fan/1', 100) WHERE txid >= '$boundary'
                                                         ORDER BY txid, seq LIMIT 1))" -c "SELECT outbox_resign('fan/1')"
c0=$(q reshard -c "SELECT cursor_position FROM outbox_groups('fan/0')")
c1=$(q reshard -c "SELECT cursor_position FROM outbox_groups('fan/1')")
echo "# cursors: fan/0 at $c0, fan/1 at $c1 (power of ten $boundary)"
check "as text the higher cursor sorts first" test "$(printf '%s\n' "$c0" "$c1" | LC_ALL=C sort | head -n 1)" = "$c1"
published_old=$(q reshard -c "
	SELECT string_agg(payload->>'i', ',' ORDER BY (payload->>'i')::int) FROM outbox.event
	 WHERE topic = 'fan' AND ((outbox.shard_of(topic, key, 2) = 0 AND txid <= '${c0%-*}') OR
	                          (outbox.shard_of(topic, key, 2) = 1 AND txid <= '${c1%-*}'))")
create fan fan_v2 | q reshard -o /dev/null
rewind_query fan fan_v2 | grep -vx '\\gexec' >"$WORK/rewind.sql"
check "the query prints a rewind of each of the 4 new shards to the numerically lowest cursor" \
	eq "$(q reshard -f "$WORK/rewind.sql")" "$(printf "SELECT outbox_rewind('fan_v2/%s', '$c0');\n" 0 1 2 3)"
rewind_query fan fan_v2 | q reshard -o /dev/null
published_new=$(q reshard -c "
	SELECT string_agg(payload->>'i', ',' ORDER BY (payload->>'i')::int)
	  FROM (SELECT * FROM outbox_fetch('fan_v2/0', 100) UNION ALL SELECT * FROM outbox_fetch('fan_v2/1', 100)
	        UNION ALL SELECT * FROM outbox_fetch('fan_v2/2', 100) UNION ALL SELECT * FROM outbox_fetch('fan_v2/3', 100)) f")
echo "# published by the old shards: $published_old; by the new ones: $published_new"
check "nothing is lost: the old and new groups together publish every event" \
	eq "$(tr ',' '\n' <<<"$published_old,$published_new" | sort -n -u | paste -sd,)" "$(seq -s, 1 12)"
check "twice only the events between the two old cursors (shard 1's above shard 0's cursor)" \
	eq "$(q reshard -c "SELECT count(*) FROM outbox.event WHERE topic = 'fan' AND outbox.shard_of(topic, key, 2) = 1
	                       AND txid > '${c0%-*}' AND txid <= '${c1%-*}'")" \
	"$(tr ',' '\n' <<<"$published_old,$published_new" | sort -n | uniq -d | wc -l)"

finish
