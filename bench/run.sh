#!/usr/bin/env bash
# pg_outbox benchmarks: each figure beside a baseline measured in the same
# run, on throwaway PostgreSQL and Redis servers on loopback. Prints a
# markdown table and writes it to bench/results/. Asserts nothing.
#
#   BENCH_ONLY="fetch emit drain shards scaling latency coldstart consume catchup bloat"   workloads (default: all)
#   BENCH_ROUNDS=3                         interleaved rounds per workload
#   BENCH_EVENTS=1000000                   events drained per round
#   BENCH_EMIT_SECONDS=10 BENCH_BULK=200000 emit: pgbench duration per run; rows of a bulk emit
#   BENCH_BURST=500000                     events of the cold-start burst
#   BENCH_RATES="2000 5000" BENCH_SECONDS=15   latency: transactions/s (each a point) and duration
#   BENCH_CONSUME=20000 BENCH_CONSUME_BATCHES="10 100 1000" BENCH_CONSUME_WORKERS="1 2 4"
#   BENCH_CONSUME_RATES="2000 5000" BENCH_CONSUME_SECONDS=10 BENCH_CONSUME_PGBENCH_RATE=2000
#                                          consume: entries per round; batch sizes (1 worker); workers
#                                          over a 4-shard group (batch 100); tx/s of the latency runs
#                                          and their duration (s), also pgbench -S's; tx/s emitted
#                                          beside pgbench -S
#   BENCH_BACKLOGS="10000 1000000 5000000" catchup: backlogs behind the cursor
#   BENCH_BLOAT=1000000                    bloat: events through emit, publish, retention
#   BENCH_FETCH_SECONDS=5                  fetch: pgbench duration per call measured
#   BENCH_SCALING_EVENTS=500000 BENCH_SCALING_SHARDS="1 2 4" BENCH_SCALING_TARGETS="redis cluster"
#   BENCH_SCALING_EMIT_RATE=20000 BENCH_SCALING_ROUNDS=$BENCH_ROUNDS BENCH_SCALING_TIMEOUT=300
#                                          scaling: backlog drained per point; shard counts; one Redis
#                                          and/or a 3-master Redis Cluster; events/s of the emitters
#                                          running beside the drain; rounds; limit of one point (s)
#   BENCH_SCALING_BASE_RELAY=path          scaling: target "cluster-base" drains into the cluster with
#                                          this relay binary (another build, to compare in one run)
#
# With gnuplot (Debian's gnuplot-nox, installed here), the scaling and
# latency workloads also draw PNG charts beside the table.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

ONLY=${BENCH_ONLY:-fetch emit drain shards scaling latency coldstart consume catchup bloat}
ROUNDS=${BENCH_ROUNDS:-3}
EVENTS=${BENCH_EVENTS:-1000000}
BURST=${BENCH_BURST:-500000}
RATES=${BENCH_RATES:-${BENCH_RATE:-2000 5000}}
SECONDS_LAT=${BENCH_SECONDS:-15}
CONSUME=${BENCH_CONSUME:-20000}
CONSUME_BATCHES=${BENCH_CONSUME_BATCHES:-10 100 1000}
CONSUME_WORKERS=${BENCH_CONSUME_WORKERS:-1 2 4}
CONSUME_RATES=${BENCH_CONSUME_RATES:-2000 5000}
CONSUME_SECONDS=${BENCH_CONSUME_SECONDS:-10}
CONSUME_PGBENCH_RATE=${BENCH_CONSUME_PGBENCH_RATE:-2000}
BACKLOGS=${BENCH_BACKLOGS:-10000 1000000 5000000}
BLOAT=${BENCH_BLOAT:-1000000}
EMIT_SECONDS=${BENCH_EMIT_SECONDS:-10}
BULK=${BENCH_BULK:-200000}
FETCH_SECONDS=${BENCH_FETCH_SECONDS:-5}
SCALE_EVENTS=${BENCH_SCALING_EVENTS:-500000}
SCALE_SHARDS=${BENCH_SCALING_SHARDS:-1 2 4}
SCALE_TARGETS=${BENCH_SCALING_TARGETS:-redis cluster}
SCALE_EMIT_RATE=${BENCH_SCALING_EMIT_RATE:-20000}
SCALE_ROUNDS=${BENCH_SCALING_ROUNDS:-$ROUNDS}
SCALE_TIMEOUT=${BENCH_SCALING_TIMEOUT:-300}
SCALE_BASE_RELAY=${BENCH_SCALING_BASE_RELAY:-}

ensure_packages postgresql-15-pgq3 gnuplot-nox
build_extension
build_relay pg_outbox_relay pg_outbox_bench
RELAY=build/relay/pg_outbox_relay
TOOL=build/bench/pg_outbox_bench

