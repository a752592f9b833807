#!/usr/bin/env bash
# pg_outbox soak test: a fault-injecting workload, then a history checker.
#
# 16 writers emit numbered events on random keys (with aborted
# transactions, rolled-back savepoints, long transactions, two-phase
# commits and bulk emits), two relays publish one group, two consume
# workers apply the streams through the inbox into a projection. Faults
# come at random moments: relays and workers killed and restarted, the
# active relay stopped and continued, the leading relay hung for three
# leases (the standby takes over; the old leader is fenced off), Redis
# killed and restarted from its AOF, Redis unreachable, PostgreSQL
# restarted, a stream trimmed below entries nobody read, maintenance runs. Then everything is brought back,
# drained, and the history (what committed, what is in the streams, what
# was applied, what was dead-lettered) goes to pg_outbox_check.
#
#   SOAK_SECONDS=120   how long the faults and the workload run
#   SOAK_SEED          seed of the fault schedule (default: random, printed)
#   SOAK_ORDERING      commit (default: pg_outbox preloaded, a commit-ordered
#                      group, no two-phase commits) or xid8
#
# Everything runs on throwaway servers on loopback, stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib.sh

SECONDS_TOTAL=${SOAK_SECONDS:-120}
SEED=${SOAK_SEED:-$RANDOM}
RANDOM=$SEED
ORDERING=${SOAK_ORDERING:-commit}
case $ORDERING in
commit | xid8) ;;
*) echo "SOAK_ORDERING must be commit or xid8, not \"$ORDERING\"" >&2; exit 2 ;;
esac

ensure_packages
build_extension
build_relay pg_outbox_relay pg_outbox_check
RELAY=build/relay/pg_outbox_relay
CHECK=build/test/soak/pg_outbox_check

