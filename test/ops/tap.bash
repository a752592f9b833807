# What the operations tests (test/ops/*.sh) share, sourced by each: one
# "ok N - what" or "not ok N - what" line per check, and a summary line;
# and the engine they test.

# The engine under test, PG_OUTBOX_ENGINE: c (the extension pg_outbox,
# the default) or sql (pg_outbox_sql, the SQL engine). COMMIT_ORDER is the
# ordering of a test's group that the C engine orders by commit: the SQL
# engine refuses commit-ordered groups, so there it is xid8.
ENGINE=${PG_OUTBOX_ENGINE:-c}
case $ENGINE in
c) EXT=pg_outbox COMMIT_ORDER=commit ;;
sql) EXT=pg_outbox_sql COMMIT_ORDER=xid8 ;;
*) echo "PG_OUTBOX_ENGINE is c or sql, not \"$ENGINE\"" >&2; exit 2 ;;
esac

failed=0
n=0

# Runs a command as a check: check WHAT COMMAND [ARG ...].
check() {
	local what=$1
	shift
	n=$((n + 1))
	if "$@"; then
		echo "ok $n - $what"
	else
		echo "not ok $n - $what"
		failed=$((failed + 1))
	fi
}

# Whether two values are equal; says both when not.
eq() { [ "$1" = "$2" ] || { echo "# got '$1', want '$2'" >&2; return 1; }; }

# Ends the test: the summary line, and the exit status.
finish() {
	echo "$((n - failed)) passed, $failed failed"
	[ "$failed" -eq 0 ]
}

# The block of a documentation page that a procedure's test runs as
# written: doc_block PAGE NAME prints the fenced block that follows the
# line "<!-- test/ops/SCRIPT: NAME -->" (SCRIPT the running script), its
# indentation (a list item's) taken off; fails when there is none.
TAP_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TAP_SCRIPT=$(basename "$0")
doc_block() {
	local out
	out=$(awk -v mark="<!-- test/ops/$TAP_SCRIPT: $2 -->" '
		{ line = $0; sub(/^[ \t]+/, "", line) }
		!found && line == mark { found = 1; next }
		found && !inside && line ~ /^```/ { inside = 1; match($0, /^[ \t]*/); indent = RLENGTH; next }
		inside && line ~ /^```/ { exit }
		inside { print substr($0, indent + 1) }' "$TAP_ROOT/$1")
	[ -n "$out" ] || { echo "# $1 has no block marked <!-- test/ops/$TAP_SCRIPT: $2 -->" >&2; return 1; }
	printf '%s\n' "$out"
}

# Waits at most SECONDS until QUERY prints "t" in database DB, run by the
# script's own psql function q (q DB ARGS...): until_sql SECONDS DB QUERY.
until_sql() {
	local seconds=$1 db=$2 query=$3 i
	for i in $(seq 1 $((seconds * 10))); do
		[ "$(q "$db" -c "$query" 2>/dev/null)" = t ] && return 0
		sleep 0.1
	done
	echo "# not true after $seconds s: $query" >&2
	return 1
}