throwaway_workspace bench
RELAY_PID=
EMIT_PID=
SHARD_PIDS=()
REDIS_CLUSTER_PIDS=()
cleanup() {
	stop_pid "$RELAY_PID"
	stop_shard_relays
	stop_pid "$EMIT_PID"
	redis_cluster_stop
	stop_pid "${MAIN_REDIS_PID:-}"
	stop_servers
	if [ -f "$WORK/pg_xid8/data/postmaster.pid" ]; then
		pg_stop "$(head -n 1 "$WORK/pg_xid8/data/postmaster.pid")"
	fi
	rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "starting PostgreSQL on 127.0.0.1:$PG_PORT and Redis on 127.0.0.1:$REDIS_PORT"
pg_start "$WORK/pg" "$PG_PORT" "shared_buffers = '1GB'" "max_wal_size = '8GB'" "checkpoint_timeout = '30min'" \
	"max_connections = 50" "shared_preload_libraries = 'pg_outbox'"
MAIN_PG_PID=$PG_PID
redis_start "$WORK/redis" "$REDIS_PORT"
MAIN_REDIS_PID=$REDIS_PID
REDIS="127.0.0.1:$REDIS_PORT"

psql_db() {
	local db=$1
	shift
	psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U postgres -d "$db" "$@"
}
conninfo() { echo "host=127.0.0.1 port=$PG_PORT user=postgres dbname=$1"; }
redis() { redis-cli -p "$REDIS_PORT" "$@"; }
now() { date +%s.%N; }
# Rewinds every shard of group $2 of database $1 to the beginning, with
# no stream published to.
rewind_shards() {
	psql_db "$1" -c "SELECT outbox_rewind(name || CASE WHEN shards > 1 THEN '/' || shard ELSE '' END, 'beginning')
		FROM outbox.groups WHERE name = '$2'; UPDATE outbox.groups SET streams = '{}'" >/dev/null
}
# Starts a relay per shard of group $2 ($3 shards) of database $1 into the
# Redis at $4, to streams outbox:{topic}:{shard}: their PIDs in SHARD_PIDS,
# which stop_shard_relays (and the exit) stops.
start_shard_relays() {
	local db=$1 name=$2 n=$3 addr=$4 k group
	SHARD_PIDS=()
	for k in $(seq 0 $((n - 1))); do
		group=$name
		[ "$n" -gt 1 ] && group=$name/$k
		"$RELAY" publish --pg "$(conninfo "$db")" --redis "$addr" --group "$group" --batch-size 1000 \
			--stream 'outbox:{topic}:{shard}' --log-level warn >"$WORK/relay_$k.log" 2>&1 &
		SHARD_PIDS+=($!)
	done
}
stop_shard_relays() {
	local p
	for p in "${SHARD_PIDS[@]}"; do stop_pid "$p"; done
	SHARD_PIDS=()
}
# A quiet start for the next measurement: nothing left for autovacuum to
# clean up behind the previous one, no checkpoint due.
settle() {
	psql_db "$1" -c "VACUUM" -c "CHECKPOINT" >/dev/null
}
wait_streams() { # until the streams hold $1 entries (at most 30 minutes)
	"$TOOL" wait-entries --redis "$REDIS" --count "$1" --timeout 1800 >/dev/null
}
# median, min and max of numbers on stdin: "median (min–max)"
stats() { sort -g | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%.6g (%.6g–%.6g)", m, a[1], a[NR]}'; }
result() { sed -n "s/^RESULT $1 //p"; }
# "pid ticks" for each given process: the CPU time (user and system) it
# has used so far, in clock ticks.
cpu_snapshot() {
	local p
	for p in "$@"; do
		# the fields after the command name, which may hold spaces
		sed 's/^.*) //' "/proc/$p/stat" 2>/dev/null | awk -v p="$p" '{print p, $12 + $13}' || true
	done
}
# CPU seconds used between two snapshots; a process missing from the first
# started in between.
cpu_between() {
	awk -v hz="$(getconf CLK_TCK)" 'NR == FNR {a[$1] = $2; next} {s += $2 - a[$1]} END {printf "%.3f", s / hz}' "$1" "$2"
}
# The main PostgreSQL server's processes: the postmaster and its children.
pg_processes() { echo "$MAIN_PG_PID" $(ps -o pid= --ppid "$MAIN_PG_PID"); }

# Emits $2 events into database $1: 10,000 per transaction, four topics,
# a 16-character key and about 200 bytes of JSON each.
load_events() {
	local db=$1 n=$2
	psql_db "$db" -c "
	DO \$\$
	DECLARE c integer;
	BEGIN
		FOR c IN 0 .. ($n - 1) / 10000 LOOP
			PERFORM count(*) FROM outbox_emit_many('topic' || (c % 4),
				(SELECT array_agg(lpad((c * 10000 + i)::text, 16, '0')) FROM generate_series(1, least(10000, $n - c * 10000)) i),
				(SELECT array_agg(jsonb_build_object('order_id', c * 10000 + i, 'customer', 'customer-000000001',
					'amount', 12345, 'currency', 'EUR', 'status', 'confirmed',
					'note', 'lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor'))
				   FROM generate_series(1, least(10000, $n - c * 10000)) i));
			COMMIT;
		END LOOP;
	END
	\$\$;"
}

TABLE="$WORK/table.md"
: >"$TABLE"
row() { echo "| $* |" >>"$TABLE"; }

# The payload of every workload: about 200 bytes of JSON.
PAYLOAD='{"order_id": 1234567, "customer": "customer-000000001", "amount": 12345, "currency": "EUR", "status": "confirmed", "note": "lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod"}'

if [[ " $ONLY " == *" fetch "* ]]; then
	say "fetch: one call of outbox_fetch by the leader, empty and with a batch of 1000, vs SELECT 1"
	psql_db postgres -c "CREATE DATABASE fetchbench"
	psql_db fetchbench -c "CREATE EXTENSION pg_outbox" \
		-c "SELECT outbox_group_create('full_x', start_at => 'beginning', ordering => 'xid8')" \
		-c "SELECT outbox_group_create('full_c', start_at => 'beginning', ordering => 'commit')" >/dev/null
	load_events fetchbench 1000
	# 'now' is the horizon, which the maintenance run woken by CREATE
	# EXTENSION holds back while it lasts: the empty groups start once the
	# horizon has passed the events.
	psql_db fetchbench -c "DO \$\$ BEGIN
			WHILE outbox.horizon() <= (SELECT max(txid) FROM outbox.event) LOOP PERFORM pg_sleep(0.05); END LOOP;
		END \$\$" \
		-c "SELECT outbox_group_create('empty_x', start_at => 'now', ordering => 'xid8')" \
		-c "SELECT outbox_group_create('empty_c', start_at => 'now', ordering => 'commit')" -c "VACUUM ANALYZE" >/dev/null
	for g in empty_x empty_c full_x full_c; do
		echo "   $g: $(psql_db fetchbench -At -c "SELECT count(*) FROM outbox_fetch('$g', 1000)") events a call"
	done
	# One client, prepared statements: what a relay's backend does per call.
	# A batch fetched without advancing is the same batch again.
	FETCHES=(select1 empty_x empty_c full_x full_c)
	echo "SELECT 1;" >"$WORK/fetch_select1.sql"
	for g in empty_x empty_c full_x full_c; do
		echo "SELECT count(*) FROM outbox_fetch('$g', 1000);" >"$WORK/fetch_$g.sql"
	done
	: >"$WORK/fetch"
	for r in $(seq 1 "$ROUNDS"); do
		line=""
		for f in "${FETCHES[@]}"; do
			tps=$(pgbench -n -M prepared -h 127.0.0.1 -p "$PG_PORT" -U postgres -c 1 -T "$FETCH_SECONDS" \
				-f "$WORK/fetch_$f.sql" fetchbench 2>&1 | sed -n 's/^tps = \([0-9.]*\) .*/\1/p')
			line="$line $(echo "$tps" | awk '{printf "%.4f", 1000 / $1}')"
		done
		echo "$line" >>"$WORK/fetch"
		echo "   round $r: ms per call (${FETCHES[*]}):$line"
	done
	row "fetch: SELECT 1 (ms per call) | $(awk '{print $1}' "$WORK/fetch" | stats) |"
	row "fetch, xid8 order: empty batch (ms per call) | $(awk '{print $2}' "$WORK/fetch" | stats) |"
	row "fetch, commit order: empty batch (ms per call) | $(awk '{print $3}' "$WORK/fetch" | stats) |"
	row "fetch, xid8 order: empty batch / SELECT 1 | $(awk '{print $2 / $1}' "$WORK/fetch" | stats) |"
	row "fetch, commit order: empty batch / SELECT 1 | $(awk '{print $3 / $1}' "$WORK/fetch" | stats) |"
	row "fetch, xid8 order: batch of 1000 (ms per call) | $(awk '{print $4}' "$WORK/fetch" | stats) |"
	row "fetch, commit order: batch of 1000 (ms per call) | $(awk '{print $5}' "$WORK/fetch" | stats) |"
	psql_db postgres -c "DROP DATABASE fetchbench"
fi

if [[ " $ONLY " == *" emit "* ]]; then
	say "emission: pg_outbox vs plain INSERT vs naive status-column outbox vs PgQ; 4 clients, 1 and 100 events a transaction; bulk"
	# A second server, the same but without commit tickets
	# (pg_outbox.commit_order = off): outbox_emit in xid8 order only.
	PG2_PORT=$(free_port)
	pg_start "$WORK/pg_xid8" "$PG2_PORT" "shared_buffers = '1GB'" "max_wal_size = '8GB'" "checkpoint_timeout = '30min'" \
		"max_connections = 50" "shared_preload_libraries = 'pg_outbox'" "pg_outbox.commit_order = off"
	psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG2_PORT" -U postgres -d postgres -c "CREATE DATABASE emit"
	psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG2_PORT" -U postgres -d emit -c "CREATE EXTENSION pg_outbox" -c "
		CREATE TABLE plain_events (id bigserial PRIMARY KEY, topic text, key text, payload jsonb, headers jsonb,
			event_id uuid, created_at timestamptz DEFAULT now());"
	psql_db postgres -c "CREATE DATABASE emit"
	psql_db emit -c "CREATE EXTENSION pg_outbox" -c "CREATE EXTENSION pgq" -c "SELECT pgq.create_queue('emit')" >/dev/null
	psql_db emit -c "
		CREATE TABLE plain_events (id bigserial PRIMARY KEY, topic text, key text, payload jsonb, headers jsonb,
			event_id uuid, created_at timestamptz DEFAULT now());
		CREATE TABLE naive_outbox (id bigserial PRIMARY KEY, topic text, key text, payload jsonb, headers jsonb,
			event_id uuid, created_at timestamptz DEFAULT now(), status text NOT NULL DEFAULT 'new', updated_at timestamptz);
		CREATE INDEX naive_outbox_new ON naive_outbox (id) WHERE status = 'new';"
	declare -A STMT=(
		[plain]="INSERT INTO plain_events (topic, key, payload, event_id) VALUES ('orders', lpad(:k::text, 16, '0'), '$PAYLOAD', gen_random_uuid());"
		[outbox]="SELECT outbox_emit('orders', lpad(:k::text, 16, '0'), '$PAYLOAD');"
		[naive]="INSERT INTO naive_outbox (topic, key, payload, event_id) VALUES ('orders', lpad(:k::text, 16, '0'), '$PAYLOAD', gen_random_uuid());"
		[pgq]="SELECT pgq.insert_event('emit', lpad(:k::text, 16, '0'), '$PAYLOAD');"
	)
	STMT[xplain]=${STMT[plain]}
	STMT[xoutbox]=${STMT[outbox]}
	declare -A BULKSQL=(
		[plain]="INSERT INTO plain_events (topic, key, payload, event_id) SELECT 'orders', lpad(i::text, 16, '0'), '$PAYLOAD', gen_random_uuid() FROM generate_series(1, $BULK) i"
		[outbox]="SELECT count(*) FROM outbox_emit_many('orders', (SELECT array_agg(lpad(i::text, 16, '0')) FROM generate_series(1, $BULK) i), (SELECT array_agg('$PAYLOAD'::jsonb) FROM generate_series(1, $BULK)))"
		[naive]="INSERT INTO naive_outbox (topic, key, payload, event_id) SELECT 'orders', lpad(i::text, 16, '0'), '$PAYLOAD', gen_random_uuid() FROM generate_series(1, $BULK) i"
		[pgq]="SELECT count(pgq.insert_event('emit', lpad(i::text, 16, '0'), '$PAYLOAD')) FROM generate_series(1, $BULK) i"
	)
	BULKSQL[xplain]=${BULKSQL[plain]}
	BULKSQL[xoutbox]=${BULKSQL[outbox]}
	# outbox_emit called once per row by set-based SQL
	BULKSQL[outbox_row]="SELECT count(outbox_emit('orders', lpad(i::text, 16, '0'), '$PAYLOAD')) FROM generate_series(1, $BULK) i"
	# What each stores, indexes included, after a bulk emit (bytes).
	tree_size() { echo "(SELECT coalesce(sum(pg_total_relation_size(relid)), 0) FROM pg_partition_tree('$1') WHERE isleaf)"; }
	declare -A SIZESQL=(
		[plain]="SELECT pg_total_relation_size('plain_events')"
		[outbox]="SELECT $(tree_size outbox.event) + $(tree_size outbox.commit_log)"
		[naive]="SELECT pg_total_relation_size('naive_outbox')"
		[pgq]="WITH RECURSIVE t(oid) AS (SELECT 'pgq.event_template'::regclass::oid
			UNION SELECT i.inhrelid FROM pg_inherits i JOIN t ON i.inhparent = t.oid)
			SELECT sum(pg_total_relation_size(oid)) FROM t"
	)
	SIZESQL[outbox_row]=${SIZESQL[outbox]}
	# Variants whose name starts with x run on the server without tickets.
	VARIANTS=(plain outbox naive pgq xplain xoutbox)
	BULK_VARIANTS=("${VARIANTS[@]}" outbox_row)
	port_of() { if [[ $1 == x* ]]; then echo "$PG2_PORT"; else echo "$PG_PORT"; fi; }
	reset_tables() {
		psql_db emit -c "TRUNCATE plain_events, naive_outbox, outbox.event, outbox.commit_log" -c "SELECT pgq.drop_queue('emit', true)" -c "SELECT pgq.create_queue('emit')" -c "CHECKPOINT" >/dev/null
		psql -X -q -h 127.0.0.1 -p "$PG2_PORT" -U postgres -d emit -c "TRUNCATE plain_events, outbox.event" -c "CHECKPOINT" >/dev/null
	}
	for v in "${VARIANTS[@]}"; do
		{ echo '\set k random(1, 100000000)'; echo "${STMT[$v]}"; } >"$WORK/emit1_$v.sql"
		{ echo '\set k random(1, 100000000)'; echo 'BEGIN;'; for i in $(seq 1 100); do echo "${STMT[$v]}"; done; echo 'COMMIT;'; } >"$WORK/emit100_$v.sql"
	done
	: >"$WORK/emit"
	for r in $(seq 1 "$ROUNDS"); do
		line=""
		# Each variant runs twice for half the time, the list forward and
		# then backward, so that a machine whose speed drifts during the
		# round favours no variant over another: a ratio of two variants
		# is taken between runs centred on the same moment.
		half=$(((EMIT_SECONDS + 1) / 2))
		for shape in 1 100; do
			declare -A SUM=()
			for v in "${VARIANTS[@]}" $(printf '%s\n' "${VARIANTS[@]}" | tac); do
				reset_tables
				tps=$(pgbench -n -M prepared -h 127.0.0.1 -p "$(port_of "$v")" -U postgres -c 4 -j 2 -T "$half" \
					-f "$WORK/emit${shape}_$v.sql" emit 2>&1 | sed -n 's/^tps = \([0-9.]*\) .*/\1/p')
				SUM[$v]=$(echo "${SUM[$v]:-0} ${tps:-0}" | awk '{print $1 + $2}')
			done
			for v in "${VARIANTS[@]}"; do
				line="$line $(echo "${SUM[$v]} $shape" | awk '{printf "%.0f", $1 / 2 * $2}')"
			done
			unset SUM
		done
		sizes=""
		for v in "${BULK_VARIANTS[@]}"; do
			reset_tables
			t0=$(now)
			psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$(port_of "$v")" -U postgres -d emit -c "${BULKSQL[$v]}" >/dev/null
			t1=$(now)
			line="$line $(echo "$BULK $t0 $t1" | awk '{printf "%.0f", $1 / ($3 - $2)}')"
			if [ -n "${SIZESQL[$v]:-}" ]; then
				sizes="$sizes $(psql_db emit -At -c "${SIZESQL[$v]}" | awk -v n="$BULK" '{printf "%.1f", $1 / n}')"
			fi
		done
		echo "$line$sizes" >>"$WORK/emit"
		echo "   round $r: events/s (1/tx: ${VARIANTS[*]}; 100/tx: same; bulk: ${BULK_VARIANTS[*]}):$line"
		echo "   bytes per event after a bulk emit, indexes included (plain outbox_emit_many naive pgq outbox_emit):$sizes"
	done
	i=0
	for shape in "1 event a transaction, 4 clients" "100 events a transaction, 4 clients" "bulk, one session, $BULK events"; do
		p=$((i * 6 + 1))
		row "emit, $shape: plain INSERT (events/s) | $(awk -v c=$p '{print $c}' "$WORK/emit" | stats) |"
		row "emit, $shape: outbox_emit$([ $i = 2 ] && echo _many) (events/s) | $(awk -v c=$((p + 1)) '{print $c}' "$WORK/emit" | stats) |"
		row "emit, $shape: naive status-column outbox (events/s) | $(awk -v c=$((p + 2)) '{print $c}' "$WORK/emit" | stats) |"
		row "emit, $shape: PgQ insert_event (events/s) | $(awk -v c=$((p + 3)) '{print $c}' "$WORK/emit" | stats) |"
		row "emit, $shape: cost of outbox_emit / plain INSERT | $(awk -v c=$p '{print $c / $(c + 1)}' "$WORK/emit" | stats) | ≤ 1.15"
		row "emit, $shape: cost of PgQ / plain INSERT | $(awk -v c=$p '{print $c / $(c + 3)}' "$WORK/emit" | stats) |"
		row "emit, $shape: without commit tickets: plain INSERT (events/s) | $(awk -v c=$((p + 4)) '{print $c}' "$WORK/emit" | stats) |"
		row "emit, $shape: without commit tickets: outbox_emit$([ $i = 2 ] && echo _many) (events/s) | $(awk -v c=$((p + 5)) '{print $c}' "$WORK/emit" | stats) |"
		row "emit, $shape: cost of outbox_emit / plain INSERT without commit tickets (xid8 order only) | $(awk -v c=$p '{print $(c + 4) / $(c + 5)}' "$WORK/emit" | stats) |"
		row "emit, $shape: cost of commit tickets: outbox_emit without / with | $(awk -v c=$p '{print $(c + 5) / $(c + 1)}' "$WORK/emit" | stats) |"
		i=$((i + 1))
	done
	# column 19: outbox_emit per row in set-based SQL; 20-24: bytes per event
	row "emit, bulk, one session, $BULK events: outbox_emit once per row, set-based SQL (events/s) | $(awk '{print $19}' "$WORK/emit" | stats) |"
	row "emit, bulk, one session: outbox_emit once per row / plain INSERT | $(awk '{print $19 / $13}' "$WORK/emit" | stats) | ≥ 0.95"
	row "emit, bulk, one session: outbox_emit_many / plain INSERT | $(awk '{print $14 / $13}' "$WORK/emit" | stats) | ≥ 0.95"
	row "emit, 1 event a transaction, 4 clients: outbox_emit / plain INSERT | $(awk '{print $2 / $1}' "$WORK/emit" | stats) | ≥ 0.97"
	c=20
	for what in "plain INSERT" "pg_outbox (outbox_emit_many)" "naive status-column outbox" "PgQ" "pg_outbox (outbox_emit per row)"; do
		row "stored bytes per event after a bulk emit, indexes included: $what | $(awk -v c=$c '{print $c}' "$WORK/emit" | stats) |"
		c=$((c + 1))
	done
	psql_db postgres -c "DROP DATABASE emit"
	pg_stop "$(head -n 1 "$WORK/pg_xid8/data/postmaster.pid")"
fi

if [[ " $ONLY " == *" drain "* ]]; then
	say "drain: $EVENTS waiting events, $ROUNDS rounds"
	psql_db postgres -c "CREATE DATABASE drain"
	psql_db drain -c "CREATE EXTENSION pg_outbox" \
		-c "SELECT outbox_group_create('drain', start_at => 'beginning', ordering => 'xid8')" \
		-c "SELECT outbox_group_create('drain_commit', start_at => 'beginning', ordering => 'commit')" >/dev/null
	load_events drain "$EVENTS"
	# PgQ: the same events in a queue, a tick every 1000 (batches as large
	# as the others'), one consumer per round.
	psql_db drain -c "CREATE EXTENSION pgq" -c "SELECT pgq.create_queue('bench')" >/dev/null
	for r in $(seq 1 "$ROUNDS"); do psql_db drain -c "SELECT pgq.register_consumer('bench', 'round$r')" >/dev/null; done
	psql_db drain -c "CREATE TABLE pgq_source AS SELECT row_number() OVER (ORDER BY txid, seq) AS n, key, payload::text AS payload FROM outbox.event" \
		-c "CREATE INDEX ON pgq_source (n)"
	psql_db drain -c "
	DO \$\$
	DECLARE
		tick bigint;
	BEGIN
		FOR c IN 0 .. ($EVENTS - 1) / 1000 LOOP
			PERFORM pgq.insert_event('bench', s.key, s.payload)
			   FROM pgq_source s WHERE s.n > c * 1000 AND s.n <= (c + 1) * 1000 ORDER BY s.n;
			COMMIT;
			-- A tick after each 1000: what pgqd does on a busy queue.
			tick := pgq.ticker('bench');
			COMMIT;
		END LOOP;
	END
	\$\$" -c "DROP TABLE pgq_source"
	psql_db drain -c "
		CREATE TABLE naive_template AS
			SELECT row_number() OVER (ORDER BY txid, seq) AS id, event_id, topic, key, payload, headers, created_at
			  FROM outbox.event;
		CREATE TABLE naive_outbox (id bigint PRIMARY KEY, event_id uuid, topic text, key text, payload jsonb,
			headers jsonb, created_at timestamptz, status text NOT NULL DEFAULT 'new', updated_at timestamptz);
		CREATE INDEX naive_outbox_new ON naive_outbox (id) WHERE status = 'new';" -c "VACUUM ANALYZE"
	# Drains group $1 from the beginning with pg_outbox_relay. Sets
	# DRAIN_EPS (events/s), DRAIN_RSS (the relay's peak, kB) and DRAIN_CPU:
	# CPU microseconds per event of PostgreSQL (all its processes), the
	# relay and Redis, while the relay ran.
	drain_relay() {
		redis flushall >/dev/null
		psql_db drain -c "SELECT outbox_rewind('$1', 'beginning'); UPDATE outbox.groups SET streams = '{}'" >/dev/null
		settle drain
		cpu_snapshot $(pg_processes) "$REDIS_PID" >"$WORK/cpu0"
		t0=$(now)
		"$RELAY" publish --pg "$(conninfo drain)" --redis "$REDIS" --group "$1" --batch-size 1000 \
			--log-level warn >"$WORK/relay.log" 2>&1 &
		RELAY_PID=$!
		wait_streams "$EVENTS"
		t1=$(now)
		cpu_snapshot $(pg_processes) >"$WORK/cpu1_pg"
		cpu_snapshot "$REDIS_PID" >"$WORK/cpu1_redis"
		cpu_snapshot "$RELAY_PID" >"$WORK/cpu1_relay"
		DRAIN_RSS=$(awk '/VmHWM/ {print $2}' "/proc/$RELAY_PID/status")
		stop_pid "$RELAY_PID"
		RELAY_PID=
		DRAIN_EPS=$(echo "$EVENTS $t0 $t1" | awk '{printf "%.0f", $1 / ($3 - $2)}')
		DRAIN_CPU=""
		for part in pg relay redis; do
			DRAIN_CPU="$DRAIN_CPU $(cpu_between "$WORK/cpu0" "$WORK/cpu1_$part" | awk -v n="$EVENTS" '{printf "%.2f", $1 * 1e6 / n}')"
		done
	}
	: >"$WORK/drain"
	for r in $(seq 1 "$ROUNDS"); do
		# The ceiling between the two orders, so that each ratio is to a
		# ceiling measured right beside it: this machine's speed drifts.
		drain_relay drain
		relay_eps=$DRAIN_EPS rss=$DRAIN_RSS xid8_cpu=$DRAIN_CPU
		# the ceiling: bare pipelined XADD of the same entries
		redis flushall >/dev/null
		settle drain
		cpu_snapshot "$REDIS_PID" >"$WORK/cpu0"
		ceiling_eps=$("$TOOL" xadd-ceiling --pg "$(conninfo drain)" --redis "$REDIS" | result events_per_second)
		cpu_snapshot "$REDIS_PID" >"$WORK/cpu1_redis"
		ceiling_cpu=$(cpu_between "$WORK/cpu0" "$WORK/cpu1_redis" | awk -v n="$EVENTS" '{printf "%.2f", $1 * 1e6 / n}')
		drain_relay drain_commit
		commit_eps=$DRAIN_EPS commit_cpu=$DRAIN_CPU
		# the naive status-column relay
		redis flushall >/dev/null
		psql_db drain -c "TRUNCATE naive_outbox; INSERT INTO naive_outbox (id, event_id, topic, key, payload, headers, created_at)
			SELECT * FROM naive_template" -c "ANALYZE naive_outbox" >/dev/null
		settle drain
		naive_eps=$("$TOOL" naive-relay --pg "$(conninfo drain)" --redis "$REDIS" | result events_per_second)
		redis flushall >/dev/null
		settle drain
		pgq_eps=$("$TOOL" pgq-relay --pg "$(conninfo drain)" --redis "$REDIS" --consumer "round$r" | result events_per_second)
		echo "$relay_eps $ceiling_eps $naive_eps $rss $pgq_eps $commit_eps$xid8_cpu$commit_cpu $ceiling_cpu" >>"$WORK/drain"
		echo "   round $r: relay $relay_eps/s (commit order $commit_eps/s), XADD ceiling $ceiling_eps/s, naive relay $naive_eps/s, PgQ consumer $pgq_eps/s, relay peak RSS ${rss} kB"
		echo "   CPU µs per event (PostgreSQL, relay, Redis): xid8 order$xid8_cpu; commit order$commit_cpu; Redis under the bare XADD $ceiling_cpu"
	done
	redis flushall >/dev/null
	row "drain $EVENTS events: pg_outbox_relay, xid8 order (events/s) | $(awk '{print $1}' "$WORK/drain" | stats) |"
	row "drain: pg_outbox_relay, commit order (events/s) | $(awk '{print $6}' "$WORK/drain" | stats) |"
	row "drain: bare pipelined XADD, the ceiling (events/s) | $(awk '{print $2}' "$WORK/drain" | stats) |"
	row "drain: naive status-column relay (events/s) | $(awk '{print $3}' "$WORK/drain" | stats) |"
	row "drain: PgQ consumer, batches of 1000 (events/s) | $(awk '{print $5}' "$WORK/drain" | stats) |"
	row "drain: relay / ceiling | $(awk '{print $1 / $2}' "$WORK/drain" | stats) | ≥ 0.9"
	row "drain: relay / naive | $(awk '{print $1 / $3}' "$WORK/drain" | stats) | ≥ 3"
	row "drain: relay / PgQ consumer | $(awk '{print $1 / $5}' "$WORK/drain" | stats) |"
	row "drain: relay in commit order / ceiling | $(awk '{print $6 / $2}' "$WORK/drain" | stats) | ≥ 0.9"
	c=7
	for order in xid8 commit; do
		for part in "PostgreSQL (all processes)" "pg_outbox_relay" "Redis"; do
			row "drain, $order order: CPU of $part per event (µs) | $(awk -v c=$c '{print $c}' "$WORK/drain" | stats) |"
			c=$((c + 1))
		done
	done
	row "drain: CPU of Redis per event under the bare pipelined XADD (µs) | $(awk '{print $13}' "$WORK/drain" | stats) |"
	row "drain: relay in commit order / in xid8 order | $(awk '{print $6 / $1}' "$WORK/drain" | stats) |"
	row "relay peak RSS during drain (MB) | $(awk '{print $4 / 1024}' "$WORK/drain" | stats) | < 64"
	psql_db postgres -c "DROP DATABASE drain"
fi

if [[ " $ONLY " == *" shards "* ]]; then
	say "shards: $EVENTS waiting events drained by one relay per shard (1, 2, 4) into one Redis; rows read per batch with 1, 4, 16 shards"
	psql_db postgres -c "CREATE DATABASE shards"
	psql_db shards -c "CREATE EXTENSION pg_outbox" >/dev/null
	for n in 1 2 4 16; do
		psql_db shards -c "SELECT outbox_group_create('d$n', start_at => 'beginning', ordering => 'xid8', shards => $n)" >/dev/null
	done
	load_events shards "$EVENTS"
	psql_db shards -c "VACUUM ANALYZE outbox.event" >/dev/null
	# Heap rows a batch of shard 0 reads (index scans of this transaction)
	# and its time, with the cursor at the start of a backlog of $EVENTS.
	psql_db shards -c "
	CREATE FUNCTION batch_reads(g text, OUT events bigint, OUT rows_read bigint, OUT ms numeric) LANGUAGE plpgsql AS \$\$
	DECLARE
		before bigint;
		t0 timestamptz;
	BEGIN
		SELECT coalesce(sum(idx_tup_fetch), 0) INTO before FROM pg_stat_xact_user_tables
		 WHERE relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'outbox.event'::regclass);
		t0 := clock_timestamp();
		SELECT count(*) INTO events FROM outbox_fetch(g, 1000);
		ms := round((extract(epoch FROM clock_timestamp() - t0) * 1000)::numeric, 3);
		SELECT coalesce(sum(idx_tup_fetch), 0) - before INTO rows_read FROM pg_stat_xact_user_tables
		 WHERE relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'outbox.event'::regclass);
	END
	\$\$"
	: >"$WORK/shards_reads"
	for r in $(seq 1 "$ROUNDS"); do
		line=""
		for g in d1 d4/0 d16/0; do
			line="$line $(psql_db shards -At -F ' ' -c "SELECT events, rows_read, ms FROM batch_reads('$g')")"
		done
		echo "$line" >>"$WORK/shards_reads"
		echo "   round $r: events, rows read, ms of one batch (1, 4, 16 shards):$line"
	done
	# Drains group dN with a relay per shard, in parallel: events/s, and
	# CPU microseconds per event of PostgreSQL, the relays and Redis.
	: >"$WORK/shards_drain"
	for r in $(seq 1 "$ROUNDS"); do
		line=""
		for n in 1 2 4; do
			redis flushall >/dev/null
			rewind_shards shards "d$n"
			settle shards
			cpu_snapshot $(pg_processes) "$REDIS_PID" >"$WORK/cpu0"
			t0=$(now)
			start_shard_relays shards "d$n" "$n" "$REDIS"
			wait_streams "$EVENTS"
			t1=$(now)
			cpu_snapshot $(pg_processes) >"$WORK/cpu1_pg"
			cpu_snapshot "$REDIS_PID" >"$WORK/cpu1_redis"
			cpu_snapshot "${SHARD_PIDS[@]}" >"$WORK/cpu1_relay"
			stop_shard_relays
			line="$line $(echo "$EVENTS $t0 $t1" | awk '{printf "%.0f", $1 / ($3 - $2)}')"
			for part in pg relay redis; do
				line="$line $(cpu_between "$WORK/cpu0" "$WORK/cpu1_$part" | awk -v n="$EVENTS" '{printf "%.2f", $1 * 1e6 / n}')"
			done
		done
		echo "$line" >>"$WORK/shards_drain"
		echo "   round $r: events/s and CPU µs per event (PostgreSQL, relays, Redis) with 1, 2, 4 shards:$line"
	done
	redis flushall >/dev/null
	c=2
	for n in 1 4 16; do
		row "shards: one batch of 1000 at a $EVENTS-event backlog, $n shard(s): heap rows read | $(awk -v c=$c '{print $c}' "$WORK/shards_reads" | stats) | ≤ 1000"
		row "shards: one batch, $n shard(s) (ms) | $(awk -v c=$((c + 1)) '{print $c}' "$WORK/shards_reads" | stats) |"
		c=$((c + 3))
	done
	c=1
	for n in 1 2 4; do
		row "shards: drain $EVENTS events with $n relay(s), one per shard, one Redis (events/s) | $(awk -v c=$c '{print $c}' "$WORK/shards_drain" | stats) |"
		row "shards: drain with $n shard(s) / with 1 | $(awk -v c=$c '{print $c / $1}' "$WORK/shards_drain" | stats) |"
		row "shards, $n shard(s): CPU per event of PostgreSQL, relays, Redis (µs) | $(awk -v c=$((c + 1)) '{print $c}' "$WORK/shards_drain" | stats), $(awk -v c=$((c + 2)) '{print $c}' "$WORK/shards_drain" | stats), $(awk -v c=$((c + 3)) '{print $c}' "$WORK/shards_drain" | stats) |"
		c=$((c + 4))
	done
	psql_db postgres -c "DROP DATABASE shards"