throwaway_workspace soak
declare -A PIDS=()
WRITERS_PID=
FAULTS_PID=
cleanup() {
	for p in "$FAULTS_PID" "$WRITERS_PID"; do stop_pid "$p"; done
	for name in "${!PIDS[@]}"; do
		kill -CONT "${PIDS[$name]}" 2>/dev/null || true
		stop_pid "${PIDS[$name]}"
	done
	stop_servers
	[ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "soak: ${SECONDS_TOTAL}s, $ORDERING order, fault schedule seed $SEED, work in $WORK"
PG_SETTINGS=("max_prepared_transactions = 50" "max_connections = 100")
[ "$ORDERING" = commit ] && PG_SETTINGS+=("shared_preload_libraries = 'pg_outbox'")
pg_start "$WORK/pg" "$PG_PORT" "${PG_SETTINGS[@]}"
REDIS_OPTS=(--appendonly yes --appendfsync everysec)
redis_start "$WORK/redis" "$REDIS_PORT" "${REDIS_OPTS[@]}"

db() { local d=$1; shift; psql -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U postgres -d "$d" "$@"; }
redis() { redis-cli -p "$REDIS_PORT" "$@"; }

psql -X -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -c "CREATE DATABASE soak" -c "CREATE DATABASE sink"
db soak -v ordering="$ORDERING" <<'SQL'
CREATE EXTENSION pg_outbox;
CREATE SEQUENCE soak_n;
SELECT outbox_group_create('soak', start_at => 'beginning', ordering => :'ordering');
SQL
db sink <<'SQL'
CREATE EXTENSION pg_outbox;
-- No unique constraint: a duplicate apply would show as two rows.
CREATE TABLE projection (event_id uuid NOT NULL, n bigint, applied_at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION soak_apply(payload jsonb, event_id uuid) RETURNS void LANGUAGE sql AS
    $$ INSERT INTO projection (event_id, n) VALUES (event_id, (payload->>'n')::bigint) $$;
SELECT inbox_consumer_create('projection', current_user::regrole);
SQL

start() { # name: (re)starts a relay or a worker
	local name=$1
	case $name in
	relay*)
		"$RELAY" publish --pg "host=127.0.0.1 port=$PG_PORT dbname=soak user=postgres" \
			--redis "127.0.0.1:$REDIS_PORT" --group soak --poll-interval 200ms --retry-max 1s \
			--stats-interval 1s --maintain-interval 3s --lease 1s >>"$WORK/$name.log" 2>&1 &
		;;
	worker*)
		"$RELAY" consume --pg "host=127.0.0.1 port=$PG_PORT dbname=sink user=postgres" \
			--redis "127.0.0.1:$REDIS_PORT" --consumer projection --worker "$name" \
			--stream outbox:t0 --stream outbox:t1 --stream outbox:t2 --handler 'SELECT soak_apply($3, $5)' \
			--block 200ms --min-idle 2s --claim-interval 500ms --max-deliveries 1000000 \
			--retry-max 1s >>"$WORK/$name.log" 2>&1 &
		;;
	esac
	PIDS[$name]=$!
}
for name in relay1 relay2 worker1 worker2; do start "$name"; done

# The writers: 16 clients, short pgbench runs in a loop (a PostgreSQL
# restart ends a run; the next one starts).
emit="SELECT outbox_emit('t' || (:k % 3), 'k' || :k, jsonb_build_object('n', nextval('soak_n')))"
W="$WORK/writers"
mkdir -p "$W"
printf '%s\n' '\set k random(1, 100000)' "BEGIN;" "$emit;" "$emit;" "COMMIT;" >"$W/normal.sql"
printf '%s\n' '\set k random(1, 100000)' "BEGIN;" "$emit;" "ROLLBACK;" >"$W/abort.sql"
printf '%s\n' '\set k random(1, 100000)' "BEGIN;" "$emit;" "SAVEPOINT s;" "$emit;" "ROLLBACK TO SAVEPOINT s;" "$emit;" "COMMIT;" >"$W/savepoint.sql"
printf '%s\n' '\set k random(1, 100000)' "BEGIN;" "$emit;" "SELECT pg_sleep(1 + random() * 2);" "$emit;" "COMMIT;" >"$W/long.sql"
printf '%s\n' '\set k random(1, 100000)' '\set g random(1, 1000000000)' "BEGIN;" "$emit;" \
	"PREPARE TRANSACTION 'soak-:g';" "COMMIT PREPARED 'soak-:g';" >"$W/twopc.sql"
printf '%s\n' '\set k random(1, 100000)' '\set g random(1, 1000000000)' "BEGIN;" "$emit;" \
	"PREPARE TRANSACTION 'soak-:g';" "ROLLBACK PREPARED 'soak-:g';" >"$W/twopc_abort.sql"
printf '%s\n' '\set k random(1, 100000)' \
	"SELECT count(*) FROM outbox_emit_many('t' || (:k % 3), NULL, (SELECT array_agg(jsonb_build_object('n', nextval('soak_n'))) FROM generate_series(1, 20)));" \
	>"$W/bulk.sql"
# An emitting transaction cannot be prepared while a commit-ordered group
# exists: in commit order, those weights go to plain transactions.
if [ "$ORDERING" = commit ]; then
	MIX=(-f "$W/normal.sql@74" -f "$W/abort.sql@10" -f "$W/savepoint.sql@10" -f "$W/long.sql@1" -f "$W/bulk.sql@5")
else
	MIX=(-f "$W/normal.sql@68" -f "$W/abort.sql@10" -f "$W/savepoint.sql@10" -f "$W/long.sql@1"
		-f "$W/twopc.sql@4" -f "$W/twopc_abort.sql@2" -f "$W/bulk.sql@5")
fi
writers() {
	local until=$(($(date +%s) + SECONDS_TOTAL))
	while [ "$(date +%s)" -lt "$until" ]; do
		pgbench -n -h 127.0.0.1 -p "$PG_PORT" -U postgres -c 16 -j 2 -T 5 -R 300 \
			"${MIX[@]}" soak >>"$WORK/writers.log" 2>&1 || sleep 0.5
	done
}
writers &
WRITERS_PID=$!

# The relay that leads, by the last leadership line of its log.
leading_relay() {
	local n
	for n in relay1 relay2; do
		if grep -E 'leading group|standing by|lost the leadership' "$WORK/$n.log" 2>/dev/null | tail -n 1 |
				grep -q 'leading group'; then
			echo "$n"
			return
		fi
	done
	echo relay1
}

# The faults, one every 1 to 4 seconds, in a random order.
fault() {
	local f=$((RANDOM % 9))
	case $f in
	0) local n="relay$((1 + RANDOM % 2))"; echo "kill -9 $n"; kill -KILL "${PIDS[$n]}" 2>/dev/null || true; sleep 0.3; start "$n" ;;
	1) local n="worker$((1 + RANDOM % 2))"; echo "kill -9 $n"; kill -KILL "${PIDS[$n]}" 2>/dev/null || true; sleep 0.3; start "$n" ;;
	2) local n="relay$((1 + RANDOM % 2))"; echo "stop and continue $n"; kill -STOP "${PIDS[$n]}"; sleep 2; kill -CONT "${PIDS[$n]}" ;;
	3) echo "kill -9 redis, restart from its AOF"; kill -KILL "$REDIS_PID"; wait "$REDIS_PID" 2>/dev/null || true; sleep 0.5
	   redis_start "$WORK/redis" "$REDIS_PORT" "${REDIS_OPTS[@]}" ;;
	4) echo "redis unreachable for 3s"; kill -STOP "$REDIS_PID"; sleep 3; kill -CONT "$REDIS_PID" ;;
	5) echo "postgresql fast restart"; pg_run pg_ctl -D "$WORK/pg/data" -m fast -w restart >/dev/null 2>&1 || true ;;
	6) echo "trim outbox:t1 below unread entries"; kill -STOP "${PIDS[worker1]}" "${PIDS[worker2]}"; sleep 1.5
	   redis xtrim outbox:t1 MAXLEN 3 >/dev/null || true; kill -CONT "${PIDS[worker1]}" "${PIDS[worker2]}" ;;
	7) echo "maintenance"; db soak -c "SELECT count(*) FROM outbox_maintain()" >/dev/null 2>&1 || true ;;
	8) local n; n=$(leading_relay); echo "hung leader: stop the leading relay for 3 leases"
	   kill -STOP "${PIDS[$n]}"; sleep 3; kill -CONT "${PIDS[$n]}" ;;
	esac
}
faults() {
	local until=$(($(date +%s) + SECONDS_TOTAL - 3))
	sleep 2
	while [ "$(date +%s)" -lt "$until" ]; do
		fault
		sleep "$((1 + RANDOM % 4))"
	done
}
# The fault loop runs in this shell (it restarts processes whose PIDs the
# cleanup needs), while the writers run in the background.
faults >"$WORK/faults.log" 2>>"$WORK/shell.log" || true
wait "$WRITERS_PID" || true
WRITERS_PID=
say "faults injected: $(wc -l <"$WORK/faults.log") ($(sort "$WORK/faults.log" | uniq -c | sort -rn | awk '{c=$1; $1=""; printf "%s%s x%s", sep, $0, c; sep=","}'))"

