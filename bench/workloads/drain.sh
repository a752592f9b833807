# shellcheck shell=bash
# The "drain" workload of bench/run.sh, which sources this file and calls
# workload_drain on its servers, with its helpers and its table: drain:
# $EVENTS waiting events, $ROUNDS rounds.
workload_drain() {
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
}
