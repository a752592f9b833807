#!/usr/bin/env bash
# pg_outbox benchmarks: each figure beside a baseline measured in the same
# run, on throwaway PostgreSQL and Redis servers on loopback. Prints a
# markdown table and writes it to bench/results/. Asserts nothing. Each
# workload is its own unit: a C++ file bench/workloads/<workload>.cpp run
# by the program `pg_outbox_bench run` (bench/README.md), or, for consume,
# not ported yet, a shell file bench/workloads/consume.sh run here after
# it; both on the test kit's servers (test/kit), their rows in one table,
# in the order below.
#
#   BENCH_ONLY="fetch advance emit drain shards scaling latency coldstart consume catchup bloat"   workloads (default: all)
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
#   BENCH_ADVANCE_SECONDS=3 BENCH_BASE_DESTDIR=dir
#                                          advance: pgbench duration per script; a PostgreSQL tree
#                                          with another build installed, measured beside this one
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

ONLY=${BENCH_ONLY:-fetch advance emit drain shards scaling latency coldstart consume catchup bloat}
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

# The workloads the program runs; the others are the shell files'.
PORTED="fetch advance emit drain shards scaling latency coldstart catchup bloat"
ORDER="fetch advance emit drain shards scaling latency coldstart consume catchup bloat"

throwaway_workspace bench
ROWS=$WORK/rows
mkdir -p "$ROWS"
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

# Each workload's rows go to $ROWS/<workload>.md; the table joins them in order.
row() { echo "| $* |" >>"$ROWS/$workload.md"; }

# The payload of every workload: about 200 bytes of JSON.
PAYLOAD='{"order_id": 1234567, "customer": "customer-000000001", "amount": 12345, "currency": "EUR", "status": "confirmed", "note": "lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod"}'

program=()
shell=()
for workload in $ORDER; do
	[[ " $ONLY " == *" $workload "* ]] || continue
	if [[ " $PORTED " == *" $workload "* ]]; then program+=("$workload"); else shell+=("$workload"); fi
done
mkdir -p bench/results
out="bench/results/$(date -u +%Y-%m-%dT%H%M%SZ).md"
if [ "${#program[@]}" -gt 0 ]; then
	# Its own servers, stopped when it ends; each workload's rows in
	# $ROWS, its charts beside the table (listed in $ROWS/charts).
	"$TOOL" run --only "$(IFS=,; echo "${program[*]}")" --relay "$RELAY" --results "" --rows-dir "$ROWS" \
		--chart-prefix "$PWD/${out%.md}"
fi
if [ "${#shell[@]}" -gt 0 ]; then
	say "starting PostgreSQL on 127.0.0.1:$PG_PORT and Redis on 127.0.0.1:$REDIS_PORT"
	pg_start "$WORK/pg" "$PG_PORT" "shared_buffers = '1GB'" "max_wal_size = '8GB'" "checkpoint_timeout = '30min'" \
		"max_connections = 50" "shared_preload_libraries = 'pg_outbox'"
	MAIN_PG_PID=$PG_PID
	redis_start "$WORK/redis" "$REDIS_PORT"
	MAIN_REDIS_PID=$REDIS_PID
fi
REDIS="127.0.0.1:$REDIS_PORT"

# The shell workloads, each in its own file (bench/workloads/NAME.sh, a
# function workload_NAME that runs on the servers above, with the helpers
# above, and adds its rows to the table).
for workload in "${shell[@]}"; do
	. "bench/workloads/$workload.sh"
	"workload_$workload"
done
TABLE="$WORK/table.md"
: >"$TABLE"
for workload in $ORDER; do
	[ ! -f "$ROWS/$workload.md" ] || cat "$ROWS/$workload.md" >>"$TABLE"
done

# Charts, beside the table: PNG files named after it.
charts=()
if [ -f "$ROWS/charts" ]; then mapfile -t charts <"$ROWS/charts"; fi
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