# Bring everything back and let it drain.
kill -CONT "$REDIS_PID" 2>/dev/null || true
for name in relay1 relay2 worker1 worker2; do
	kill -CONT "${PIDS[$name]}" 2>/dev/null || true
	kill -0 "${PIDS[$name]}" 2>/dev/null || start "$name"
done
# A PostgreSQL restart between a writer's PREPARE TRANSACTION and its
# COMMIT PREPARED leaves the transaction in doubt, holding the xid8
# horizon until someone decides. As the transaction manager would after a
# crash, commit them: their events must then be published like any other.
for gid in $(db soak -c "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE 'soak-%'"); do
	echo "committing in-doubt prepared transaction $gid"
	db soak -c "COMMIT PREPARED '$gid'"
done
db soak -c "SELECT count(*) FROM outbox_maintain()" >/dev/null
committed() { db soak -c "SELECT count(*) FROM outbox.event"; }
settled() {
	local c a d p
	c=$(committed)
	a=$(db sink -c "SELECT count(DISTINCT event_id) FROM projection")
	p=0
	for s in outbox:t0 outbox:t1 outbox:t2; do p=$((p + $(redis xpending "$s" projection 2>/dev/null | head -n 1 || echo 0))); done
	[ "$p" = 0 ] && [ "$(db soak -c "SELECT coalesce(sum(waiting), 0) FROM outbox_group_stats()")" = 0 ] && \
		[ "$a" -gt 0 ] && [ "$(db sink -c "SELECT count(*) FROM projection WHERE applied_at > clock_timestamp() - interval '2 seconds'")" = 0 ]
}
for i in $(seq 1 120); do
	settled && break
	sleep 1
