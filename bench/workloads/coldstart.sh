# shellcheck shell=bash
# The "coldstart" workload of bench/run.sh, which sources this file and
# calls workload_coldstart on its servers, with its helpers and its table:
# cold start: relay started on empty partitions, then a burst of $BURST
# events.
workload_coldstart() {
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
}
