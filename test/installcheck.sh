#!/usr/bin/env bash
# Runs a make target of pg_regress tests and isolation specs on a
# throwaway cluster with the given pg_virtualenv options (which creates a
# cluster on a free port, runs the command with PG* set, then stops and
# removes it), and prints the diffs of failures:
# test/installcheck.sh TARGET [VAR=value ...] [pg_virtualenv option ...],
# each VAR=value given to make (REGRESS= runs no pg_regress test,
# ISOLATION= no spec). A ctest test of the suite (test/CMakeLists.txt);
# exits non-zero when a test failed or the run did not finish.
set -uo pipefail
cd "$(dirname "$0")/.."
target=$1
shift
make_args=()
while [ $# -gt 0 ] && [[ $1 =~ ^[A-Z_]+= ]]; do
	make_args+=("$1")
	shift
done
rm -rf test/results test/isolation test/engine_sql
if pg_virtualenv -v 15 -o max_prepared_transactions=10 "$@" \
		make -s PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config "$target" "${make_args[@]}"; then
	exit 0
fi
for d in test/regression.diffs test/isolation/regression.diffs \
	test/engine_sql/regression.diffs test/engine_sql/isolation/regression.diffs; do
	[ -f "$d" ] && cat "$d"
done
exit 1
