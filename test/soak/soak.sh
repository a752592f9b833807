#!/usr/bin/env bash
# pg_outbox soak test: a fault-injecting workload, then a history checker.
#
# 16 writers emit numbered events on random keys (with aborted
# transactions, rolled-back savepoints, long transactions, two-phase
# commits and bulk emits), two relays publish one group, two consume
# workers apply the streams through the inbox into a projection. Faults
# come at random moments: relays and workers killed and restarted, the
# active relay stopped and continued, the leading relay hung for three
# leases (the standby takes over; the old leader is fenced off), Redis
# killed and restarted from its AOF, Redis unreachable, PostgreSQL
# restarted, a stream trimmed below entries nobody read, maintenance runs. Then everything is brought back,
# drained, and the history (what committed, what is in the streams, what
# was applied, what was dead-lettered) goes to pg_outbox_check.
#
#   SOAK_SECONDS=120   how long the faults and the workload run
#   SOAK_SEED          seed of the fault schedule (default: random, printed)
#   SOAK_ORDERING      commit (default: pg_outbox preloaded, a commit-ordered
#                      group, no two-phase commits) or xid8
#   SOAK_MODE          single (default: the above, one Redis) or
#                      sharded-cluster: the group has 4 shards, published
#                      by one relay per shard (two for shards 0 and 1) to a
#                      Redis Cluster of 3 masters and 3 replicas without
#                      AOF, and applied by one worker per shard (its three
#                      streams under one hash tag, so per-key order holds);
#                      the faults are relays killed, stopped and hung,
#                      PostgreSQL restarted, a master killed (its replica
#                      takes over, a tail of its streams may be lost; it
#                      comes back as a replica), slots resharded and a
#                      stream's slot migrated while the writers run. The
#                      checker also checks that each event is in its
#                      shard's stream and that each key's events applied
#                      in feed order; or
#                      network: PostgreSQL and Redis on a host of their
#                      own behind veth pairs, each relay and the consumer
#                      on theirs (network namespaces the test makes, see
#                      test/soak/network.sh; root only, else skipped with
#                      exit status 77), and the faults are network faults
#                      (blackhole, reset, link down) on one path at a
#                      time, with a standby relay and without; the soak
#                      then also reports how long each cut took to be
#                      noticed and how long after each heal publishing or
#                      applying resumed (pg_outbox_soak_network)
#   SOAK_FAULT_MAX     network mode: the longest fault in seconds (5 to
#                      120; default a sixth of SOAK_SECONDS within that)
#   SOAK_PG_OPTIONS    network mode: conninfo keywords added to the
#                      relays' and workers' --pg (say tcp_user_timeout=...)
#
# Everything runs on throwaway servers on loopback (in network mode on
# addresses inside the test's own namespaces), stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib.sh

SECONDS_TOTAL=${SOAK_SECONDS:-120}
SEED=${SOAK_SEED:-$RANDOM}
RANDOM=$SEED
ORDERING=${SOAK_ORDERING:-commit}
case $ORDERING in
commit | xid8) ;;
*) echo "SOAK_ORDERING must be commit or xid8, not \"$ORDERING\"" >&2; exit 2 ;;
esac
MODE=${SOAK_MODE:-single}
case $MODE in
single | sharded-cluster | network) ;;
*) echo "SOAK_MODE must be single, sharded-cluster or network, not \"$MODE\"" >&2; exit 2 ;;
esac

ensure_packages
if [ "$MODE" = network ]; then
	. test/soak/network.sh
	# The probe's namespace goes on any exit; so do the test's, below.
	trap net_teardown EXIT
	why=$(net_unavailable)
	if [ -n "$why" ]; then
		echo "soak: skipped: SOAK_MODE=network cannot make its network namespaces, veth pairs and iptables rules here: $why"
		exit 77
	fi
	FAULT_MAX=${SOAK_FAULT_MAX:-$((SECONDS_TOTAL / 6))}
	[ "$FAULT_MAX" -ge 5 ] || FAULT_MAX=5
	[ "$FAULT_MAX" -le 120 ] || FAULT_MAX=120
	NET_RESUME_WAIT=180
	NET_SHIFT=$RANDOM
	NET_STANDBY_SHIFT=$RANDOM
	NET_RESULTS=
fi
build_extension
build_relay pg_outbox_relay pg_outbox_check pg_outbox_soak_network
RELAY=build/relay/pg_outbox_relay
CHECK=build/test/soak/pg_outbox_check