done

# The history.
H="$WORK/history"
mkdir -p "$H"
# Each committed event with its position in the group's order.
if [ "$ORDERING" = commit ]; then
	db soak -F $'\t' -c "SELECT e.event_id, e.topic, m.ticket || '-' || e.seq, extract(epoch FROM e.created_at)
						  FROM outbox.event e JOIN outbox.commit_log m ON m.txid = e.txid" >"$H/committed.tsv"
	unmarked=$(db soak -c "SELECT count(*) FROM outbox.event e WHERE NOT EXISTS (SELECT 1 FROM outbox.commit_log m WHERE m.txid = e.txid)")
	if [ "$unmarked" != 0 ]; then
		echo "soak: $unmarked committed events have no commit marker" >&2
		echo "soak: 0 passed, 1 failed"
		KEEP=1
		exit 1
	fi
else
	db soak -F $'\t' -c "SELECT event_id, topic, txid || '-' || seq, extract(epoch FROM created_at) FROM outbox.event" >"$H/committed.tsv"
fi
for s in outbox:t0 outbox:t1 outbox:t2; do
	start_id=-
	while :; do
		chunk=$(redis --raw xrange "$s" "$start_id" + COUNT 5000)
		[ -n "$chunk" ] || break
		echo "$chunk" | awk -v s="$s" '
			/^[0-9]+-[0-9]+$/ && expect_id { id = $0; expect_id = 0; next }
			{ if (key == "") { key = $0 } else { f[key] = $0; key = "" } }
			key == "" && "prev" in f { print s "\t" id "\t" f["event_id"] "\t" f["position"]; delete f; expect_id = 1 }
			BEGIN { expect_id = 1 }' >>"$H/streams.tsv"
		last=$(tail -n 1 "$H/streams.tsv" | cut -f 2)
		[ "$start_id" = "($last" ] && break
		start_id="($last"
	done
done
touch "$H/streams.tsv"
db sink -F $'\t' -c "SELECT event_id, extract(epoch FROM applied_at) FROM projection" >"$H/applied.tsv"
db sink -F $'\t' -c "SELECT stream, entry_id, coalesce(event_id::text, '') FROM outbox.dead_letters" >"$H/dead_letters.tsv"

say "history: $(wc -l <"$H/committed.tsv") committed, $(wc -l <"$H/streams.tsv") stream entries, $(wc -l <"$H/applied.tsv") applies, $(wc -l <"$H/dead_letters.tsv") dead letters"
if "$CHECK" "$H"; then
	echo "soak: 1 passed, 0 failed"
else
	KEEP=1
	echo "soak: history and logs kept in $WORK"
	echo "soak: 0 passed, 1 failed"
	exit 1
fi
