#!/usr/bin/env bash
# The server's cost of a leader's calls, per call: outbox_fetch_packed()
# and outbox_fetch() on an empty feed and with a batch of 100 events, and
# outbox_advance() (with streams, so that every call writes the row), in
# xid8 and commit order, beside SELECT 1. Compares servers: each argument
# is LABEL=SOCKET_DIR:PORT of a running server that preloads pg_outbox;
# the rounds interleave them. Prints milliseconds per call, as pgbench -r
# reports them (one client, one connection, -T seconds a script), each
# round's, then the median of the rounds (an even number of rounds runs
# the servers in each order equally often). Commits do not wait for the WAL
# flush (synchronous_commit off, as the relay's advances with explicit
# ids): the figures are the calls' own cost, not the disk's.
#
#   bench/fetch_advance.sh [-r ROUNDS] [-T SECONDS] before=/tmp/a:5432 after=/tmp/b:5433
#
# Defaults: 4 rounds of 3 seconds a script.
set -euo pipefail

rounds=4
seconds=3
while getopts "r:T:" o; do
	case $o in
		r) rounds=$OPTARG ;;
		T) seconds=$OPTARG ;;
		*) exit 2 ;;
	esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { echo "usage: $0 [-r ROUNDS] [-T SECONDS] LABEL=SOCKET_DIR:PORT ..." >&2; exit 2; }
PGBENCH=${PGBENCH:-/usr/lib/postgresql/15/bin/pgbench}
db=fetch_advance_bench
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"

# Groups, per order o: e_o (the cursor at its last event: an empty feed,
# and the position its advances go to) and b_o (100 events ahead of the
# cursor, which never moves: the same batch every call).
setup() {
	psql -X -q -v ON_ERROR_STOP=1 -h "$1" -p "$2" -U postgres -d postgres -c "DROP DATABASE IF EXISTS $db" \
		-c "CREATE DATABASE $db" >/dev/null
	psql -X -q -v ON_ERROR_STOP=1 -h "$1" -p "$2" -U postgres -d "$db" >/dev/null <<'SQL'
CREATE EXTENSION pg_outbox;
SELECT outbox_group_create(g || '_' || o, start_at => 'beginning', ordering => o)
  FROM unnest(ARRAY['e', 'b']) g, unnest(ARRAY['xid8', 'commit']) o;
SELECT outbox_emit('t', (n % 10)::text, jsonb_build_object('n', n)) FROM generate_series(1, 100) n;
SQL
}

# The position of the last event of group e_o (read by a session that
# ends at once: the benchmark's session takes the lead after it).
last_pos() {
	psql -X -q -At -v ON_ERROR_STOP=1 -h "$1" -p "$2" -U postgres -d "$db" \
		-c "SELECT pos FROM outbox_fetch('e_$3', 1000) ORDER BY txid DESC, seq DESC LIMIT 1" \
		-c "SELECT outbox_resign('e_$3')" | sed -n 1p
}

# Runs one script; prints "statement ms" lines from pgbench -r.
run() {
	local host=$1 port=$2 script=$3
	runuser -u postgres -- "$PGBENCH" -n -c 1 -T "$seconds" -r -h "$host" -p "$port" -U postgres -f "$script" "$db" |
		awk '/^statement latencies/ { on = 1; next } on && NF >= 3 { ms = $1; $1 = ""; $2 = ""; print substr($0, 3) "\t" ms }'
}

declare -A pos
for server in "$@"; do
	label=${server%%=*}
	hp=${server#*=}
	setup "${hp%:*}" "${hp##*:}"
	for o in xid8 commit; do
		pos[$label.$o]=$(last_pos "${hp%:*}" "${hp##*:}" "$o")
	done
done

export PGOPTIONS="-c synchronous_commit=off"
servers=("$@")
reversed=()
for ((i = ${#servers[@]} - 1; i >= 0; i--)); do reversed+=("${servers[i]}"); done
for r in $(seq 1 "$rounds"); do
	# Every other round in reverse order: the load of a shared machine
	# drifts, and the server measured first would otherwise pay for it.
	if ((r % 2)); then order=("${servers[@]}"); else order=("${reversed[@]}"); fi
	for server in "${order[@]}"; do
		label=${server%%=*}
		hp=${server#*=}
		echo "SELECT 1;" >"$work/one.sql"
		run "${hp%:*}" "${hp##*:}" "$work/one.sql" | sed "s/^/$label\tround $r\t/" | tee -a "$work/all"
		for o in xid8 commit; do
			p=${pos[$label.$o]}
			cat >"$work/cycle.sql" <<-SQL
				SELECT outbox_fetch_packed('e_$o', 1000);
				SELECT count(*) FROM outbox_fetch('e_$o', 1000);
				SELECT outbox_advance('e_$o', '$p', '{"s": "$p"}');
				SELECT outbox_fetch_packed('b_$o', 1000);
				SELECT count(*) FROM outbox_fetch('b_$o', 1000);
			SQL
			run "${hp%:*}" "${hp##*:}" "$work/cycle.sql" | sed "s/^/$label\tround $r\t/" | tee -a "$work/all"
		done
	done
done

# The median of the rounds, a column per server (positions vary by server:
# they are left out of the statement's text).
echo
echo "median ms per call over $rounds rounds"
labels=$(for server in "$@"; do printf '%s ' "${server%%=*}"; done)
sed -E "s/'[0-9]+-[0-9]+'/'POS'/g; s/\"[0-9]+-[0-9]+\"/\"POS\"/g" "$work/all" |
	awk -F'\t' -v labels="$labels" '
		{ key = $3; if (!(key in seen)) { seen[key] = 1; order[++n] = key } v[key, $1, ++c[key, $1]] = $4 }
		function median(key, l,   k, i, j, t, a) {
			k = c[key, l]; for (i = 1; i <= k; i++) a[i] = v[key, l, i]
			for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
			return k ? a[int((k + 1) / 2)] : "-"
		}
		END {
			m = split(labels, L, " ")
			printf "%-70s", "statement"; for (i = 1; i <= m; i++) printf "%10s", L[i]; printf "\n"
			for (j = 1; j <= n; j++) {
				printf "%-70s", order[j]; for (i = 1; i <= m; i++) printf "%10.3f", median(order[j], L[i]); printf "\n"
			}
		}'
