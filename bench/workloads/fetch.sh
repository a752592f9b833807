# shellcheck shell=bash
# The "fetch" workload of bench/run.sh, which sources this file and calls
# workload_fetch on its servers, with its helpers and its table: fetch:
# one call of outbox_fetch by the leader, empty and with a batch of 1000,
# vs SELECT 1.
workload_fetch() {
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
}
