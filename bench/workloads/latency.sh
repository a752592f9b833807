# shellcheck shell=bash
# The "latency" workload of bench/run.sh, which sources this file and
# calls workload_latency on its servers, with its helpers and its table:
# latency: $RATES transactions/s for ${SECONDS_LAT}s each, woken by
# commits vs polling every 100ms.
workload_latency() {
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
}
