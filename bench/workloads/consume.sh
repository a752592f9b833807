# shellcheck shell=bash
# The "consume" workload of bench/run.sh, which sources this file and
# calls workload_consume on its servers, with its helpers and its table:
# consume: $CONSUME entries a round, batches of $CONSUME_BATCHES and
# $CONSUME_WORKERS worker(s): pg_outbox_relay consume vs a hand-written
# consumer (handler per entry, and set-based) vs the bare XREADGROUP +
# XACK loop; latency at $CONSUME_RATES tx/s; pgbench -S beside each.
workload_consume() {
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
		declare -gA TPS=()
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
}
