#!/usr/bin/env bash
# Runs all of pg_outbox's tests on a fresh Debian 12 machine: installs what
# is missing, builds and installs the extension, builds the relay, its
# tests and the test kit, then runs every test as a ctest test (see
# test/CMakeLists.txt): the pg_regress tests and isolation specs, the
# operations scripts, the relay's unit, integration and Redis Cluster
# tests, the layout and monitoring checks, the demo, the README's
# sequence, the example applications, the CloudEvents conformance test
# (with the CloudEvents SDK), the Debian packages (built,
# installed, the demo on them, removed), a soak test in each order, one of
# a sharded group on a Redis Cluster and one of network faults (skipped,
# and counted so, where the machine cannot make network namespaces).
# Ends with ctest's summary line ("N% tests passed, N tests failed out
# of N"), printed again last, after the label times and the list of
# failed tests that ctest prints after it; a failed test's output is
# printed in full.
#
# Arguments go to ctest: scripts/test.sh -L regress runs one label,
# scripts/test.sh -R '^soak/' some tests (ctest -N in build/ lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

ensure_packages
build_extension
make -s checkver

say "building the relay, its tests and the test kit"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPG_OUTBOX_WERROR=ON -DPG_OUTBOX_SUITE=ON >/dev/null
cmake --build build -j"$(nproc)" >"$log" 2>&1 || { cat "$log"; exit 1; }

say "every test, two at a time, those that need the machine alone one at a time"
ctest_summarized --output-on-failure --timeout 300 -j2 "$@"
