# shellcheck shell=bash
# The "emit" workload of bench/run.sh, which sources this file and calls
# workload_emit on its servers, with its helpers and its table: emission:
# pg_outbox vs plain INSERT vs naive status-column outbox vs PgQ; 4
# clients, 1 and 100 events a transaction; bulk.
workload_emit() {
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
	declare -gA STMT=(
		[plain]="INSERT INTO plain_events (topic, key, payload, event_id) VALUES ('orders', lpad(:k::text, 16, '0'), '$PAYLOAD', gen_random_uuid());"
		[outbox]="SELECT outbox_emit('orders', lpad(:k::text, 16, '0'), '$PAYLOAD');"
		[naive]="INSERT INTO naive_outbox (topic, key, payload, event_id) VALUES ('orders', lpad(:k::text, 16, '0'), '$PAYLOAD', gen_random_uuid());"
		[pgq]="SELECT pgq.insert_event('emit', lpad(:k::text, 16, '0'), '$PAYLOAD');"
	)
	STMT[xplain]=${STMT[plain]}
	STMT[xoutbox]=${STMT[outbox]}
	declare -gA BULKSQL=(
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
	declare -gA SIZESQL=(
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
			declare -gA SUM=()
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
}