fi

if [[ " $ONLY " == *" scaling "* ]]; then
	say "scaling: a $SCALE_EVENTS-event backlog drained by one relay per shard ($SCALE_SHARDS shards) into one Redis and a Redis Cluster of 3 masters, emitters stopped and at $SCALE_EMIT_RATE events/s"
	# (redis_cluster_start leaves REDIS_PID empty: the workspace's Redis
	# is still MAIN_REDIS_PID)
	redis_cluster_start "$WORK/cluster" 3 0
	REDIS_PID=$MAIN_REDIS_PID
	CLUSTER_NODES=()
	for p in "${REDIS_CLUSTER_PORTS[@]}"; do CLUSTER_NODES+=("127.0.0.1:$p"); done
	psql_db postgres -c "CREATE DATABASE scaling"
	psql_db scaling -c "CREATE EXTENSION pg_outbox" >/dev/null
	for n in $SCALE_SHARDS; do
		psql_db scaling -c "SELECT outbox_group_create('s$n', start_at => 'beginning', ordering => 'xid8', shards => $n)" >/dev/null
	done
	load_events scaling "$SCALE_EVENTS"
	psql_db scaling -c "VACUUM ANALYZE outbox.event" >/dev/null
	# The emitters: transactions of 10 events of one of four topics, random
	# keys (so every shard gets its share), at a fixed rate.
	echo "\\set t random(0, 3)
