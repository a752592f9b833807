# shellcheck shell=bash
# The "shards" workload of bench/run.sh, which sources this file and calls
# workload_shards on its servers, with its helpers and its table: shards:
# $EVENTS waiting events drained by one relay per shard (1, 2, 4) into one
# Redis; rows read per batch with 1, 4, 16 shards.
workload_shards() {
	say "shards: $EVENTS waiting events drained by one relay per shard (1, 2, 4) into one Redis; rows read per batch with 1, 4, 16 shards"
	psql_db postgres -c "CREATE DATABASE shards"
	psql_db shards -c "CREATE EXTENSION pg_outbox" >/dev/null
	for n in 1 2 4 16; do
		psql_db shards -c "SELECT outbox_group_create('d$n', start_at => 'beginning', ordering => 'xid8', shards => $n)" >/dev/null
	done
	load_events shards "$EVENTS"
	psql_db shards -c "VACUUM ANALYZE outbox.event" >/dev/null
	# Heap rows a batch of shard 0 reads (index scans of this transaction)
	# and its time, with the cursor at the start of a backlog of $EVENTS.
	psql_db shards -c "
	CREATE FUNCTION batch_reads(g text, OUT events bigint, OUT rows_read bigint, OUT ms numeric) LANGUAGE plpgsql AS \$\$
	DECLARE
		before bigint;
		t0 timestamptz;
	BEGIN
		SELECT coalesce(sum(idx_tup_fetch), 0) INTO before FROM pg_stat_xact_user_tables
		 WHERE relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'outbox.event'::regclass);
		t0 := clock_timestamp();
		SELECT count(*) INTO events FROM outbox_fetch(g, 1000);
		ms := round((extract(epoch FROM clock_timestamp() - t0) * 1000)::numeric, 3);
		SELECT coalesce(sum(idx_tup_fetch), 0) - before INTO rows_read FROM pg_stat_xact_user_tables
		 WHERE relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'outbox.event'::regclass);
	END
	\$\$"
	: >"$WORK/shards_reads"
	for r in $(seq 1 "$ROUNDS"); do
		line=""
		for g in d1 d4/0 d16/0; do
			line="$line $(psql_db shards -At -F ' ' -c "SELECT events, rows_read, ms FROM batch_reads('$g')")"
		done
		echo "$line" >>"$WORK/shards_reads"
		echo "   round $r: events, rows read, ms of one batch (1, 4, 16 shards):$line"
	done
	# Drains group dN with a relay per shard, in parallel: events/s, and
	# CPU microseconds per event of PostgreSQL, the relays and Redis.
	: >"$WORK/shards_drain"
	for r in $(seq 1 "$ROUNDS"); do
		line=""
		for n in 1 2 4; do
			redis flushall >/dev/null
			rewind_shards shards "d$n"
			settle shards
			cpu_snapshot $(pg_processes) "$REDIS_PID" >"$WORK/cpu0"
			t0=$(now)
			start_shard_relays shards "d$n" "$n" "$REDIS"
			wait_streams "$EVENTS"
			t1=$(now)
			cpu_snapshot $(pg_processes) >"$WORK/cpu1_pg"
			cpu_snapshot "$REDIS_PID" >"$WORK/cpu1_redis"
			cpu_snapshot "${SHARD_PIDS[@]}" >"$WORK/cpu1_relay"
			stop_shard_relays
			line="$line $(echo "$EVENTS $t0 $t1" | awk '{printf "%.0f", $1 / ($3 - $2)}')"
			for part in pg relay redis; do
				line="$line $(cpu_between "$WORK/cpu0" "$WORK/cpu1_$part" | awk -v n="$EVENTS" '{printf "%.2f", $1 * 1e6 / n}')"
			done
		done
		echo "$line" >>"$WORK/shards_drain"
		echo "   round $r: events/s and CPU µs per event (PostgreSQL, relays, Redis) with 1, 2, 4 shards:$line"
	done
	redis flushall >/dev/null
	c=2
	for n in 1 4 16; do
		row "shards: one batch of 1000 at a $EVENTS-event backlog, $n shard(s): heap rows read | $(awk -v c=$c '{print $c}' "$WORK/shards_reads" | stats) | ≤ 1000"
		row "shards: one batch, $n shard(s) (ms) | $(awk -v c=$((c + 1)) '{print $c}' "$WORK/shards_reads" | stats) |"
		c=$((c + 3))
	done
	c=1
	for n in 1 2 4; do
		row "shards: drain $EVENTS events with $n relay(s), one per shard, one Redis (events/s) | $(awk -v c=$c '{print $c}' "$WORK/shards_drain" | stats) |"
		row "shards: drain with $n shard(s) / with 1 | $(awk -v c=$c '{print $c / $1}' "$WORK/shards_drain" | stats) |"
		row "shards, $n shard(s): CPU per event of PostgreSQL, relays, Redis (µs) | $(awk -v c=$((c + 1)) '{print $c}' "$WORK/shards_drain" | stats), $(awk -v c=$((c + 2)) '{print $c}' "$WORK/shards_drain" | stats), $(awk -v c=$((c + 3)) '{print $c}' "$WORK/shards_drain" | stats) |"
		c=$((c + 4))
	done
	psql_db postgres -c "DROP DATABASE shards"
}
