#!/usr/bin/env bash
# Checks the boundaries the code is organised by, which no compiler
# checks: the extension's files include each other without a cycle (each
# part calls only the parts below it), and the relay reads PostgreSQL only
# through the extension's functions, never its tables (outbox.<table> in a
# query of relay/src). Prints an "ok"/"not ok" line per check, then
# "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
. test/ops/tap.bash

# "a b" for each extension file a that includes the header of another, b.
include_edges() {
	local f h
	for f in extension/*.c extension/*.h; do
		for h in $(sed -n 's/^#include "\([a-z_]*\)\.h"$/\1/p' "$f"); do
			[ "$(basename "${f%.*}")" = "$h" ] || echo "$(basename "${f%.*}") $h"
		done
	done
}

no_include_cycle() {
	local edges out
	edges=$(include_edges)
	[ -n "$edges" ] || { echo "# no includes found" >&2; return 1; }
	# tsort names the members of a cycle on stderr and still exits 0 on
	# some versions: a cycle is any such line.
	out=$(echo "$edges" | tsort 2>&1 >/dev/null)
	[ -z "$out" ] || { echo "# $out" >&2; return 1; }
}
check "the extension's files include each other without a cycle" no_include_cycle

# The relay's queries name functions (outbox_fetch(...), outbox_groups())
# and never a relation of the extension's schema.
TABLE_READ='\b(from|join|update|into)[[:space:]]+outbox\.[a-z_]+'
relay_reads_no_table() {
	local hits
	hits=$(grep -niE "$TABLE_READ" relay/src/*.cpp relay/include/pg_outbox/*.hpp || true)
	[ -z "$hits" ] || { echo "# $hits" >&2; return 1; }
}
check "the relay's queries read no table of the extension's" relay_reads_no_table

# The two checks find what they look for.
check "the table-read pattern matches a query that reads outbox.groups" \
	grep -qiE "$TABLE_READ" <<<'    "SELECT streams FROM outbox.groups WHERE name = $1";'
finds_a_cycle() { [ -n "$(printf 'emit writer\nwriter emit\n' | tsort 2>&1 >/dev/null)" ]; }
check "tsort reports an include cycle" finds_a_cycle

finish