\\set k random(1, 100000000)
SELECT count(*) FROM outbox_emit_many('topic' || :t,
	(SELECT array_agg(lpad((:k + i)::text, 16, '0')) FROM generate_series(1, 10) i),
	(SELECT array_agg('$PAYLOAD'::jsonb) FROM generate_series(1, 10)));" >"$WORK/scaling_emit.sql"
	# Drains $SCALE_EVENTS entries of group s$3 into target $1 (redis or
	# cluster), emitters $2 (stopped or running). Prints the drain's
	# events/s, the emit rate while it ran (events/s, 0 when stopped), and
	# CPU microseconds per drained event of the relays' PostgreSQL backends,
	# of PostgreSQL (all its processes), of the relays and of the Redis
	# server(s).
	scaling_point() {
		local target=$1 state=$2 n=$3 addr nodes redis_pids p x0 t0 t1 emitted backends RELAY=$RELAY
		if [ "$target" = cluster-base ]; then
			RELAY=${SCALE_BASE_RELAY:?the cluster-base target needs BENCH_SCALING_BASE_RELAY}
		fi
		if [ "$target" != redis ]; then
			addr=$REDIS_CLUSTER_URL nodes=("${CLUSTER_NODES[@]}") redis_pids=("${REDIS_CLUSTER_PIDS[@]}")
		else
			addr=$REDIS nodes=("$REDIS") redis_pids=("$REDIS_PID")
		fi
		for p in "${nodes[@]}"; do redis-cli -p "${p##*:}" flushall >/dev/null; done
		rewind_shards scaling "s$n"
		settle scaling
		if [ "$state" = running ]; then
			pgbench -n -M prepared -h 127.0.0.1 -p "$PG_PORT" -U postgres -c 2 -j 1 -R $((SCALE_EMIT_RATE / 10)) \
				-T "$SCALE_TIMEOUT" -f "$WORK/scaling_emit.sql" scaling >"$WORK/scaling_pgbench.out" 2>&1 &
			EMIT_PID=$!
			sleep 1 # a steady load before the relays start
		fi
		x0=$(psql_db scaling -At -c "SELECT pg_current_xact_id()")
		cpu_snapshot $(pg_processes) "${redis_pids[@]}" >"$WORK/cpu0"
		t0=$(now)
		start_shard_relays scaling "s$n" "$n" "$addr"
		"$TOOL" wait-entries $(printf -- '--redis %s ' "${nodes[@]}") --count "$SCALE_EVENTS" --timeout "$SCALE_TIMEOUT" >/dev/null
		t1=$(now)
		# the relays' backends first, so that every snapshot below is
		# taken at the same moment
		backends=$(psql_db scaling -At -c "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'pg_outbox_relay%'")
		cpu_snapshot $(pg_processes) >"$WORK/cpu1_pg"
		cpu_snapshot $backends >"$WORK/cpu1_pgrelay"
		cpu_snapshot "${redis_pids[@]}" >"$WORK/cpu1_redis"
		cpu_snapshot "${SHARD_PIDS[@]}" >"$WORK/cpu1_relay"
		emitted=0
		if [ "$state" = running ]; then
			emitted=$(psql_db scaling -At -c "SELECT count(*) FROM outbox.event WHERE txid > '$x0'")
			stop_pid "$EMIT_PID"
			EMIT_PID=
		fi
		stop_shard_relays
		echo "$SCALE_EVENTS $t0 $t1 $emitted" | awk '{printf "%.0f %.0f", $1 / ($3 - $2), $4 / ($3 - $2)}'
		for part in pgrelay pg relay redis; do
			cpu_between "$WORK/cpu0" "$WORK/cpu1_$part" | awk -v n="$SCALE_EVENTS" '{printf " %.2f", $1 * 1e6 / n}'
		done
		echo
	}
	for target in $SCALE_TARGETS; do
		for state in stopped running; do
			for n in $SCALE_SHARDS; do : >"$WORK/scaling_${target}_${state}_$n"; done
		done
	done
	for r in $(seq 1 "$SCALE_ROUNDS"); do
		for target in $SCALE_TARGETS; do
			for state in stopped running; do
				for n in $SCALE_SHARDS; do
					scaling_point "$target" "$state" "$n" >>"$WORK/scaling_${target}_${state}_$n"
					echo "   round $r, $target, emitters $state, $n shard(s): events/s, emitted/s, CPU µs per event (PostgreSQL relay backends, PostgreSQL all, relays, Redis): $(tail -n 1 "$WORK/scaling_${target}_${state}_$n")"
				done
			done
		done
	done
	# Rows, and the chart's data: one block per target and emitter state,
	# "shards median min max" of the drain's events/s.
	: >"$WORK/scaling.dat"
	first=$(echo "$SCALE_SHARDS" | awk '{print $1}')
	for target in $SCALE_TARGETS; do
		tname="one Redis"
		[ "$target" = cluster ] && tname="Redis Cluster, 3 masters, no replicas"
		[ "$target" = cluster-base ] && tname="Redis Cluster, 3 masters, no replicas, relay $SCALE_BASE_RELAY"
		for state in stopped running; do
			sname="emitters stopped"
			[ "$state" = running ] && sname="emitters at $SCALE_EMIT_RATE events/s"
			echo "# $tname, $sname" >>"$WORK/scaling.dat"
			for n in $SCALE_SHARDS; do
				f=$WORK/scaling_${target}_${state}_$n
				row "scaling, $tname, $sname, $n shard(s): drain (events/s) | $(awk '{print $1}' "$f" | stats) |"
				# round by round, against the first shard count of the same target and state
				row "scaling, $tname, $sname, $n shard(s) / $first shard(s) | $(paste -d ' ' "$f" "$WORK/scaling_${target}_${state}_$first" | awk '{print $1 / $7}' | stats) |"
				if [ "$state" = running ]; then
					row "scaling, $tname, $sname, $n shard(s): emitted while draining (events/s) | $(awk '{print $2}' "$f" | stats) |"
				fi
				row "scaling, $tname, $sname, $n shard(s): CPU per drained event of PostgreSQL (the relays' backends; all its processes), relays, Redis (µs) | $(awk '{print $3}' "$f" | stats); $(awk '{print $4}' "$f" | stats), $(awk '{print $5}' "$f" | stats), $(awk '{print $6}' "$f" | stats) |"
				echo "$n $(awk '{print $1}' "$f" | sort -g | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; print m, a[1], a[NR]}')" >>"$WORK/scaling.dat"
			done
			printf '\n\n' >>"$WORK/scaling.dat"
		done
	done
	for p in "${CLUSTER_NODES[@]}"; do redis-cli -p "${p##*:}" flushall >/dev/null; done
	redis flushall >/dev/null
	redis_cluster_stop
	psql_db postgres -c "DROP DATABASE scaling"
