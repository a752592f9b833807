#!/usr/bin/env bash
# Checks the test kit's program (pg_outbox_testkit), which the scripts
# start their servers through: what it prints for eval, that "stop"
# stops by the PIDs it recorded (also a PostgreSQL restarted meanwhile,
# and a Redis left stopped by a fault), and that it refuses what it cannot
# do with exit status 2 and leaves nothing behind when a start fails.
# test/kit/cli_test.sh PROGRAM. Prints an "ok"/"not ok" line per check,
# then "N passed, N failed".
set -uo pipefail
KIT=$(realpath "$1")
cd "$(dirname "$0")/../.."
. test/ops/tap.bash
. scripts/lib.sh

DIR=$(mktemp -d /tmp/pg_outbox_kit_test.XXXXXX)
chmod 755 "$DIR"
trap '"$KIT" stop --dir "$DIR"; rm -rf "$DIR"' EXIT

gone() { ! kill -0 "$1" 2>/dev/null || [ "$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null)" = Z ]; }

redis_round_trip() {
	local out REDIS_PORT= REDIS_PID=
	out=$("$KIT" start redis --dir "$DIR/redis" -- --appendonly yes) || return 1
	eval "$out"
	eq "$(redis-cli -p "$REDIS_PORT" config get appendonly | tail -n 1)" yes || return 1
	eq "$(cat "$DIR/redis/redis.pid")" "$REDIS_PID" || return 1
	kill -STOP "$REDIS_PID"
	"$KIT" stop --dir "$DIR" || return 1
	gone "$REDIS_PID"
}
check "start redis prints its port and PID, passes its arguments; stop ends it, also when stopped" redis_round_trip

pg_round_trip() {
	local out PG_PORT= PG_PID= restarted
	out=$("$KIT" start pg --dir "$DIR/pg" "max_prepared_transactions = 7") || return 1
	eval "$out"
	eq "$(psql -X -At -h "$DIR/pg" -p "$PG_PORT" -U postgres -d postgres -c 'SHOW max_prepared_transactions')" 7 ||
		return 1
	pg_run pg_ctl -D "$DIR/pg/data" -m fast -w restart >/dev/null || return 1
	restarted=$(head -n 1 "$DIR/pg/data/postmaster.pid")
	"$KIT" stop --dir "$DIR" || return 1
	gone "$PG_PID" && gone "$restarted"
}
check "start pg applies its settings; stop ends it after a restart, by its postmaster.pid" pg_round_trip

cluster_round_trip() {
	local out REDIS_CLUSTER_PORTS=() REDIS_CLUSTER_PIDS=() REDIS_CLUSTER_URL= pid
	out=$("$KIT" start cluster --dir "$DIR/cluster" --masters 3 --replicas 0) || return 1
	eval "$out"
	eq "${#REDIS_CLUSTER_PORTS[@]} ${#REDIS_CLUSTER_PIDS[@]}" "3 3" || return 1
	eq "$REDIS_CLUSTER_URL" "redis+cluster://127.0.0.1:${REDIS_CLUSTER_PORTS[0]},127.0.0.1:${REDIS_CLUSTER_PORTS[1]},127.0.0.1:${REDIS_CLUSTER_PORTS[2]}" ||
		return 1
	redis-cli -p "${REDIS_CLUSTER_PORTS[1]}" cluster info | grep -q '^cluster_state:ok' || return 1
	"$KIT" stop --dir "$DIR/cluster" || return 1
	for pid in "${REDIS_CLUSTER_PIDS[@]}"; do gone "$pid" || return 1; done
}
check "start cluster prints the ports, PIDs and URL of a cluster that is ok; stop ends every node" cluster_round_trip

# A command's exit status and whether its standard error says something.
refuses() {
	local want=$1 says=$2 err rc=0
	shift 2
	err=$("$KIT" "$@" 2>&1 >/dev/null) || rc=$?
	eq "$rc" "$want" || return 1
	grep -qF -- "$says" <<<"$err" || { echo "# stderr: $err" >&2; return 1; }
}
check "no --dir: exit 2" refuses 2 "--dir is required" start redis
check "a port that is no number: exit 2" refuses 2 'takes a number, not "12x"' start redis --dir "$DIR/x" --port 12x
check "a negative port: exit 2" refuses 2 'takes a number, not "-1"' start redis --dir "$DIR/x" --port -1
check "a port above 65535: exit 2" refuses 2 "takes a TCP port (1 to 65535), not 70000" start redis --dir "$DIR/x" --port 70000
check "port 0: exit 2" refuses 2 "takes a TCP port (1 to 65535), not 0" start pg --dir "$DIR/x" --port 0
check "an unknown kind of server: exit 2" refuses 2 'unknown server kind "mysql"' start mysql --dir "$DIR/x"
check "an unknown option: exit 2" refuses 2 "unknown option --bogus" start redis --bogus 1 --dir "$DIR/x"
check "an option without its value: exit 2" refuses 2 "--dir needs a value" stop --dir
check "a sentinel without its master: exit 2" refuses 2 "needs --master-port" start sentinel --dir "$DIR/x"
check "stop with more arguments: exit 2" refuses 2 "stop takes no arguments" stop --dir "$DIR" extra
check "no command: exit 2" refuses 2 "no command"

failed_start_leaves_nothing() {
	local pid
	"$KIT" start redis --dir "$DIR/bad" -- --no-such-option yes 2>/dev/null && return 1
	pid=$(cat "$DIR/bad/redis.pid" 2>/dev/null) || return 0
	gone "$pid"
}
check "a server that does not start: exit 1, nothing left running" failed_start_leaves_nothing

check "stop on a directory without servers" "$KIT" stop --dir "$DIR/none"
check "free-port prints a port" eval '[[ $("$KIT" free-port) =~ ^[0-9]+$ ]]'

finish
