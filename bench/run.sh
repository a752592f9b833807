#!/usr/bin/env bash
# pg_outbox benchmarks: installs what is missing, builds the extension, the
# relay and the benchmark program, then runs it: `pg_outbox_bench run`
# starts throwaway PostgreSQL and Redis servers on loopback (the test kit's),
# runs the workloads (bench/workloads/<workload>.cpp), prints a markdown
# table and writes it, with its charts, to bench/results/. Asserts nothing.
# bench/README.md describes every workload and row.
#
#   BENCH_ONLY="fetch advance emit drain shards scaling latency coldstart consume park catchup bloat engines"   workloads (default: all)
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
#   BENCH_PARK=100000                      park: entries a round over 1,000 keys
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
#   BENCH_ENGINES_EMIT_SECONDS=10 BENCH_ENGINES_BULK=100000 BENCH_ENGINES_EVENTS=200000
#   BENCH_ENGINES_RATE=2000 BENCH_ENGINES_SECONDS=15 BENCH_ENGINES_CONSUME=20000
#                                          engines: the SQL engine beside the C engine: pgbench duration
#                                          of the emit runs; rows of a bulk emit; events drained; tx/s
#                                          and duration of the latency runs; entries consumed
#   BENCH_SCALING_BASE_RELAY=path          scaling: target "cluster-base" drains into the cluster with
#                                          this relay binary (another build, to compare in one run)
#
# With gnuplot (Debian's gnuplot-nox, installed here), the scaling and
# latency workloads also draw PNG charts beside the table.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

ensure_packages postgresql-15-pgq3 gnuplot-nox
build_extension
build_relay pg_outbox_relay pg_outbox_bench

# The program reads the BENCH_* variables itself; BENCH_ONLY is a list
# separated by spaces, --only by commas.
only=()
if [ -n "${BENCH_ONLY:-}" ]; then
	read -ra names <<<"$BENCH_ONLY"
	only=(--only "$(IFS=,; echo "${names[*]}")")
fi
exec build/bench/pg_outbox_bench run "${only[@]}" --relay build/relay/pg_outbox_relay