fi

if [[ " $ONLY " == *" latency "* ]]; then
	say "latency: $RATES transactions/s for ${SECONDS_LAT}s each, woken by commits vs polling every 100ms"
	psql_db postgres -c "CREATE DATABASE lat"
	psql_db lat -c "CREATE EXTENSION pg_outbox" -c "SELECT outbox_group_create('lat', ordering => 'commit')" \
		-c "SELECT outbox_group_create('lat_xid8', ordering => 'xid8')" >/dev/null
	echo "SELECT outbox_emit('lat', 'k' || :client_id, jsonb_build_object('t', extract(epoch FROM clock_timestamp())));" \
		>"$WORK/lat.sql"
	for rate in $RATES; do
		for mode in listen poll xid8; do : >"$WORK/lat_${mode}_$rate" >"$WORK/latdist_${mode}_$rate"; done
	done
	for r in $(seq 1 "$ROUNDS"); do
		for rate in $RATES; do
			count=$((rate * SECONDS_LAT * 95 / 100))
			for mode in listen poll xid8; do
				redis flushall >/dev/null
				group=lat
				[ "$mode" = xid8 ] && group=lat_xid8
				psql_db lat -c "SELECT outbox_rewind('$group', 'now'); UPDATE outbox.groups SET streams = '{}'" >/dev/null
				flags=(--poll-interval 500ms)
				[ "$mode" = poll ] && flags=(--no-listen --poll-interval 100ms)
				"$RELAY" publish --pg "$(conninfo lat)" --redis "$REDIS" --group "$group" --log-level warn "${flags[@]}" \
					>"$WORK/relay.log" 2>&1 &
				RELAY_PID=$!
				sleep 1
				"$TOOL" latency --redis "$REDIS" --stream outbox:lat --count "$count" --timeout $((SECONDS_LAT + 30)) \
					--samples "$WORK/lat_samples" >"$WORK/lat.out" &
				probe=$!
				sleep 0.5
				pgbench -n -h 127.0.0.1 -p "$PG_PORT" -U postgres -c 4 -j 2 -R "$rate" -T "$SECONDS_LAT" -f "$WORK/lat.sql" lat \
					>"$WORK/pgbench.out" 2>&1
				wait "$probe" || true
				# every round's latencies, pooled, for the chart
				cat "$WORK/lat_samples" >>"$WORK/latdist_${mode}_$rate" 2>/dev/null || true
				stop_pid "$RELAY_PID"
				RELAY_PID=
				echo "$(result p50_ms <"$WORK/lat.out") $(result p99_ms <"$WORK/lat.out") $(result p999_ms <"$WORK/lat.out") $(result max_ms <"$WORK/lat.out")" \
					>>"$WORK/lat_${mode}_$rate"
				echo "   round $r, $rate tx/s, $mode: p50/p99/p99.9/max ms: $(tail -n 1 "$WORK/lat_${mode}_$rate")"
			done
		done
	done
	for rate in $RATES; do
		for mode in listen poll xid8; do
			label="commit order, woken by commits"
			[ "$mode" = poll ] && label="commit order, polling every 100ms"
			[ "$mode" = xid8 ] && label="xid8 order, woken by commits"
			# Targets, woken by commits: p99 < 5 ms; at 2,000 tx/s also
			# p99.9 < 10 ms and a maximum < 50 ms.
			woken=
			if [ "$mode" != poll ]; then woken=yes; fi
			row "latency at $rate tx/s, $label: commit to stream p50 (ms) | $(awk '{print $1}' "$WORK/lat_${mode}_$rate" | stats) |"
			row "latency at $rate tx/s, $label: p99 (ms) | $(awk '{print $2}' "$WORK/lat_${mode}_$rate" | stats) | $([ -n "$woken" ] && echo '< 5')"
			row "latency at $rate tx/s, $label: p99.9 (ms) | $(awk '{print $3}' "$WORK/lat_${mode}_$rate" | stats) | $([ -n "$woken" ] && [ "$rate" = 2000 ] && echo '< 10')"
			row "latency at $rate tx/s, $label: max (ms) | $(awk '{print $4}' "$WORK/lat_${mode}_$rate" | stats) | $([ -n "$woken" ] && [ "$rate" = 2000 ] && echo '< 50')"
		done
	done
	# Each round's figures, woken by commits.
	for rate in $RATES; do
		for mode in listen xid8; do
			label="commit order"
			[ "$mode" = xid8 ] && label="xid8 order"
			r=0
			while read -r p50 p99 p999 max; do
				r=$((r + 1))
				row "latency at $rate tx/s, $label, round $r: p50 / p99 / p99.9 / max (ms) | $p50 / $p99 / $p999 / $max |"
			done <"$WORK/lat_${mode}_$rate"
		done
	done
	psql_db postgres -c "DROP DATABASE lat"
fi

if [[ " $ONLY " == *" coldstart "* ]]; then
	say "cold start: relay started on empty partitions, then a burst of $BURST events"
	: >"$WORK/cold"
	for r in $(seq 1 "$ROUNDS"); do
		redis flushall >/dev/null
		psql_db postgres -c "DROP DATABASE IF EXISTS cold" -c "CREATE DATABASE cold"
		psql_db cold -c "CREATE EXTENSION pg_outbox" -c "SELECT outbox_group_create('cold', start_at => 'beginning', ordering => 'commit')" >/dev/null
		"$RELAY" publish --pg "$(conninfo cold)" --redis "$REDIS" --group cold --log-level warn \
			>"$WORK/relay.log" 2>&1 &
		RELAY_PID=$!
		sleep 2 # the relay polls the empty table for a while
		load_events cold "$BURST"
		t_commit=$(now)
		wait_streams "$BURST"
		t_done=$(now)
		stop_pid "$RELAY_PID"
		RELAY_PID=
		echo "$t_commit $t_done" | awk '{printf "%.3f\n", $2 - $1}' >>"$WORK/cold"
		echo "   round $r: last commit to last XADD $(tail -n 1 "$WORK/cold") s"
	done
	row "cold start, commit order: last commit to last XADD of a $BURST-event burst (s) | $(stats <"$WORK/cold") | < 2"
	psql_db postgres -c "DROP DATABASE cold"
fi

