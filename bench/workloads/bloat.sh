# shellcheck shell=bash
# The "bloat" workload of bench/run.sh, which sources this file and calls
# workload_bloat on its servers, with its helpers and its table: bloat:
# $BLOAT events through emit, publish and retention, vs the naive outbox
# with its DELETE cleanup.
workload_bloat() {
	say "bloat: $BLOAT events through emit, publish and retention, vs the naive outbox with its DELETE cleanup"
	redis flushall >/dev/null
	psql_db postgres -c "CREATE DATABASE bloat"
	psql_db bloat -c "CREATE EXTENSION pg_outbox" -c "SELECT outbox_group_create('b', start_at => 'beginning', ordering => 'commit')" >/dev/null
	# Small partitions, so that retention can act on this much traffic: the
	# (empty) wide ones made at install make way for them.
	psql_db bloat -c "UPDATE outbox.config SET partition_width = 200, premake = 4, retention = '0'" \
		-c "SELECT outbox_drop_empty_partitions()" -c "SELECT count(*) FROM outbox_maintain()" >/dev/null
	psql_db bloat -c "CREATE TABLE naive_outbox (id bigserial PRIMARY KEY, event_id uuid, topic text, key text, payload jsonb,
		headers jsonb, created_at timestamptz DEFAULT now(), status text NOT NULL DEFAULT 'new', updated_at timestamptz);
		CREATE INDEX naive_outbox_new ON naive_outbox (id) WHERE status = 'new';"
	# The same traffic into both: 1000 events a transaction, maintenance
	# running as a relay would run it.
	psql_db bloat -c "
	DO \$\$
	BEGIN
		FOR c IN 0 .. ($BLOAT - 1) / 1000 LOOP
			PERFORM count(*) FROM outbox_emit_many('t', NULL,
				(SELECT array_agg(jsonb_build_object('i', c * 1000 + i, 'note', 'lorem ipsum dolor sit amet, consectetur adipiscing elit'))
				   FROM generate_series(1, 1000) i));
			INSERT INTO naive_outbox (event_id, topic, payload)
				SELECT gen_random_uuid(), 't', jsonb_build_object('i', c * 1000 + i, 'note', 'lorem ipsum dolor sit amet, consectetur adipiscing elit')
				  FROM generate_series(1, 1000) i;
			COMMIT;
			IF c % 50 = 0 THEN
				PERFORM count(*) FROM outbox_maintain();
				COMMIT;
			END IF;
		END LOOP;
	END
	\$\$"
	"$RELAY" publish --pg "$(conninfo bloat)" --redis "$REDIS" --group b --log-level warn --maintain-interval 0 >"$WORK/relay.log" 2>&1 &
	RELAY_PID=$!
	wait_streams "$BLOAT"
	stop_pid "$RELAY_PID"
	RELAY_PID=
	"$TOOL" naive-relay --pg "$(conninfo bloat)" --redis "$REDIS" >/dev/null
	# Time passes (other transactions move the horizon past the last
	# partition), then retention for pg_outbox; the naive outbox's own
	# cleanup: DELETE what was sent.
	psql_db bloat -c "DO \$\$ BEGIN FOR i IN 1 .. 1000 LOOP PERFORM pg_current_xact_id(); COMMIT; END LOOP; END \$\$"
	psql_db bloat -c "SELECT count(*) FROM outbox_maintain()" -c "SELECT count(*) FROM outbox_maintain()" >/dev/null
	psql_db bloat -c "DELETE FROM naive_outbox WHERE status = 'sent'" -c "SELECT pg_stat_force_next_flush()" >/dev/null
	sleep 1
	read -r o_dead o_size o_rows < <(psql_db bloat -At -F ' ' -c "
		SELECT coalesce(sum(s.n_dead_tup), 0), coalesce(sum(pg_total_relation_size(s.relid)), 0), coalesce(sum(s.n_live_tup), 0)
		  FROM pg_stat_user_tables s
		 WHERE s.relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'outbox.event'::regclass)")
	read -r n_dead n_size < <(psql_db bloat -At -F ' ' -c "
		SELECT n_dead_tup, pg_total_relation_size(relid) FROM pg_stat_user_tables WHERE relname = 'naive_outbox'")
	echo "   pg_outbox: $o_dead dead tuples, $o_size bytes, $o_rows live rows; naive: $n_dead dead tuples, $n_size bytes"
	row "bloat after $BLOAT events and retention: pg_outbox event table dead tuples | $o_dead | 0"
	row "bloat: pg_outbox event table size, retained partitions only (MB) | $(echo "$o_size" | awk '{printf "%.1f", $1 / 1048576}') |"
	row "bloat: naive outbox dead tuples after its DELETE cleanup, before VACUUM | $n_dead |"
	row "bloat: naive outbox size (MB) | $(echo "$n_size" | awk '{printf "%.1f", $1 / 1048576}') |"
	psql_db postgres -c "DROP DATABASE bloat"
}
