#!/usr/bin/env bash
# Checks what monitoring/ ships: the Prometheus alert rules parse
# (promtool check rules) and fire as their tests say (promtool test rules);
# the Grafana dashboard is JSON whose queries parse as PromQL; every metric
# the rules and the dashboard name is one the relay exposes (the names in
# relay/src/metrics.cpp); docs/monitoring.md's table of metrics lists
# exactly those, and its table of alerts every alert of the rules. Prints
# an "ok"/"not ok" line per check, then "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

RULES=monitoring/prometheus/pg_outbox.rules.yml
RULE_TESTS=monitoring/prometheus/pg_outbox.rules.test.yml
DASHBOARD=monitoring/grafana/pg_outbox.json
n=0
passed=0
failed=0
check() {
	local what=$1
	shift
	n=$((n + 1))
	local out
	if out=$("$@" 2>&1); then
		echo "ok $n - $what"
		passed=$((passed + 1))
	else
		echo "not ok $n - $what"
		printf '%s\n' "$out" | sed 's/^/#   /'
		failed=$((failed + 1))
	fi
}
finish() {
	echo "$passed passed, $failed failed"
	[ "$failed" -eq 0 ]
	exit
}

command -v promtool >/dev/null && command -v jq >/dev/null || ensure_packages prometheus jq >/dev/null
check "promtool is installed (Debian package prometheus)" command -v promtool
check "jq is installed" command -v jq
[ "$failed" -eq 0 ] || finish

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

check "$RULES parses (promtool check rules)" promtool check rules "$RULES"
check "$RULE_TESTS: the alerts fire as expected (promtool test rules)" promtool test rules "$RULE_TESTS"
check "$DASHBOARD is JSON with panels" jq -e '(.panels | length) > 0 and .title != null' "$DASHBOARD"

# The dashboard's queries, with Grafana's variables given values, as
# recording rules: promtool then parses each as PromQL.
jq -r '[.. | objects | select(has("expr")) | .expr] | unique | .[]' "$DASHBOARD" >"$tmp/exprs"
{
	echo "groups:"
	echo "  - name: dashboard"
	echo "    rules:"
	i=0
	while IFS= read -r expr; do
		i=$((i + 1))
		expr=${expr//\$__rate_interval/5m}
		expr=${expr//\$group/.*}
		expr=${expr//\$consumer/.*}
		printf '      - record: dashboard:query%d\n        expr: %s\n' "$i" "$(jq -Rn --arg e "$expr" '$e')"
	done <"$tmp/exprs"
} >"$tmp/dashboard.rules.yml"
check "$DASHBOARD: its $(wc -l <"$tmp/exprs") queries parse as PromQL" promtool check rules "$tmp/dashboard.rules.yml"

names() { grep -ohE '\b(pg_outbox_relay|process)_[a-z0-9_]+' "$@" | grep -vx 'process_metrics' | sort -u; }
names relay/src/metrics.cpp >"$tmp/exposed"
check "the relay exposes metrics ($(wc -l <"$tmp/exposed") names in relay/src/metrics.cpp)" test -s "$tmp/exposed"
for file in "$RULES" "$DASHBOARD"; do
	names "$file" >"$tmp/used"
	check "$file names metrics ($(wc -l <"$tmp/used"))" test -s "$tmp/used"
	while IFS= read -r name; do
		check "$file: $name is a metric the relay exposes" grep -qx "$name" "$tmp/exposed"
	done <"$tmp/used"
done

# docs/monitoring.md, Metrics: the first column of the table.
sed -n '/^## Metrics$/,/^## /p' docs/monitoring.md | sed -n 's/^| `\([a-z0-9_]*\)` |.*/\1/p' | sort -u >"$tmp/documented"
check "docs/monitoring.md's table of metrics lists every metric the relay exposes" diff "$tmp/exposed" "$tmp/documented"

# docs/monitoring.md, Alerts worth setting: a row for every alert of the rules.
grep -oE '^ *- alert: [A-Za-z]+' "$RULES" | sed 's/.*: //' | sort >"$tmp/alerts"
sed -n '/^## Alerts worth setting$/,/^## /p' docs/monitoring.md | sed -n 's/^| `\(PgOutbox[A-Za-z]*\)` |.*/\1/p' | sort >"$tmp/alerts_documented"
check "docs/monitoring.md's table of alerts lists every alert of $RULES" diff "$tmp/alerts" "$tmp/alerts_documented"

finish
