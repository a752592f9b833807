#!/usr/bin/env bash
# make check-fast: the tests a contributor runs before each commit, those
# of ctest's label fast (test/CMakeLists.txt), which need no system install
# and no soak: the C engine's pg_regress tests and isolation specs on a
# throwaway cluster from a private copy of PostgreSQL's tree in
# build/pgtree (test/private_pg.sh), the relay's unit tests, the layout
# checks. Builds what they need first: the extension, the test kit and the
# unit tests (the first build of the relay's library takes minutes; later
# ones only what changed), in build/, configured with PG_OUTBOX_SUITE=ON.
# Arguments go to ctest (scripts/check_fast.sh -R regress). Ends with
# ctest's summary line.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

say "building the extension"
make -s PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config >/dev/null

say "building the test kit and the relay's unit tests"
if ! grep -qs '^PG_OUTBOX_SUITE:BOOL=ON$' build/CMakeCache.txt; then
	cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPG_OUTBOX_SUITE=ON >/dev/null
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
nice cmake --build build -j"$(nproc)" --target pg_outbox_testkit relay_unit_tests >"$log" 2>&1 || { cat "$log"; exit 1; }

say "the tests of label fast"
ctest_summarized -L fast -j2 --output-on-failure "$@"
