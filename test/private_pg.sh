#!/usr/bin/env bash
# The pg_regress tests and isolation specs without a system install: the
# extension installed into a private copy of PostgreSQL's tree
# (PG_OUTBOX_DESTDIR, default build/pgtree: /usr/lib/postgresql/15 and
# /usr/share/postgresql/15 copied under it when missing), and a throwaway
# cluster started from that tree by the test kit, preloading pg_outbox
# with max_prepared_transactions = 10, as the suites need.
#
#   test/private_pg.sh tree         build the extension, install it into the tree
#   test/private_pg.sh start        start the cluster (its PG* settings in
#                                   build/private_pg.env)
#   test/private_pg.sh make TARGET [VAR=value ...]
#                                   make TARGET against the running cluster
#                                   (make installcheck REGRESS=... ISOLATION=...)
#   test/private_pg.sh exec COMMAND [ARG ...]
#                                   a command with the cluster's PG* set
#                                   (an operations script: exec bash
#                                   test/ops/dump_restore.sh)
#   test/private_pg.sh stop         stop it by PID, remove it
#   test/private_pg.sh run [NAME ...]
#                                   all four in one: the tests and specs
#                                   named (test/sql/NAME.sql,
#                                   test/specs/NAME.spec; the commit order's
#                                   run with make installcheck-preload), or
#                                   every one that needs no other engine
#
# ctest runs tree, start and stop as fixtures of the steps that run make
# (test/CMakeLists.txt, label fast). A failed run prints the diffs. As
# root, the cluster runs as the postgres user (the test kit's rule), so
# its directory is made under /tmp.
set -uo pipefail
cd "$(dirname "$0")/.."
export PG_OUTBOX_DESTDIR=${PG_OUTBOX_DESTDIR:-$PWD/build/pgtree}
. scripts/lib.sh

PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config
ENV_FILE=$PWD/build/private_pg.env

tree() {
	local d
	for d in /usr/lib/postgresql/15 /usr/share/postgresql/15; do
		if [ ! -d "$PG_OUTBOX_DESTDIR$d" ]; then
			mkdir -p "$(dirname "$PG_OUTBOX_DESTDIR$d")" && cp -a "$d" "$PG_OUTBOX_DESTDIR$d" || return 1
		fi
	done
	make -s PG_CONFIG=$PG_CONFIG >/dev/null &&
		make -s PG_CONFIG=$PG_CONFIG install DESTDIR="$PG_OUTBOX_DESTDIR" >/dev/null
}

start() {
	local dir port
	[ ! -f "$ENV_FILE" ] || stop
	mkdir -p "$(dirname "$ENV_FILE")"
	dir=$(mktemp -d /tmp/pg_outbox_private.XXXXXX) && chmod 755 "$dir" || return 1
	port=$(free_port) || return 1
	pg_start "$dir/pg" "$port" 'max_prepared_transactions = 10' "shared_preload_libraries = 'pg_outbox'" || {
		cat "$dir/pg/server.log" >&2 2>/dev/null
		rm -rf "$dir"
		return 1
	}
	printf 'export PGHOST=%q PGPORT=%q PGUSER=postgres PRIVATE_PG_DIR=%q\n' "$dir/pg" "$port" "$dir" >"$ENV_FILE"
}

stop() {
	[ -f "$ENV_FILE" ] || return 0
	. "$ENV_FILE"
	testkit stop --dir "$PRIVATE_PG_DIR" >/dev/null
	rm -rf "$PRIVATE_PG_DIR" "$ENV_FILE"
}

run_make() {
	local d
	[ -f "$ENV_FILE" ] || { echo "no cluster: test/private_pg.sh start first" >&2; return 1; }
	. "$ENV_FILE"
	rm -rf test/results test/isolation test/regression.diffs test/regression.out
	make -s PG_CONFIG=$PG_CONFIG "$@" && return 0
	for d in test/regression.diffs test/isolation/regression.diffs; do
		[ -f "$d" ] && cat "$d"
	done
	return 1
}

# The named tests, each in the make target that runs its kind.
run() {
	local name regress=() isolation=() preload_regress=() preload_isolation=() preload rc=0
	preload=" $(make -s PG_CONFIG=$PG_CONFIG print-PRELOAD_REGRESS print-PRELOAD_ISOLATION | tr '\n' ' ') "
	for name in "$@"; do
		if ! [[ $name =~ ^[A-Za-z0-9_]+$ ]]; then
			echo "\"$name\" is no test's name (test/sql/NAME.sql, test/specs/NAME.spec)" >&2
			return 2
		elif [ -f "test/sql/$name.sql" ]; then
			if [[ $preload == *" $name "* ]]; then preload_regress+=("$name"); else regress+=("$name"); fi
		elif [ -f "test/specs/$name.spec" ]; then
			if [[ $preload == *" $name "* ]]; then preload_isolation+=("$name"); else isolation+=("$name"); fi
		else
			echo "no test/sql/$name.sql nor test/specs/$name.spec" >&2
			return 2
		fi
	done
	tree || return 1
	start || return 1
	trap stop EXIT
	if [ $# -eq 0 ]; then
		run_make installcheck || rc=1
		run_make installcheck-preload || rc=1
	else
		if [ ${#regress[@]} -gt 0 ] || [ ${#isolation[@]} -gt 0 ]; then
			run_make installcheck REGRESS="${regress[*]}" ISOLATION="${isolation[*]}" || rc=1
		fi
		if [ ${#preload_regress[@]} -gt 0 ] || [ ${#preload_isolation[@]} -gt 0 ]; then
			run_make installcheck-preload PRELOAD_REGRESS="${preload_regress[*]}" \
				PRELOAD_ISOLATION="${preload_isolation[*]}" || rc=1
		fi
	fi
	return $rc
}

case ${1:-} in
tree) tree ;;
start) start ;;
stop) stop ;;
make) shift; run_make "$@" ;;
exec)
	shift
	[ -f "$ENV_FILE" ] || { echo "no cluster: test/private_pg.sh start first" >&2; exit 1; }
	. "$ENV_FILE"
	exec "$@"
	;;
run) shift; run "$@" ;;
*) sed -n '2,/^set -uo/p' "$0" | sed -n 's/^# \{0,1\}//p' >&2; exit 2 ;;
esac
