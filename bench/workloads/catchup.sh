# shellcheck shell=bash
# The "catchup" workload of bench/run.sh, which sources this file and
# calls workload_catchup on its servers, with its helpers and its table:
# catch-up: one batch of 1000 with $BACKLOGS events behind the cursor.
workload_catchup() {
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
}