throwaway_workspace soak
declare -A PIDS=()
WRITERS_PID=
FAULTS_PID=
REDIS_CLUSTER_PIDS=()
cleanup() {
	for p in "$FAULTS_PID" "$WRITERS_PID"; do stop_pid "$p"; done
	for name in "${!PIDS[@]}"; do
		kill -CONT "${PIDS[$name]}" 2>/dev/null || true
		stop_pid "${PIDS[$name]}"
	done
	redis_cluster_stop
	stop_servers
	[ "$MODE" != network ] || net_teardown
	[ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "soak: ${SECONDS_TOTAL}s, $ORDERING order, $MODE, fault schedule seed $SEED, work in $WORK"
PG_SETTINGS=("max_prepared_transactions = 50" "max_connections = 100")
[ "$ORDERING" = commit ] && PG_SETTINGS+=("shared_preload_libraries = 'pg_outbox'")
# The soak reaches PostgreSQL at PG_HOST: loopback, or in network mode its
# Unix socket (the faults cut only the relays' and workers' paths).
if [ "$MODE" = network ]; then
	NET_RESULTS=$WORK/network.tsv
	: >"$NET_RESULTS"
	net_setup
	net_pg_start "${PG_SETTINGS[@]}"
	PG_HOST=$WORK/pg
else
	pg_start "$WORK/pg" "$PG_PORT" "${PG_SETTINGS[@]}"
	PG_HOST=127.0.0.1
fi
db() { local d=$1; shift; psql -X -q -At -v ON_ERROR_STOP=1 -h "$PG_HOST" -p "$PG_PORT" -U postgres -d "$d" "$@"; }
if [ "$MODE" = network ]; then
	SHARDS=1
	net_redis_start
	STREAMS=(outbox:t0 outbox:t1 outbox:t2)
	RELAYS=(relay1 relay2)
	WORKERS=(worker1 worker2)
	redis() { redis-cli -s "$WORK/redis/redis.sock" "$@"; }
elif [ "$MODE" = single ]; then
	SHARDS=1
	REDIS_OPTS=(--appendonly yes --appendfsync everysec)
	redis_start "$WORK/redis" "$REDIS_PORT" "${REDIS_OPTS[@]}"
	REDIS_URL="127.0.0.1:$REDIS_PORT"
	STREAMS=(outbox:t0 outbox:t1 outbox:t2)
	RELAYS=(relay1 relay2)
	WORKERS=(worker1 worker2)
	redis() { redis-cli -p "$REDIS_PORT" "$@"; }
else
	# Each shard's streams under one hash tag: one slot, so a worker reads
	# its shard in one transaction on one master.
	SHARDS=4
	STREAM_TEMPLATE='soak:{{shard}}:{topic}'
	# Replicas sync at once (a master waits 5 s for more replicas by
	# default, and a replica that never synced does not fail over).
	CLUSTER_OPTS=(--repl-diskless-sync-delay 0)
	redis_cluster_start "$WORK/cluster" 3 1 "${CLUSTER_OPTS[@]}"
	REDIS_URL=$REDIS_CLUSTER_URL
	STREAMS=()
	WORKERS=()
	for s in $(seq 0 $((SHARDS - 1))); do
		STREAMS+=("soak:{$s}:t0" "soak:{$s}:t1" "soak:{$s}:t2")
		WORKERS+=("worker$s")
	done
	RELAYS=(relay0a relay0b relay1a relay1b relay2a relay3a)
	# A command on any node that answers, following redirections.
	redis() { redis-cli -c -p "$(cluster_port)" "$@"; }
fi

psql -X -q -h "$PG_HOST" -p "$PG_PORT" -U postgres -d postgres -c "CREATE DATABASE soak" -c "CREATE DATABASE sink"
db soak -v ordering="$ORDERING" -v shards="$SHARDS" <<'SQL'
CREATE EXTENSION pg_outbox;
CREATE SEQUENCE soak_n;
SELECT outbox_group_create('soak', start_at => 'beginning', ordering => :'ordering', shards => :shards);
SQL
db sink <<'SQL'
CREATE EXTENSION pg_outbox;
-- No unique constraint: a duplicate apply would show as two rows.
-- seq: the order of the applies (one worker applies each key's events).
CREATE TABLE projection (event_id uuid NOT NULL, n bigint, applied_at timestamptz NOT NULL DEFAULT clock_timestamp(),
                         seq bigserial);
CREATE FUNCTION soak_apply(payload jsonb, event_id uuid) RETURNS void LANGUAGE sql AS
    $$ INSERT INTO projection (event_id, n) VALUES (event_id, (payload->>'n')::bigint) $$;
SELECT inbox_consumer_create('projection', current_user::regrole);
SQL

# In sharded-cluster mode relayNx publishes shard N, workerN reads shard
# N's streams. In network mode each runs on its host (relay1, relay2, or
# consumer for the workers), reaches PostgreSQL and Redis at the db ends
# of that host's links, and logs JSON (whose times the report reads).
LEASE_MS=1000
# In network mode the lease is 3 s: the relays' waits are two thirds of
# it, with a floor of 2 s (README, "Bounds on waits"), so that a shorter
# lease would put the floor, not the lease, in the bound on resuming.
[ "$MODE" = network ] && LEASE_MS=3000
POLL_MS=200
start() { # name: (re)starts a relay or a worker
	local name=$1 group=soak streams=() s netns=() pg_host=127.0.0.1 redis_url=${REDIS_URL:-} opts=() retry=(--retry-max 1s)
	if [ "$MODE" = network ]; then
		local host
		host=$(net_host_of "$name")
		netns=(ip netns exec "$NETP$host")
		pg_host=$(net_db_addr "$host" pg)
		redis_url=$(net_db_addr "$host" redis):$REDIS_PORT
		opts=(--log-format json)
		# Each published batch has a line (at debug level): when publishing
		# resumed. The relays' backoff is their default (derived from the
		# lease), which the bound on resuming after a heal assumes.
		if [ "${name:0:5}" = relay ]; then
			opts+=(--log-level debug)
			retry=()
		fi
	fi
	local pg="port=$PG_PORT user=postgres${SOAK_PG_OPTIONS:+ $SOAK_PG_OPTIONS} host=$pg_host"
	case $name in
	relay*)
		if [ "$MODE" = sharded-cluster ]; then
			opts+=(--stream "$STREAM_TEMPLATE")
			group="soak/${name:5:1}"
		fi
		"${netns[@]}" "$RELAY" publish --pg "$pg dbname=soak" \
			--redis "$redis_url" --group "$group" "${opts[@]}" --poll-interval "${POLL_MS}ms" "${retry[@]}" \
			--stats-interval 1s --maintain-interval 3s --lease "${LEASE_MS}ms" >>"$WORK/$name.log" 2>&1 &
		;;
	worker*)
		if [ "$MODE" = sharded-cluster ]; then
			for s in t0 t1 t2; do streams+=(--stream "soak:{${name:6:1}}:$s"); done
		else
			for s in "${STREAMS[@]}"; do streams+=(--stream "$s"); done
		fi
		"${netns[@]}" "$RELAY" consume --pg "$pg dbname=sink" \
			--redis "$redis_url" --consumer projection --worker "$name" "${opts[@]}" \
			"${streams[@]}" --handler 'SELECT soak_apply($3, $5)' \
			--block 200ms --min-idle 2s --claim-interval 500ms --max-deliveries 1000000 \
			--retry-max 1s >>"$WORK/$name.log" 2>&1 &
		;;
	esac
	PIDS[$name]=$!
}
for name in "${RELAYS[@]}" "${WORKERS[@]}"; do start "$name"; done

# The writers: 16 clients, short pgbench runs in a loop (a PostgreSQL
# restart ends a run; the next one starts).
emit="SELECT outbox_emit('t' || (:k % 3), 'k' || :k, jsonb_build_object('n', nextval('soak_n')))"
W="$WORK/writers"
mkdir -p "$W"
printf '%s\n' '\set k random(1, 100000)' "BEGIN;" "$emit;" "$emit;" "COMMIT;" >"$W/normal.sql"
printf '%s\n' '\set k random(1, 100000)' "BEGIN;" "$emit;" "ROLLBACK;" >"$W/abort.sql"
printf '%s\n' '\set k random(1, 100000)' "BEGIN;" "$emit;" "SAVEPOINT s;" "$emit;" "ROLLBACK TO SAVEPOINT s;" "$emit;" "COMMIT;" >"$W/savepoint.sql"
printf '%s\n' '\set k random(1, 100000)' "BEGIN;" "$emit;" "SELECT pg_sleep(1 + random() * 2);" "$emit;" "COMMIT;" >"$W/long.sql"
printf '%s\n' '\set k random(1, 100000)' '\set g random(1, 1000000000)' "BEGIN;" "$emit;" \
	"PREPARE TRANSACTION 'soak-:g';" "COMMIT PREPARED 'soak-:g';" >"$W/twopc.sql"
printf '%s\n' '\set k random(1, 100000)' '\set g random(1, 1000000000)' "BEGIN;" "$emit;" \
	"PREPARE TRANSACTION 'soak-:g';" "ROLLBACK PREPARED 'soak-:g';" >"$W/twopc_abort.sql"
printf '%s\n' '\set k random(1, 100000)' \
	"SELECT count(*) FROM outbox_emit_many('t' || (:k % 3), NULL, (SELECT array_agg(jsonb_build_object('n', nextval('soak_n'))) FROM generate_series(1, 20)));" \
	>"$W/bulk.sql"
# An emitting transaction cannot be prepared while a commit-ordered group
# exists: in commit order, those weights go to plain transactions.
if [ "$ORDERING" = commit ]; then
	MIX=(-f "$W/normal.sql@74" -f "$W/abort.sql@10" -f "$W/savepoint.sql@10" -f "$W/long.sql@1" -f "$W/bulk.sql@5")
else
	MIX=(-f "$W/normal.sql@68" -f "$W/abort.sql@10" -f "$W/savepoint.sql@10" -f "$W/long.sql@1"
		-f "$W/twopc.sql@4" -f "$W/twopc_abort.sql@2" -f "$W/bulk.sql@5")
fi
# They stop after SOAK_SECONDS, or in network mode when the faults end
# (the last fault's heal is measured on events written after it).
writers() {
	local until=$(($(date +%s) + SECONDS_TOTAL))
	[ "$MODE" != network ] || until=$((until + 86400))
	while [ "$(date +%s)" -lt "$until" ] && [ ! -e "$W/stop" ]; do
		pgbench -n -h "$PG_HOST" -p "$PG_PORT" -U postgres -c 16 -j 2 -T 5 -R 300 \
			"${MIX[@]}" soak >>"$WORK/writers.log" 2>&1 || sleep 0.5
	done
}
writers &
WRITERS_PID=$!

# The relay that leads, by the last leadership line of its log, among the
# given ones (default relay1 relay2).
leading_relay() {
	local n candidates=("$@")
	[ "$#" -gt 0 ] || candidates=(relay1 relay2)
	for n in "${candidates[@]}"; do
		if grep -E 'leading group|standing by|lost the leadership' "$WORK/$n.log" 2>/dev/null | tail -n 1 |
				grep -q 'leading group'; then
			echo "$n"
			return
		fi
	done
	echo "${candidates[0]}"
}

# The faults, one every 1 to 4 seconds, in a random order.
fault() {
	local f=$((RANDOM % 9))
	case $f in
	0) local n="relay$((1 + RANDOM % 2))"; echo "kill -9 $n"; kill -KILL "${PIDS[$n]}" 2>/dev/null || true; sleep 0.3; start "$n" ;;
	1) local n="worker$((1 + RANDOM % 2))"; echo "kill -9 $n"; kill -KILL "${PIDS[$n]}" 2>/dev/null || true; sleep 0.3; start "$n" ;;
	2) local n="relay$((1 + RANDOM % 2))"; echo "stop and continue $n"; kill -STOP "${PIDS[$n]}"; sleep 2; kill -CONT "${PIDS[$n]}" ;;
	3) echo "kill -9 redis, restart from its AOF"; stop_pid "$REDIS_PID" KILL; sleep 0.5
	   redis_start "$WORK/redis" "$REDIS_PORT" "${REDIS_OPTS[@]}" ;;
	4) echo "redis unreachable for 3s"; kill -STOP "$REDIS_PID"; sleep 3; kill -CONT "$REDIS_PID" ;;
	5) echo "postgresql fast restart"; pg_run pg_ctl -D "$WORK/pg/data" -m fast -w restart >/dev/null 2>&1 || true ;;
	6) echo "trim outbox:t1 below unread entries"; kill -STOP "${PIDS[worker1]}" "${PIDS[worker2]}"; sleep 1.5
	   redis xtrim outbox:t1 MAXLEN 3 >/dev/null || true; kill -CONT "${PIDS[worker1]}" "${PIDS[worker2]}" ;;
	7) echo "maintenance"; db soak -c "SELECT count(*) FROM outbox_maintain()" >/dev/null 2>&1 || true ;;
	8) local n; n=$(leading_relay); echo "hung leader: stop the leading relay for 3 leases"
	   kill -STOP "${PIDS[$n]}"; sleep 3; kill -CONT "${PIDS[$n]}" ;;
	esac
}
# The cluster's faults, one every 1 to 4 seconds, in a random order.
cluster_fault() {
	local f=$((RANDOM % 8))
	case $f in
	0) local n=${RELAYS[RANDOM % ${#RELAYS[@]}]}; echo "kill -9 $n"; kill -KILL "${PIDS[$n]}" 2>/dev/null || true; sleep 0.3; start "$n" ;;
	1) local n=${RELAYS[RANDOM % ${#RELAYS[@]}]}; echo "stop and continue $n"; kill -STOP "${PIDS[$n]}"; sleep 2; kill -CONT "${PIDS[$n]}" ;;
	2) local s=$((RANDOM % 2)) n; n=$(leading_relay "relay${s}a" "relay${s}b")
	   echo "hung leader: stop the leading relay of a shard for 3 leases"
	   kill -STOP "${PIDS[$n]}"; sleep 3; kill -CONT "${PIDS[$n]}" ;;
	3) echo "postgresql fast restart"; pg_run pg_ctl -D "$WORK/pg/data" -m fast -w restart >/dev/null 2>&1 || true ;;
	4) echo "kill -9 a master, its replica takes over, it comes back as a replica"; kill_master ;;
	5) echo "kill -9 a master behind a lagging replica (a tail of its streams is lost)"; kill_master lagging ;;
	6) echo "reshard 100 slots from a stream's master to another"; reshard ;;
	7) echo "migrate a stream's slot to another master"; migrate_stream_slot ;;
	esac
}

