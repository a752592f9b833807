#!/usr/bin/env bash
# Runs all of pg_outbox's tests on a fresh Debian 12 machine: installs what
# is missing, builds, starts throwaway servers on loopback, runs the
# pg_regress tests and isolation specs, the relay's unit and integration
# tests, the demo, the example applications, the Debian packages (built,
# installed, the demo on them, removed), a soak test in each order, one of
# a sharded group on a Redis Cluster and one of network faults (skipped,
# and counted so, where the machine cannot make network namespaces), and
# ends with one summary line.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

ensure_packages
build_extension
make -s checkver

passed=0
failed=0
skipped=0
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT

# Adds up the counts of a pg_regress or pg_isolation_regress run.
count_regress() {
	local out=$1
	passed=$((passed + $(grep -cE '^(test| ) *[A-Za-z0-9_]+ +\.\.\. ok' "$out" || true)))
	failed=$((failed + $(grep -cE '\.\.\. FAILED' "$out" || true)))
}

# Runs a make target of pg_regress tests and isolation specs on a
# throwaway cluster with the given pg_virtualenv options, prints the
# diffs of failures and the output, and adds up the counts:
# installcheck_on NAME TARGET [pg_virtualenv option ...]. pg_virtualenv
# creates a temporary cluster on a free port, runs the command with PG*
# set, then stops and removes the cluster.
installcheck_on() {
	local name=$1 target=$2 d
	shift 2
	rm -rf test/results test/isolation
	if ! pg_virtualenv -v 15 -o max_prepared_transactions=10 "$@" \
			make -s PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config "$target" >"$log/$name" 2>&1; then
		for d in test/regression.diffs test/isolation/regression.diffs; do
			[ -f "$d" ] && cat "$d"
		done
	fi
	cat "$log/$name"
	count_regress "$log/$name"
}

say "pg_regress and isolation specs on a throwaway cluster"
installcheck_on regress installcheck

say "the same on a cluster set up as the README recommends (pg_outbox preloaded)"
installcheck_on regress-preloaded installcheck -o shared_preload_libraries=pg_outbox

say "commit-order tests on a throwaway cluster that preloads pg_outbox"
installcheck_on preload installcheck-preload -o shared_preload_libraries=pg_outbox

# Runs a test script that prints an "ok" or "not ok" line per check and
# ends with "N passed, N failed", and adds up its checks (one failure more
# when it ended otherwise): tap_step NAME COMMAND [ARG ...].
tap_step() {
	local name=$1
	shift
	"$@" >"$log/$name" 2>&1 || true
	grep -E '^(ok|not ok) |^#   ' "$log/$name" || true
	passed=$((passed + $(grep -cE '^ok ' "$log/$name" || true)))
	failed=$((failed + $(grep -cE '^not ok ' "$log/$name" || true)))
	if ! grep -qE '^[0-9]+ passed, 0 failed$' "$log/$name"; then
		grep -qE '^not ok ' "$log/$name" || failed=$((failed + 1))
		cat "$log/$name"
	fi
}

for script in test/ops/*.sh; do
	say "operations: $script on a throwaway cluster that preloads pg_outbox"
	tap_step ops pg_virtualenv -v 15 -o max_prepared_transactions=10 -o shared_preload_libraries=pg_outbox \
		bash "$script"
done

# Runs ctest in build/ with these arguments, prints its output, and adds
# up its counts (one failure when it printed none): ctest_step NAME ARG ...
ctest_step() {
	local name=$1 total bad
	shift
	(cd build && ctest --output-on-failure --timeout 300 "$@") >"$log/$name" 2>&1 || true
	cat "$log/$name"
	total=$(sed -n 's/.* tests failed out of \([0-9]*\).*/\1/p' "$log/$name" | tail -1)
	bad=$(sed -n 's/.*tests passed, \([0-9]*\) tests failed out of.*/\1/p' "$log/$name" | tail -1)
	if [ -z "$total" ]; then
		failed=$((failed + 1))
	else
		passed=$((passed + total - bad))
		failed=$((failed + bad))
	fi
}

say "relay: build, unit tests, integration tests (own PostgreSQL and Redis per test)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPG_OUTBOX_WERROR=ON >/dev/null
cmake --build build -j"$(nproc)" >"$log/build" 2>&1 || { cat "$log/build"; exit 1; }
ctest_step ctest -j2 -LE cluster

# One at a time: each starts 6 redis-server nodes (redis-cli --cluster
# create, from redis-tools) and times failovers of about a second, which
# a second test's load on the machine would stretch.
say "relay: Redis Cluster tests (own PostgreSQL and a 3-master, 3-replica cluster per test)"
ctest_step ctest-cluster -L cluster

say "layout: no include cycle among the extension's files; the relay reads no table of the extension's (test/layout.sh)"
tap_step layout ./test/layout.sh

say "monitoring: the alert rules and the dashboard parse and name only metrics the relay exposes (test/monitoring.sh)"
tap_step monitoring ./test/monitoring.sh

say "the demo (make demo), which must pass on its own servers"
if ./scripts/demo.sh >"$log/demo" 2>&1; then
	passed=$((passed + 1))
	tail -n 12 "$log/demo"
else
	failed=$((failed + 1))
	cat "$log/demo"
fi

say "the README's getting-started sequence, as written (test/readme.sh)"
tap_step readme ./test/readme.sh

for example in python node go; do
	say "the $example example (examples/run.sh $example: order service, relay, consumer, on its own servers)"
	if ./examples/run.sh "$example" >"$log/example" 2>&1; then
		passed=$((passed + 1))
		tail -n 14 "$log/example"
	else
		failed=$((failed + 1))
		cat "$log/example"
	fi
done

say "Debian packages: build, install, the demo on the installed files, remove (holding the install lock)"
tap_step packages ./test/packages/debian.sh

for ordering in commit xid8; do
	say "the soak test in $ordering order (40 seconds of faults, then the history checker)"
	if SOAK_SECONDS=40 SOAK_ORDERING=$ordering ./test/soak/soak.sh >"$log/soak" 2>&1; then
		passed=$((passed + 1))
		tail -n 14 "$log/soak"
	else
		failed=$((failed + 1))
		cat "$log/soak"
	fi
done

say "the soak test of a 4-shard group on a Redis Cluster of 3 masters and 3 replicas (40 seconds of faults, then the history checker)"
if SOAK_SECONDS=40 SOAK_MODE=sharded-cluster ./test/soak/soak.sh >"$log/soak" 2>&1; then
	passed=$((passed + 1))
	tail -n 17 "$log/soak"
else
	failed=$((failed + 1))
	cat "$log/soak"
fi

say "the soak test of network faults: PostgreSQL and Redis behind veth pairs, links cut by iptables and link down (60 seconds of faults, then the history checker)"
rc=0
SOAK_SECONDS=60 SOAK_MODE=network ./test/soak/soak.sh >"$log/soak" 2>&1 || rc=$?
if [ "$rc" -eq 0 ]; then
	passed=$((passed + 1))
	sed -n '/^==> faults injected/,$p' "$log/soak"
elif [ "$rc" -eq 77 ]; then
	skipped=$((skipped + 1))
	tail -n 1 "$log/soak"
else
	failed=$((failed + 1))
	cat "$log/soak"
fi

echo
if [ "$skipped" -gt 0 ]; then
	echo "${passed} passed, ${failed} failed, ${skipped} skipped"
else
	echo "${passed} passed, ${failed} failed"
fi
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