if [[ " $ONLY " == *" consume "* ]]; then
	say "consume: $CONSUME entries a round, batches of $CONSUME_BATCHES and $CONSUME_WORKERS worker(s): pg_outbox_relay consume vs a hand-written consumer (handler per entry, and set-based) vs the bare XREADGROUP + XACK loop; latency at $CONSUME_RATES tx/s; pgbench -S beside each"
	redis flushall >/dev/null
	psql_db postgres -c "CREATE DATABASE src" -c "CREATE DATABASE sink" -c "CREATE DATABASE pgb"
	# One outbox, published twice: group "one" into the stream one:c (the
	# batch rows) and group "four", 4 shards, into four:c:0 to four:c:3 (the
	# worker rows); "live" for the rounds that emit as they consume.
	psql_db src -c "CREATE EXTENSION pg_outbox" -c "SELECT outbox_group_create('one', start_at => 'beginning')" \
		-c "SELECT outbox_group_create('four', start_at => 'beginning', shards => 4)" \
		-c "SELECT outbox_group_create('live', ordering => 'commit')" >/dev/null
	# The consumer's side: the inbox consumer of pg_outbox_relay consume,
	# the hand-written consumer's dedupe table, and the projection both
	# apply to with the same one-row handler. applied_at is the moment of
	# the handler, tx_at the start of its transaction.
	psql_db sink -c "CREATE EXTENSION pg_outbox" -c "SELECT inbox_consumer_create('bench', current_user::regrole)" \
		-c "CREATE TABLE bench_dedupe (event_id uuid PRIMARY KEY)" \
		-c "CREATE TABLE bench_applied (event_id uuid PRIMARY KEY, topic text NOT NULL, body jsonb NOT NULL,
			tx_at timestamptz NOT NULL DEFAULT now(), applied_at timestamptz NOT NULL DEFAULT clock_timestamp())" >/dev/null
	HANDLER='INSERT INTO bench_applied (event_id, topic, body) VALUES ($5, $1, $3)'
	# The hand-written consumer's set-based variant: the dedupe insert and
	# the same handler's effect in one statement a batch, over arrays of
	# the batch's fields in the stream's order.
	SET_SQL='WITH b AS (SELECT * FROM unnest($1, $2, $3, $4, $5) WITH ORDINALITY AS b (event_id, topic, key, payload, headers, n)),
		fresh AS (INSERT INTO bench_dedupe (event_id) SELECT event_id FROM b ON CONFLICT DO NOTHING RETURNING event_id)
		INSERT INTO bench_applied (event_id, topic, body) SELECT b.event_id, b.topic, b.payload FROM b JOIN fresh USING (event_id) ORDER BY b.n'
	psql_db src -c "SELECT count(*) FROM outbox_emit_many('c',
		(SELECT array_agg(lpad(i::text, 16, '0')) FROM generate_series(1, $CONSUME) i),
		(SELECT array_agg(jsonb_build_object('order_id', i, 'customer', 'customer-000000001', 'amount', 12345,
			'currency', 'EUR', 'status', 'confirmed', 'note', 'lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod'))
		   FROM generate_series(1, $CONSUME) i))" >/dev/null
	"$RELAY" publish --pg "$(conninfo src)" --redis "$REDIS" --group one --stream 'one:{topic}' --batch-size 1000 \
		--log-level warn >"$WORK/relay.log" 2>&1 &
	SHARD_PIDS=($!)
	for k in 0 1 2 3; do
		"$RELAY" publish --pg "$(conninfo src)" --redis "$REDIS" --group "four/$k" --stream 'four:{topic}:{shard}' \
			--batch-size 1000 --log-level warn >"$WORK/relay_$k.log" 2>&1 &
		SHARD_PIDS+=($!)
	done
	"$TOOL" wait-entries --redis "$REDIS" --pattern 'one:*' --count "$CONSUME" --timeout 600 >/dev/null
	"$TOOL" wait-entries --redis "$REDIS" --pattern 'four:*' --count "$CONSUME" --timeout 600 >/dev/null
	stop_shard_relays
	echo "   shards of four: $(for k in 0 1 2 3; do printf '%s ' "$(redis xlen "four:c:$k")"; done)entries"
	psql_db pgb -c "SELECT 1" >/dev/null
	pgbench -i -q -s 10 -h 127.0.0.1 -p "$PG_PORT" -U postgres pgb >/dev/null 2>&1

	# The server's next transaction id; pg_current_snapshot() takes none.
	xid_next() { psql_db sink -At -c "SELECT pg_snapshot_xmax(pg_current_snapshot())"; }
	# Entries/s between the end of the first transaction and the last
	# apply, on the server's clock: neither consumer's start-up (its
	# connections, checks, the first read) counts.
	applied_rate() {
		psql_db sink -At -c "
		WITH f AS (SELECT max(applied_at) AS t FROM bench_applied WHERE tx_at = (SELECT min(tx_at) FROM bench_applied))
		SELECT coalesce((SELECT round(count(*) / extract(epoch FROM max(a.applied_at) - f.t))
		  FROM bench_applied a, f WHERE a.applied_at > f.t GROUP BY f.t), 0)"
	}
	# Empty tables and no checkpoint due. No VACUUM: after TRUNCATE a
	# table has never been vacuumed and the planner assumes it holds rows
	# (10 pages); a VACUUM of the empty table would record 0 rows, and
	# plans made then (the relay's session starts on it) would scan the
	# growing inbox in full for each entry, which no steady state has.
	consume_reset() {
		psql_db sink -c "TRUNCATE bench_applied, bench_dedupe, outbox.inbox" -c "CHECKPOINT" >/dev/null
	}
	# Until bench_applied holds $1 rows (at most $2 s), a count every 200
	# ms: the times measured are the server's, the poll only ends the run.
	wait_applied() {
		"$TOOL" wait-rows --pg "$(conninfo sink)" --sql "SELECT count(*) FROM bench_applied" --count "$1" \
			--timeout "${2:-600}" >/dev/null
	}
	# One measured run of consumer $1 (hand, set, ours, bare) over the streams
	# of $2 (one or four), batch $3, $4 workers, consumer group $5. Sets
	# RUN_OUT to "entries/s transaction-ids-per-10k" (bare: "entries/s 0").
	# It runs in this shell, not in a command substitution, so that the
	# exit's cleanup knows the relays it starts (SHARD_PIDS).
	consume_run() {
		local who=$1 set=$2 batch=$3 n=$4 group=$5 x0 x1 eps p k streams=() flags=()
		if [ "$set" = one ]; then
			streams=(--stream one:c)
			flags=(--stream one:c)
		else
			streams=(--stream four:c:0 --stream four:c:1 --stream four:c:2 --stream four:c:3)
			flags=(--stream 'four:c:{shard}' --shards 4 --pool --pool-renew 1s)
		fi
		if [ "$who" = bare ]; then
			eps=$("$TOOL" hand-consume --bare --redis "$REDIS" --group "$group" "${streams[@]}" --batch "$batch" \
				--workers "$n" | result events_per_second)
			RUN_OUT="$eps 0"
			return
		fi
		consume_reset
		x0=$(xid_next)
		if [ "$who" = hand ]; then
			"$TOOL" hand-consume --pg "$(conninfo sink)" --redis "$REDIS" --group "$group" "${streams[@]}" \
				--batch "$batch" --workers "$n" --handler "$HANDLER" >"$WORK/hand.out"
		elif [ "$who" = set ]; then
			"$TOOL" hand-consume --pg "$(conninfo sink)" --redis "$REDIS" --group "$group" "${streams[@]}" \
				--batch "$batch" --workers "$n" --set-sql "$SET_SQL" >"$WORK/hand.out"
		else
			SHARD_PIDS=()
			for k in $(seq 1 "$n"); do
				"$RELAY" consume --pg "$(conninfo sink)" --redis "$REDIS" --consumer bench --group "$group" \
					--worker "w$k" "${flags[@]}" --handler "$HANDLER" --batch-size "$batch" --block 100ms \
					--log-level warn >"$WORK/consume_$k.log" 2>&1 &
				SHARD_PIDS+=($!)
			done
			wait_applied "$CONSUME"
			stop_shard_relays
		fi
		x1=$(xid_next)
		p=$(psql_db sink -At -c "SELECT count(*) FROM bench_applied")
		[ "$p" = "$CONSUME" ] || echo "   $who applied $p of $CONSUME entries" >&2
		RUN_OUT="$(applied_rate) $(echo "$x0 $x1 $CONSUME" | awk '{printf "%.0f", ($2 - $1) * 10000 / $3}')"
	}
	: >"$WORK/consume_batch" >"$WORK/consume_workers"
	for r in $(seq 1 "$ROUNDS"); do
		line=""
		for b in $CONSUME_BATCHES; do
			for who in hand ours set bare; do
				consume_run "$who" one "$b" 1 "$who-r$r-b$b"
				line="$line $RUN_OUT"
			done
		done
		echo "$line" >>"$WORK/consume_batch"
		echo "   round $r: entries/s and xids per 10k (hand-written, pg_outbox_relay consume, hand-written set-based, bare) at batches $CONSUME_BATCHES:$line"
		line=""
		for n in $CONSUME_WORKERS; do
			for who in hand ours bare; do
				consume_run "$who" four 100 "$n" "$who-r$r-w$n"
				line="$line $RUN_OUT"
			done
		done
		echo "$line" >>"$WORK/consume_workers"
		echo "   round $r: entries/s and xids per 10k (hand-written, pg_outbox_relay consume, bare) with $CONSUME_WORKERS worker(s):$line"
	done
	# columns per batch: hand-written eps and xids, ours, set-based, bare (eps, 0)
	c=1
	for b in $CONSUME_BATCHES; do
		f=$WORK/consume_batch
		row "consume $CONSUME entries, batch $b, 1 worker: hand-written consumer, handler per entry pipelined (events/s) | $(awk -v c=$c '{print $c}' "$f" | stats) |"
		row "consume, batch $b: pg_outbox_relay consume (events/s) | $(awk -v c=$((c + 2)) '{print $c}' "$f" | stats) | $([ "$b" = 100 ] && echo '≥ 10000')"
		row "consume, batch $b: hand-written consumer, set-based, one statement a batch (events/s) | $(awk -v c=$((c + 4)) '{print $c}' "$f" | stats) |"
		row "consume, batch $b: bare XREADGROUP + XACK loop, the Redis-side ceiling (events/s) | $(awk -v c=$((c + 6)) '{print $c}' "$f" | stats) |"
		row "consume, batch $b: pg_outbox_relay consume / hand-written | $(awk -v c=$c '{print $(c + 2) / $c}' "$f" | stats) | $([ "$b" = 100 ] && echo '≥ 0.9')"
		row "consume, batch $b: pg_outbox_relay consume / hand-written set-based | $(awk -v c=$c '{print $(c + 2) / $(c + 4)}' "$f" | stats) |"
		row "consume, batch $b: hand-written / bare loop | $(awk -v c=$c '{print $c / $(c + 6)}' "$f" | stats) |"
		row "consume, batch $b: pg_outbox_relay consume / bare loop | $(awk -v c=$c '{print $(c + 2) / $(c + 6)}' "$f" | stats) |"
		row "consume, batch $b: transaction ids per 10,000 entries, hand-written (both) | $(awk -v c=$((c + 1)) '{print $c}' "$f" | stats) / $(awk -v c=$((c + 5)) '{print $c}' "$f" | stats) |"
		row "consume, batch $b: transaction ids per 10,000 entries, pg_outbox_relay consume | $(awk -v c=$((c + 3)) '{print $c}' "$f" | stats) | ≤ $((10000 / b))"
		c=$((c + 8))
	done
	c=1
	for n in $CONSUME_WORKERS; do
		f=$WORK/consume_workers
		row "consume $CONSUME entries of a 4-shard group, batch 100 a stream, $n worker(s): hand-written, stream i to worker i mod $n (events/s) | $(awk -v c=$c '{print $c}' "$f" | stats) |"
		row "consume, 4 shards, $n worker(s): pg_outbox_relay consume --pool (events/s) | $(awk -v c=$((c + 2)) '{print $c}' "$f" | stats) |"
		row "consume, 4 shards, $n worker(s): bare XREADGROUP + XACK loop (events/s) | $(awk -v c=$((c + 4)) '{print $c}' "$f" | stats) |"
		row "consume, 4 shards, $n worker(s): pg_outbox_relay consume / hand-written | $(awk -v c=$c '{print $(c + 2) / $c}' "$f" | stats) |"
		row "consume, 4 shards, $n worker(s): pg_outbox_relay consume / bare loop | $(awk -v c=$c '{print $(c + 2) / $(c + 4)}' "$f" | stats) |"
		row "consume, 4 shards, $n worker(s): transaction ids per 10,000 entries, hand-written / pg_outbox_relay consume | $(awk -v c=$((c + 1)) '{print $c}' "$f" | stats) / $(awk -v c=$((c + 3)) '{print $c}' "$f" | stats) |"
		c=$((c + 6))
	done
	redis flushall >/dev/null

	# Live: emitters at a fixed rate into the outbox (one event a
	# transaction, its payload the emit time), pg_outbox_relay publish
	# (commit order, woken by commits) into the stream live:e, and
	# consumer $2 (ours, hand, none; alone: neither emitters nor publish)
	# applying it, batch 100, for $CONSUME_SECONDS s at $1 tx/s; with $3 =
	# pgbench, a pgbench -S beside them. Prints the latency emit -> applied
	# (ms) "p50 p99 p99.9 max" when a consumer ran, then the pgbench -S tps
	# when it ran.
	echo "SELECT outbox_emit('e', 'k' || :client_id, jsonb_build_object('t', extract(epoch FROM clock_timestamp())));" \
		>"$WORK/live.sql"
	live_run() {
		local rate=$1 who=$2 extra=${3:-} emitted pgb=""
		redis flushall >/dev/null
		consume_reset
		SHARD_PIDS=()
		if [ "$who" != alone ]; then
			psql_db src -c "SELECT outbox_rewind('live', 'now'); UPDATE outbox.groups SET streams = '{}'" >/dev/null
			"$RELAY" publish --pg "$(conninfo src)" --redis "$REDIS" --group live --stream 'live:{topic}' \
				--poll-interval 500ms --log-level warn >"$WORK/relay.log" 2>&1 &
			RELAY_PID=$!
		fi
		if [ "$who" = ours ]; then
			"$RELAY" consume --pg "$(conninfo sink)" --redis "$REDIS" --consumer bench --group live --stream live:e \
				--handler "$HANDLER" --batch-size 100 --log-level warn >"$WORK/consume_1.log" 2>&1 &
			SHARD_PIDS=($!)
		elif [ "$who" = hand ]; then
			"$TOOL" hand-consume --pg "$(conninfo sink)" --redis "$REDIS" --group live --stream live:e --batch 100 \
				--handler "$HANDLER" --seconds $((CONSUME_SECONDS + 90)) >"$WORK/hand.out" 2>&1 &
			SHARD_PIDS=($!)
		fi
		sleep 1
		if [ "$extra" = pgbench ]; then
			pgbench -n -S -M prepared -h 127.0.0.1 -p "$PG_PORT" -U postgres -c 4 -j 2 -T "$CONSUME_SECONDS" pgb \
				>"$WORK/pgbench_s.out" 2>&1 &
			pgb=$!
		fi
		if [ "$who" != alone ]; then
			pgbench -n -h 127.0.0.1 -p "$PG_PORT" -U postgres -c 4 -j 2 -R "$rate" -T "$CONSUME_SECONDS" \
				-f "$WORK/live.sql" src >"$WORK/pgbench.out" 2>&1
		fi
		[ -z "$pgb" ] || wait "$pgb" || true
		if [ "$who" = ours ] || [ "$who" = hand ]; then
			emitted=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$WORK/pgbench.out")
			wait_applied "${emitted:-0}" 60 || echo "   $who: not every emitted event applied after 60 s" >&2
		fi
		stop_shard_relays
		stop_pid "$RELAY_PID"
		RELAY_PID=
		if [ "$who" = ours ] || [ "$who" = hand ]; then
			psql_db sink -At -F ' ' -c "
			SELECT round(percentile_disc(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 2),
			       round(percentile_disc(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 2),
			       round(percentile_disc(0.999) WITHIN GROUP (ORDER BY ms)::numeric, 2), round(max(ms)::numeric, 2)
			  FROM (SELECT (extract(epoch FROM applied_at) - (body->>'t')::float8) * 1000 AS ms FROM bench_applied) s" |
				tr '\n' ' '
		fi
		if [ -n "$pgb" ]; then
			sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$WORK/pgbench_s.out" | tr '\n' ' '
		fi
		echo
	}
	# pgbench's tables in shared_buffers before the first measure
	pgbench -n -S -M prepared -h 127.0.0.1 -p "$PG_PORT" -U postgres -c 4 -j 2 -T 3 pgb >/dev/null 2>&1
	for rate in $CONSUME_RATES; do : >"$WORK/live_ours_$rate" >"$WORK/live_hand_$rate"; done
	: >"$WORK/live_pgbench"
	for r in $(seq 1 "$ROUNDS"); do
		for rate in $CONSUME_RATES; do
			for who in hand ours; do
				live_run "$rate" "$who" >>"$WORK/live_${who}_$rate"
				echo "   round $r, $rate tx/s, $who: emit to applied p50/p99/p99.9/max ms: $(tail -n 1 "$WORK/live_${who}_$rate")"
			done
		done
		# pgbench -S alone; beside the emitters and the publishing relay
		# at $CONSUME_PGBENCH_RATE tx/s without a consumer, with the
		# hand-written one, with pg_outbox_relay consume. The order turns
		# round by round, so that a drift of the machine favours none.
		declare -A TPS=()
		cases=(alone none hand ours)
		for i in 0 1 2 3; do
			who=${cases[$(((i + r - 1) % 4))]}
			live_run "$CONSUME_PGBENCH_RATE" "$who" pgbench >"$WORK/live.out"
			TPS[$who]=$(awk '{print $NF}' "$WORK/live.out")
		done
		line=" ${TPS[alone]:-0} ${TPS[none]:-0} ${TPS[hand]:-0} ${TPS[ours]:-0}"
		unset TPS
		echo "$line" >>"$WORK/live_pgbench"
		echo "   round $r: pgbench -S tps (alone; beside emitters and publish: no consumer, hand-written, pg_outbox_relay consume):$line"
	done
	for rate in $CONSUME_RATES; do
		for who in ours hand; do
			label="pg_outbox_relay publish + consume"
			[ "$who" = hand ] && label="pg_outbox_relay publish + hand-written consumer"
			f=$WORK/live_${who}_$rate
			row "consume latency at $rate tx/s, $label, batch 100: emit to applied p50 (ms) | $(awk '{print $1}' "$f" | stats) |"
			row "consume latency at $rate tx/s, $label: p99 (ms) | $(awk '{print $2}' "$f" | stats) | $([ "$who" = ours ] && [ "$rate" = 2000 ] && echo '< 10')"
			row "consume latency at $rate tx/s, $label: p99.9 (ms) | $(awk '{print $3}' "$f" | stats) |"
			row "consume latency at $rate tx/s, $label: max (ms) | $(awk '{print $4}' "$f" | stats) |"
		done
	done
	f=$WORK/live_pgbench
	row "pgbench -S, 4 clients, ${CONSUME_SECONDS} s, alone (tps) | $(awk '{print $1}' "$f" | stats) |"
	row "pgbench -S beside emitters and pg_outbox_relay publish at $CONSUME_PGBENCH_RATE tx/s, no consumer (tps) | $(awk '{print $2}' "$f" | stats) |"
	row "pgbench -S beside the same and the hand-written consumer (tps) | $(awk '{print $3}' "$f" | stats) |"
	row "pgbench -S beside the same and pg_outbox_relay consume (tps) | $(awk '{print $4}' "$f" | stats) |"
	row "pgbench -S: loss beside the hand-written consumer (1 - tps / tps alone) | $(awk '{print 1 - $3 / $1}' "$f" | stats) |"
	row "pgbench -S: loss beside pg_outbox_relay consume (1 - tps / tps alone) | $(awk '{print 1 - $4 / $1}' "$f" | stats) |"
	row "pgbench -S: loss of the emitters and publish alone, without a consumer (1 - tps / tps alone) | $(awk '{print 1 - $2 / $1}' "$f" | stats) |"
	row "pgbench -S: tps beside pg_outbox_relay consume / beside the hand-written consumer | $(awk '{print $4 / $3}' "$f" | stats) | ≥ 1"
	redis flushall >/dev/null
	psql_db postgres -c "DROP DATABASE src" -c "DROP DATABASE sink" -c "DROP DATABASE pgb"
fi

if [[ " $ONLY " == *" catchup "* ]]; then
	largest=$(echo "$BACKLOGS" | tr ' ' '\n' | sort -n | tail -n 1)
	say "catch-up: one batch of 1000 with $BACKLOGS events behind the cursor"
	psql_db postgres -c "CREATE DATABASE catchup"
	psql_db catchup -c "CREATE EXTENSION pg_outbox" \
		-c "SELECT outbox_group_create('c', start_at => 'beginning', ordering => 'xid8')" \
		-c "SELECT outbox_group_create('cc', start_at => 'beginning', ordering => 'commit')" >/dev/null
	load_events catchup "$largest"
	psql_db catchup -c "VACUUM ANALYZE outbox.event"
	# The median of 21 fetches of one batch of group "g", in milliseconds,
	# with the cursor "b" events before the end (the events were loaded one
	# transaction after another, so both orders agree).
	psql_db catchup -c "
	CREATE FUNCTION fetch_ms(g text, b bigint) RETURNS numeric LANGUAGE plpgsql AS \$\$
	DECLARE
		t0 timestamptz;
		ms numeric[] := '{}';
		e record;
	BEGIN
		SELECT * INTO e FROM outbox.event ORDER BY txid DESC, seq DESC OFFSET b LIMIT 1;
		IF g = 'c' THEN
			PERFORM outbox_rewind(g, coalesce(e.txid || '-' || e.seq, '0-0'));
		ELSE
			PERFORM outbox_rewind(g, coalesce((SELECT m.ticket || '-' || e.seq FROM outbox.commit_log m WHERE m.txid = e.txid), '0-0'));
		END IF;
		FOR i IN 1 .. 21 LOOP
			t0 := clock_timestamp();
			PERFORM count(*) FROM outbox_fetch(g, 1000);
			ms := ms || extract(epoch FROM clock_timestamp() - t0) * 1000;
		END LOOP;
		RETURN (SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY m) FROM unnest(ms) m);
	END
	\$\$"
	: >"$WORK/catchup"
	for r in $(seq 1 "$ROUNDS"); do
		line=""
		for g in c cc; do
			for b in $BACKLOGS; do
				line="$line $(psql_db catchup -At -c "SELECT round(fetch_ms('$g', $b), 3)")"
			done
		done
		echo "$line" >>"$WORK/catchup"
		echo "   round $r: ms per batch at backlogs $BACKLOGS, xid8 then commit order:$line"
	done
	n=$(echo "$BACKLOGS" | wc -w)
	i=1
	for order in xid8 commit; do
		first=$i
		for b in $BACKLOGS; do
			row "catch-up, $order order: one batch of 1000 with $b events waiting (ms) | $(awk -v i=$i '{print $i}' "$WORK/catchup" | stats) |"
			i=$((i + 1))
		done
		row "catch-up, $order order: largest / smallest backlog | $(awk -v f=$first -v l=$((i - 1)) '{print $l / $f}' "$WORK/catchup" | stats) | ≤ 1.5"
	done
	psql_db postgres -c "DROP DATABASE catchup"
fi

if [[ " $ONLY " == *" bloat "* ]]; then
	say "bloat: $BLOAT events through emit, publish and retention, vs the naive outbox with its DELETE cleanup"
	redis flushall >/dev/null
	psql_db postgres -c "CREATE DATABASE bloat"
	psql_db bloat -c "CREATE EXTENSION pg_outbox" -c "SELECT outbox_group_create('b', start_at => 'beginning', ordering => 'commit')" >/dev/null
	# Small partitions, so that retention can act on this much traffic: the
	# (empty) wide ones made at install make way for them.
	psql_db bloat -c "UPDATE outbox.config SET partition_width = 200, premake = 4, retention = '0'" \
		-c "SELECT outbox_drop_empty_partitions()" -c "SELECT count(*) FROM outbox_maintain()" >/dev/null
	psql_db bloat -c "CREATE TABLE naive_outbox (id bigserial PRIMARY KEY, event_id uuid, topic text, key text, payload jsonb,
		headers jsonb, created_at timestamptz DEFAULT now(), status text NOT NULL DEFAULT 'new', updated_at timestamptz);
		CREATE INDEX naive_outbox_new ON naive_outbox (id) WHERE status = 'new';"
	# The same traffic into both: 1000 events a transaction, maintenance
	# running as a relay would run it.
	psql_db bloat -c "
	DO \$\$
	BEGIN
		FOR c IN 0 .. ($BLOAT - 1) / 1000 LOOP
			PERFORM count(*) FROM outbox_emit_many('t', NULL,
				(SELECT array_agg(jsonb_build_object('i', c * 1000 + i, 'note', 'lorem ipsum dolor sit amet, consectetur adipiscing elit'))
				   FROM generate_series(1, 1000) i));
			INSERT INTO naive_outbox (event_id, topic, payload)
				SELECT gen_random_uuid(), 't', jsonb_build_object('i', c * 1000 + i, 'note', 'lorem ipsum dolor sit amet, consectetur adipiscing elit')
				  FROM generate_series(1, 1000) i;
			COMMIT;
			IF c % 50 = 0 THEN
				PERFORM count(*) FROM outbox_maintain();
				COMMIT;
			END IF;
		END LOOP;
	END
	\$\$"
	"$RELAY" publish --pg "$(conninfo bloat)" --redis "$REDIS" --group b --log-level warn --maintain-interval 0 >"$WORK/relay.log" 2>&1 &
	RELAY_PID=$!
	wait_streams "$BLOAT"
	stop_pid "$RELAY_PID"
	RELAY_PID=
	"$TOOL" naive-relay --pg "$(conninfo bloat)" --redis "$REDIS" >/dev/null
	# Time passes (other transactions move the horizon past the last
	# partition), then retention for pg_outbox; the naive outbox's own
	# cleanup: DELETE what was sent.
	psql_db bloat -c "DO \$\$ BEGIN FOR i IN 1 .. 1000 LOOP PERFORM pg_current_xact_id(); COMMIT; END LOOP; END \$\$"
	psql_db bloat -c "SELECT count(*) FROM outbox_maintain()" -c "SELECT count(*) FROM outbox_maintain()" >/dev/null
	psql_db bloat -c "DELETE FROM naive_outbox WHERE status = 'sent'" -c "SELECT pg_stat_force_next_flush()" >/dev/null
	sleep 1
	read -r o_dead o_size o_rows < <(psql_db bloat -At -F ' ' -c "
		SELECT coalesce(sum(s.n_dead_tup), 0), coalesce(sum(pg_total_relation_size(s.relid)), 0), coalesce(sum(s.n_live_tup), 0)
		  FROM pg_stat_user_tables s
		 WHERE s.relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'outbox.event'::regclass)")
	read -r n_dead n_size < <(psql_db bloat -At -F ' ' -c "
		SELECT n_dead_tup, pg_total_relation_size(relid) FROM pg_stat_user_tables WHERE relname = 'naive_outbox'")
	echo "   pg_outbox: $o_dead dead tuples, $o_size bytes, $o_rows live rows; naive: $n_dead dead tuples, $n_size bytes"
	row "bloat after $BLOAT events and retention: pg_outbox event table dead tuples | $o_dead | 0"
	row "bloat: pg_outbox event table size, retained partitions only (MB) | $(echo "$o_size" | awk '{printf "%.1f", $1 / 1048576}') |"
	row "bloat: naive outbox dead tuples after its DELETE cleanup, before VACUUM | $n_dead |"
	row "bloat: naive outbox size (MB) | $(echo "$n_size" | awk '{printf "%.1f", $1 / 1048576}') |"
	psql_db postgres -c "DROP DATABASE bloat"
fi

mkdir -p bench/results
out="bench/results/$(date -u +%Y-%m-%dT%H%M%SZ).md"
# Charts, beside the table: PNG files named after it.
charts=()
if command -v gnuplot >/dev/null; then
	if [ -s "$WORK/scaling.dat" ]; then
		# one line per block of scaling.dat (target and emitter state)
		plots=()
		i=0
		while IFS= read -r title; do
			plots+=("'$WORK/scaling.dat' index $i using 1:2:3:4 with yerrorlines lw 2 pt 7 title '$title'")
			i=$((i + 1))
		done < <(sed -n 's/^# //p' "$WORK/scaling.dat")
		gnuplot <<-GNUPLOT
			set terminal pngcairo size 960,600 font ',11'
			set output '${out%.md}-scaling.png'
			set title "Drain of a $SCALE_EVENTS-event backlog, one relay per shard ($(nproc) cores, everything on one machine)"
			set xlabel 'shards (relays)'
			set ylabel 'events/s published (median, bars: min-max of $SCALE_ROUNDS rounds)'
			set logscale x 2
			set xtics ($(echo "$SCALE_SHARDS" | sed 's/ /, /g'))
			set xrange [0.8:$(echo "$SCALE_SHARDS" | awk '{print $NF * 1.25}')]
			set yrange [0:*]
			set format y '%.0s%c'
			set key bottom right
			set grid
			plot $(IFS=,; echo "${plots[*]}")
		GNUPLOT
		charts+=("scaling:${out%.md}-scaling.png")
	fi
	plots=()
	for rate in $RATES; do
		for mode in listen poll xid8; do
			f=$WORK/latdist_${mode}_$rate
			[ -s "$f" ] || continue
			# percentile on a "nines" axis: x = -log10(1 - q), up to the
			# largest sample
			sort -g "$f" | awk '{a[NR] = $1} END {
				for (x = 0; x <= 6; x += 0.02) {
					i = int((1 - 10 ^ -x) * NR) + 1
					if (i >= NR) break
					print x, a[i]
				}
				print log(NR) / log(10), a[NR]
			}' >"$f.pct"
			label="commit order, woken by commits"
			[ "$mode" = poll ] && label="commit order, polling every 100 ms"
			[ "$mode" = xid8 ] && label="xid8 order, woken by commits"
			plots+=("'$f.pct' using 1:2 with lines lw 2 title '$rate tx/s, $label'")
		done
	done
	if [ "${#plots[@]}" -gt 0 ]; then
		gnuplot <<-GNUPLOT
			set terminal pngcairo size 960,600 font ',11'
			set output '${out%.md}-latency.png'
			set title "Emit to visible in Redis: latency by percentile (every round pooled, $SECONDS_LAT s each)"
			set xlabel 'percentile'
			set ylabel 'ms'
			set logscale y
			set xtics ('50' log10(2), '90' 1, '99' 2, '99.9' 3, '99.99' 4, '99.999' 5)
			set xrange [0:*]
			set autoscale xfixmax
			set yrange [0.1:*]
			set key bottom right
			set grid
			plot $(IFS=,; echo "${plots[*]}")
		GNUPLOT
		charts+=("latency:${out%.md}-latency.png")
	fi
fi
{
	echo "# pg_outbox benchmark, $(date -u '+%Y-%m-%d %H:%M UTC')"
	echo
	echo "Machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), $(uname -sr)."
	echo "PostgreSQL $(pg_run postgres --version | awk '{print $3}') (shared_buffers 1GB, fsync and synchronous_commit on,"
	echo "pg_outbox in shared_preload_libraries: relays are notified when they wait, not on every commit),"
	echo "Redis $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/') (no persistence), both on this machine."
	echo "Each figure: median (min–max) of $ROUNDS interleaved rounds$([[ " $ONLY " == *" scaling "* ]] && echo " ($SCALE_ROUNDS for scaling)"); ratios computed round by round."
	echo
	echo "| measure | median (min–max) | target |"
	echo "|---|---|---|"
	cat "$TABLE"
	for c in "${charts[@]}"; do
		echo
		echo "![${c%%:*}]($(basename "${c#*:}"))"
	done
} >"$out"
echo
cat "$out"
echo
echo "written to $out${charts[*]:+ and} $(for c in "${charts[@]}"; do printf '%s ' "${c#*:}"; done)"