# The port of a cluster node that answers.
cluster_port() {
	local port
	for port in "${REDIS_CLUSTER_PORTS[@]}"; do
		redis-cli -p "$port" ping >/dev/null 2>&1 && { echo "$port"; return; }
	done
	echo "${REDIS_CLUSTER_PORTS[0]}"
}
# The masters that are not failed, as "id port" lines.
cluster_masters() {
	redis-cli -p "$(cluster_port)" cluster nodes |
		awk '$3 ~ /master/ && $3 !~ /fail/ && $8 == "connected" { split($2, a, "[:@]"); print $1, a[2] }'
}
# The port of the master that serves a slot.
slot_master() {
	redis-cli -p "$(cluster_port)" cluster nodes | awk -v s="$1" '
		$3 ~ /master/ && $3 !~ /fail/ {
			for (i = 9; i <= NF; i++) {
				if ($i ~ /^\[/) continue
				n = split($i, r, "-"); if (n == 1) r[2] = r[1]
				if (s + 0 >= r[1] + 0 && s + 0 <= r[2] + 0) { split($2, a, "[:@]"); print a[2]; exit }
			}
		}'
}
# True when every node sees the cluster whole, every replica is in sync
# with its master and no slot is open.
cluster_settled() {
	local port
	for port in "${REDIS_CLUSTER_PORTS[@]}"; do
		redis-cli -p "$port" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || return 1
		redis-cli -p "$port" info replication 2>/dev/null | grep -q '^role:master\|^master_link_status:up' || return 1
	done
	! redis-cli -p "$(cluster_port)" cluster nodes | grep -q -- '->-\|-<-'
}
# True when the node on a port is marked failed and the others see the
# cluster whole again (its replica took over).
failed_over() {
	local p
	p=$(cluster_port)
	redis-cli -p "$p" cluster nodes | grep -q "127.0.0.1:$1@[0-9]* [a-z,]*fail " &&
		redis-cli -p "$p" cluster info | grep -q '^cluster_state:ok'
}
# True when the node on a port is a replica whose link is up, and the
# cluster is settled.
replicating() {
	redis-cli -p "$1" info replication | grep -q '^master_link_status:up' && cluster_settled
}
# Kills a master by PID, waits for its replica to take over, restarts it
# (same port, directory and nodes.conf, so it rejoins as a replica) and
# waits for it to replicate. With "lagging", the replica first loses its
# link to the master and cannot make it again (AUTH with a password the
# master does not have; a SIGSTOP would not do: the kernel's socket
# buffer keeps what the master sent), so the master takes 700 ms of
# writes that the promoted replica never had; the master is then one that
# serves streams (a random stream's), else any.
kill_master() {
	local line port i idx=-1 bus replica='' slot
	if [ "${1:-}" = lagging ]; then
		slot=$(redis-cli -p "$(cluster_port)" cluster keyslot "${STREAMS[RANDOM % ${#STREAMS[@]}]}")
		port=$(slot_master "$slot")
		line=$(cluster_masters | awk -v p="$port" '$2 == p')
	else
		line=$(cluster_masters | shuf -n 1 --random-source=<(yes "$RANDOM"))
	fi
	[ -n "$line" ] || return 0
	port=${line#* }
	for i in "${!REDIS_CLUSTER_PORTS[@]}"; do [ "${REDIS_CLUSTER_PORTS[$i]}" = "$port" ] && idx=$i; done
	[ "$idx" -ge 0 ] || return 0
	bus=$(awk '/myself/ { split($2, a, "[:@]"); print a[3] }' "$WORK/cluster/node$((idx + 1))/nodes.conf")
	if [ "${1:-}" = lagging ]; then
		replica=$(redis-cli -p "$port" cluster nodes |
			awk -v m="${line% *}" '$3 ~ /slave/ && $4 == m { split($2, a, "[:@]"); print a[2]; exit }')
		if [ -n "$replica" ]; then
			redis-cli -p "$replica" config set masterauth not-the-password >/dev/null
			redis-cli -p "$replica" client kill type master >/dev/null
			sleep 0.7
		fi
	fi
	stop_pid "${REDIS_CLUSTER_PIDS[$idx]}" KILL
	wait_for 30 failed_over "$port" || echo "  the cluster did not fail over within 30 s" >&2
	[ -z "$replica" ] || redis-cli -p "$replica" config set masterauth "" >/dev/null || true
	mv "$WORK/cluster/node$((idx + 1))/redis.log" "$WORK/cluster/node$((idx + 1))/redis.log.$(date +%s%N)"
	redis_start "$WORK/cluster/node$((idx + 1))" "$port" --cluster-enabled yes --cluster-config-file nodes.conf \
		--cluster-node-timeout 2000 --cluster-port "$bus" "${CLUSTER_OPTS[@]}" ||
		echo "  the old master did not start again" >&2
	REDIS_CLUSTER_PIDS[idx]=$REDIS_PID
	REDIS_PID=
	wait_for 30 replicating "$port" || echo "  the old master did not come back as a replica within 30 s" >&2
}
# Moves 100 slots (the lowest of the source) from the master of a random
# stream's slot to another master, with redis-cli --cluster reshard.
reshard() {
	local stream slot from to
	cluster_settled || { echo "  not settled, skipped" >&2; return 0; }
	stream=${STREAMS[RANDOM % ${#STREAMS[@]}]}
	slot=$(redis-cli -p "$(cluster_port)" cluster keyslot "$stream")
	from=$(slot_master "$slot")
	to=$(cluster_masters | awk -v p="$from" '$2 != p { print $1 }' | shuf -n 1 --random-source=<(yes "$RANDOM"))
	[ -n "$from" ] && [ -n "$to" ] || return 0
	timeout 60 redis-cli --cluster reshard "127.0.0.1:$from" --cluster-from "$(redis-cli -p "$from" cluster myid)" \
		--cluster-to "$to" --cluster-slots 100 --cluster-yes >>"$WORK/reshard.log" 2>&1 ||
		{ echo "  reshard failed (see reshard.log)" >&2; cluster_fix; }
}
# Moves the slot of a random stream to another master as redis-cli's
# reshard does, slot by slot: IMPORTING, MIGRATING, MIGRATE, NODE.
migrate_stream_slot() {
	local stream slot from to to_port from_id keys i m
	cluster_settled || { echo "  not settled, skipped" >&2; return 0; }
	stream=${STREAMS[RANDOM % ${#STREAMS[@]}]}
	slot=$(redis-cli -p "$(cluster_port)" cluster keyslot "$stream")
	from=$(slot_master "$slot")
	to=$(cluster_masters | awk -v p="$from" '$2 != p' | shuf -n 1 --random-source=<(yes "$RANDOM"))
	[ -n "$from" ] && [ -n "$to" ] || return 0
	to_port=${to#* }
	to=${to% *}
	from_id=$(redis-cli -p "$from" cluster myid)
	echo "  slot $slot of $stream from :$from to :$to_port" >&2
	{
		redis-cli -p "$to_port" cluster setslot "$slot" importing "$from_id" &&
			redis-cli -p "$from" cluster setslot "$slot" migrating "$to" &&
			for i in $(seq 1 100); do
				keys=$(redis-cli -p "$from" cluster getkeysinslot "$slot" 100)
				[ -n "$keys" ] || break
				# shellcheck disable=SC2086 # one key per word
				redis-cli -p "$from" migrate 127.0.0.1 "$to_port" "" 0 10000 KEYS $keys
			done &&
			for m in $to_port $from $(cluster_masters | awk -v a="$from" -v b="$to_port" '$2 != a && $2 != b { print $2 }'); do
				redis-cli -p "$m" cluster setslot "$slot" node "$to"
			done
	} >>"$WORK/reshard.log" 2>&1 || { echo "  migration failed (see reshard.log)" >&2; cluster_fix; }
}
# Closes slots a failed migration left open.
cluster_fix() {
	timeout 60 redis-cli --cluster fix "127.0.0.1:$(cluster_port)" --cluster-yes >>"$WORK/reshard.log" 2>&1 || true
}

faults() {
	local until=$(($(date +%s) + SECONDS_TOTAL - 3))
	sleep 2
	if [ "$MODE" = sharded-cluster ] && ! wait_for 30 cluster_settled; then
		echo "  the replicas did not sync within 30 s" >&2
	fi
	while [ "$(date +%s)" -lt "$until" ]; do
		if [ "$MODE" = single ]; then fault; else cluster_fault; fi
		sleep "$((1 + RANDOM % 4))"
	done
}
# The network faults, one at a time, each measured until publishing or
# applying resumed, 1 to 3 seconds apart; the last starts 5 s before the
# end at the latest.
net_faults() {
	local until=$(($(date +%s) + SECONDS_TOTAL - 5)) n=0
	sleep 2
	while [ "$(date +%s)" -lt "$until" ]; do
		net_fault "$n"
		n=$((n + 1))
		sleep "$((1 + RANDOM % 3))"
	done
}
# The fault loop runs in this shell (it restarts processes whose PIDs the
# cleanup needs), while the writers run in the background.
if [ "$MODE" = network ]; then
	net_faults >"$WORK/faults.log" 2>>"$WORK/shell.log" || true
	touch "$W/stop"
else
	faults >"$WORK/faults.log" 2>>"$WORK/shell.log" || true
fi
wait "$WRITERS_PID" || true
WRITERS_PID=
say "faults injected: $(wc -l <"$WORK/faults.log") ($(sort "$WORK/faults.log" | uniq -c | sort -rn | awk '{c=$1; $1=""; printf "%s%s x%s", sep, $0, c; sep=","}'))"

# Bring everything back and let it drain.
[ -z "$REDIS_PID" ] || kill -CONT "$REDIS_PID" 2>/dev/null || true
for name in "${RELAYS[@]}" "${WORKERS[@]}"; do
	kill -CONT "${PIDS[$name]}" 2>/dev/null || true
	kill -0 "${PIDS[$name]}" 2>/dev/null || start "$name"
done
# A PostgreSQL restart between a writer's PREPARE TRANSACTION and its
# COMMIT PREPARED leaves the transaction in doubt, holding the xid8
# horizon until someone decides. As the transaction manager would after a
# crash, commit them: their events must then be published like any other.
for gid in $(db soak -c "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE 'soak-%'"); do
	echo "committing in-doubt prepared transaction $gid"
	db soak -c "COMMIT PREPARED '$gid'"
done
db soak -c "SELECT count(*) FROM outbox_maintain()" >/dev/null
committed() { db soak -c "SELECT count(*) FROM outbox.event"; }
settled() {
	local c a d p n
	c=$(committed)
	a=$(db sink -c "SELECT count(DISTINCT event_id) FROM projection")
	p=0
	for s in "${STREAMS[@]}"; do
		n=$(redis xpending "$s" projection 2>/dev/null | head -n 1 || true)
		[[ $n =~ ^[0-9]+$ ]] || n=0
		p=$((p + n))
	done
	[ "$p" = 0 ] && [ "$(db soak -c "SELECT coalesce(sum(waiting), 0) FROM outbox_group_stats()")" = 0 ] && \
		[ "$a" -gt 0 ] && [ "$(db sink -c "SELECT count(*) FROM projection WHERE applied_at > clock_timestamp() - interval '2 seconds'")" = 0 ]
}
for i in $(seq 1 120); do
	settled && break
	sleep 1
done

# The history.
H="$WORK/history"
mkdir -p "$H"
# Each committed event with its position in the group's order (in
# sharded-cluster mode also its shard's stream and its key).
ROUTE=
[ "$MODE" = sharded-cluster ] &&
	ROUTE=", 'soak:{' || outbox.shard_of(e.topic, e.key, $SHARDS) || '}:' || e.topic, coalesce(e.key, '')"
if [ "$ORDERING" = commit ]; then
	db soak -F $'\t' -c "SELECT e.event_id, e.topic, m.ticket || '-' || e.seq, extract(epoch FROM e.created_at) $ROUTE
						  FROM outbox.event e JOIN outbox.commit_log m ON m.txid = e.txid" >"$H/committed.tsv"
	unmarked=$(db soak -c "SELECT count(*) FROM outbox.event e WHERE NOT EXISTS (SELECT 1 FROM outbox.commit_log m WHERE m.txid = e.txid)")
	if [ "$unmarked" != 0 ]; then
		echo "soak: $unmarked committed events have no commit marker" >&2
		echo "soak: 0 passed, 1 failed"
		KEEP=1
		exit 1
	fi
else
	db soak -F $'\t' -c "SELECT e.event_id, e.topic, e.txid || '-' || e.seq, extract(epoch FROM e.created_at) $ROUTE
						  FROM outbox.event e" >"$H/committed.tsv"
fi
for s in "${STREAMS[@]}"; do
	start_id=-
	while :; do
		chunk=$(redis --raw xrange "$s" "$start_id" + COUNT 5000)
		[ -n "$chunk" ] || break
		echo "$chunk" | awk -v s="$s" '
			/^[0-9]+-[0-9]+$/ && expect_id { id = $0; expect_id = 0; next }
			{ if (key == "") { key = $0 } else { f[key] = $0; key = "" } }
			key == "" && "prev" in f { print s "\t" id "\t" f["event_id"] "\t" f["position"]; delete f; expect_id = 1 }
			BEGIN { expect_id = 1 }' >>"$H/streams.tsv"
		last=$(tail -n 1 "$H/streams.tsv" | cut -f 2)
		[ "$start_id" = "($last" ] && break
		start_id="($last"
	done
done
touch "$H/streams.tsv"
db sink -F $'\t' -c "SELECT event_id, extract(epoch FROM applied_at), seq FROM projection" >"$H/applied.tsv"
db sink -F $'\t' -c "SELECT stream, entry_id, coalesce(event_id::text, '') FROM outbox.dead_letters" >"$H/dead_letters.tsv"

if [ "$MODE" = network ]; then
	# The documented bounds on a wait (README, "Bounds on waits"): a
	# relay's --pg-timeout and --redis-timeout default to two thirds of
	# the lease, between 2 s and 10 s; consume mode's to 10 s. A relay
	# notices a cut in the first wait that begins after it, at most a poll
	# later: its bound is the timeout and one poll.
	relay_bound=$((LEASE_MS * 2 / 3))
	[ "$relay_bound" -ge 2000 ] || relay_bound=2000
	[ "$relay_bound" -le 10000 ] || relay_bound=10000
	say "network faults, each cut and heal (pg_outbox_soak_network):"
	build/test/soak/pg_outbox_soak_network "$NET_RESULTS" "$LEASE_MS" "$POLL_MS" "$((relay_bound + POLL_MS))" 10000 | sed 's/^/  /'
fi
if [ "$MODE" = sharded-cluster ]; then
	say "streams found behind by the relays: $(cat "$WORK"/relay*.log | grep -cE 'is behind|lost entries' || true), gaps found by the workers: $(cat "$WORK"/worker*.log | grep -c ': gap (' || true)"
fi
say "history: $(wc -l <"$H/committed.tsv") committed, $(wc -l <"$H/streams.tsv") stream entries, $(wc -l <"$H/applied.tsv") applies, $(wc -l <"$H/dead_letters.tsv") dead letters"
if "$CHECK" "$H"; then
	echo "soak: 1 passed, 0 failed"
else
	KEEP=1
	echo "soak: history and logs kept in $WORK"
	echo "soak: 0 passed, 1 failed"
	exit 1
fi
