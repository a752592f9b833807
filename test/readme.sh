#!/usr/bin/env bash
# Runs the documentation's sequences as written, so that the pages cannot
# drift from the product: every fenced block that follows a marker line, in
# order, page after page (README.md's getting-started sequence first, then
# docs/*.md in name order, then CONTRIBUTING.md: a page's blocks may build
# on the README's), on one throwaway PostgreSQL (preloading pg_outbox, as
# the README recommends) and Redis on loopback, stopped by PID.
#
#   <!-- run: sql DB -->          the next block, with psql in DB, as a superuser
#   <!-- run: sql DB as ROLE -->  the same, logged in as ROLE
#   <!-- run: sh background -->   the next block, a command that keeps running,
#                                 in the background (stopped at the end)
#   <!-- run: check DB -->        the next block is a query whose psql output
#                                 must become the text block after it (30 s)
#
# PG_OUTBOX_ENGINE=sql runs the same sequence on the SQL engine: a cluster
# that does not preload pg_outbox, and CREATE EXTENSION pg_outbox_sql where
# the README says CREATE EXTENSION pg_outbox (the groups it creates take
# the xid8 order, the default without the C engine preloaded).
#
# Arguments: the pages, instead of that list.
#
# Commands reach the throwaway servers: "127.0.0.1:6379" becomes the test's
# Redis and "host=127.0.0.1" gains the test's port; pg_outbox_relay is the
# one just built. Prints an "ok"/"not ok" line per block, named by its
# page and line, then
# "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

RELAY=${PG_OUTBOX_RELAY:-$PWD/build/relay/pg_outbox_relay}
[ -x "$RELAY" ] || { echo "not ok 1 - the relay is built ($RELAY)"; echo "0 passed, 1 failed"; exit 1; }

throwaway_workspace readme
BACKGROUND=()
cleanup() {
	local pid
	for pid in "${BACKGROUND[@]}"; do stop_pid "$pid"; done
	stop_servers
	rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

case ${PG_OUTBOX_ENGINE:-c} in
c) pg_start "$WORK/pg" "$PG_PORT" "shared_preload_libraries = 'pg_outbox'" ;;
sql) pg_start "$WORK/pg" "$PG_PORT" ;;
*) echo "PG_OUTBOX_ENGINE is c or sql, not \"$PG_OUTBOX_ENGINE\"" >&2; exit 2 ;;
esac
# A block of SQL for the engine under test.
engine_sql() {
	if [ "${PG_OUTBOX_ENGINE:-c}" = sql ]; then
		sed 's/^CREATE EXTENSION pg_outbox;/CREATE EXTENSION pg_outbox_sql;/' "$1"
	else
		cat "$1"
	fi
}
redis_start "$WORK/redis" "$REDIS_PORT" || exit 1
mkdir -p "$WORK/bin"
ln -s "$RELAY" "$WORK/bin/pg_outbox_relay"
export PATH="$WORK/bin:$PATH"

if [ $# -gt 0 ]; then
	PAGES=("$@")
else
	PAGES=(README.md docs/*.md CONTRIBUTING.md)
fi

# The marked blocks, one file each, and a list: number, page:line, kind,
# database, role (last: it may be empty).
/usr/bin/python3 - "$WORK/blocks" "${PAGES[@]}" <<'PY'
import os, re, sys
out, pages = sys.argv[1], sys.argv[2:]
os.makedirs(out)
manifest, n = [], 0


def block(at):
    """The fenced block starting at or after line "at": (body, line after it)."""
    while not lines[at].startswith("```"):
        at += 1
    end = at + 1
    while not lines[end].startswith("```"):
        end += 1
    return "\n".join(lines[at + 1:end]) + "\n", end + 1


for page in pages:
    lines = open(page, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"<!-- run: (sql|sh|check) ?(\S*)(?: as (\S+))? -->$", lines[i].strip())
        i += 1
        if not m:
            continue
        n += 1
        at = f"{page}:{i}"
        kind, where, role = m.group(1), m.group(2), m.group(3) or ""
        body, i = block(i)
        open(f"{out}/{n}.block", "w", encoding="utf-8").write(body)
        if kind == "check":
            expected, i = block(i)
            open(f"{out}/{n}.expected", "w", encoding="utf-8").write(expected)
        manifest.append(f"{n}\t{at}\t{kind}\t{where}\t{role}")
open(f"{out}/manifest", "w").write("\n".join(manifest) + "\n")
PY

passed=0
failed=0
report() {
	if [ "$1" -eq 0 ]; then
		passed=$((passed + 1))
		echo "ok $((passed + failed)) - $2"
	else
		failed=$((failed + 1))
		echo "not ok $((passed + failed)) - $2"
		[ -f "$WORK/out" ] && sed 's/^/#   /' "$WORK/out"
	fi
}
psql_as() { psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U "${2:-postgres}" -d "$1"; }
# A command of a page, aimed at the throwaway servers.
local_command() {
	sed -e "s/127\.0\.0\.1:6379/127.0.0.1:$REDIS_PORT/g" -e "s/host=127\.0\.0\.1/host=127.0.0.1 port=$PG_PORT/g" "$1"
}
# Runs a query until its output (trailing blanks and empty lines aside) is
# the expected text.
check() {
	local db=$1 query=$2 expected=$3 i
	for i in $(seq 1 300); do
		psql_as "$db" <"$query" 2>&1 | sed 's/[[:space:]]*$//' | grep -v '^$' >"$WORK/out"
		sed 's/[[:space:]]*$//' "$expected" | grep -v '^$' | diff -q - "$WORK/out" >/dev/null && return 0
		sleep 0.1
	done
	sed 's/[[:space:]]*$//' "$expected" | grep -v '^$' | diff -u - "$WORK/out" >"$WORK/diff"
	mv "$WORK/diff" "$WORK/out"
	return 1
}

while IFS=$'\t' read -r n at kind where role; do
	block="$WORK/blocks/$n.block"
	case $kind in
	sql)
		engine_sql "$block" | psql_as "$where" "$role" >"$WORK/out" 2>&1
		report $? "$at: SQL in $where${role:+ as $role}"
		;;
	sh)
		# exec: the command itself is the process started, and stopped.
		{ printf 'exec '; local_command "$block"; } >"$WORK/$n.sh"
		bash "$WORK/$n.sh" >"$WORK/$n.log" 2>&1 &
		BACKGROUND+=($!)
		sleep 1
		kill -0 "$!" 2>/dev/null
		status=$?
		cp "$WORK/$n.log" "$WORK/out"
		report "$status" "$at: $(head -n 1 "$block" | cut -c1-60)... keeps running"
		;;
	check)
		check "$where" "$block" "$WORK/blocks/$n.expected"
		report $? "$at: the query in $where shows what the page says"
		;;
	esac
done <"$WORK/blocks/manifest"

# Every background command is still running: nothing exited on its own.
for pid in "${BACKGROUND[@]}"; do
	kill -0 "$pid" 2>/dev/null
	report $? "the command started in the background (pid $pid) still runs"
done
[ $((passed + failed)) -gt 0 ] || report 1 "the pages have marked blocks"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
