# shellcheck shell=bash
# The "scaling" workload of bench/run.sh, which sources this file and
# calls workload_scaling on its servers, with its helpers and its table:
# scaling: a $SCALE_EVENTS-event backlog drained by one relay per shard
# ($SCALE_SHARDS shards) into one Redis and a Redis Cluster of 3 masters,
# emitters stopped and at $SCALE_EMIT_RATE events/s.
workload_scaling() {
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
}
