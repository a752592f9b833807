#!/usr/bin/env bash
# Checks the boundaries the code is organised by, which no compiler
# checks: the extension's files include each other without a cycle (each
# part calls only the parts below it), and the relay reads PostgreSQL only
# through the extension's functions, never its tables (outbox.<table> in a
# query of relay/src), and only the test kit starts throwaway servers.
# Prints an "ok"/"not ok" line per check, then
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

# Every statement of the relay's (a string literal, adjacent literals
# joined, that starts with SELECT or WITH) names each function, operator
# and type with its schema and types each parameter: no object another
# role planted in a schema on the search_path can be chosen instead
# (DESIGN.md, I-17). Prints "file: fault: statement" for each fault.
relay_sql_faults() {
	perl -e '
		my %construct = map { $_ => 1 } qw(select from where and or not on join then else when as by in
			exists values any all array row coalesce nullif greatest least extract operator case is with);
		sub faults {
			my ($sql) = @_;
			my @f;
			(my $s = $sql) =~ s/'"'"'(?:[^'"'"']|'"'"''"'"')*'"'"'/ /g;    # SQL strings
			$s =~ s/OPERATOR\(pg_catalog\.[^)]+\)/ /g;
			$s =~ s/\$\d+::pg_catalog\.\w+(\[\])?/ /g;                  # typed parameters
			push @f, "untyped parameter $1" if $s =~ /(\$\d++)(?!::)/;
			$s =~ s/::pg_catalog\.\w+(\[\])?/ /g;
			push @f, "cast to an unqualified type" if $s =~ /::/;
			while ($s =~ /(?<![\w.@])([A-Za-z_]\w*)\s*\(/g) {
				push @f, "unqualified call of $1" unless $construct{lc $1};
			}
			$s =~ s/(\@extschema\@|pg_catalog)\.\w+/ /g;
			push @f, "unqualified operator $1" if $s =~ /([-+*\/<>=!~|&%^#@?]+)/;
			return @f;
		}
		for my $file (@ARGV) {
			open(my $fh, "<", $file) or die "$file: $!";
			local $/;
			my $src = <$fh>;
			my (@parts, $open);
			my $flush = sub {
				my $sql = join "", @parts;
				@parts = ();
				$sql =~ s/\\(.)/$1/g;
				return unless $sql =~ /^\s*(SELECT|WITH)\b/;
				print "$file: $_: $sql\n" for faults($sql);
			};
			while ($src =~ m{\G(?:(//[^\n]*|/\*.*?\*/|\s+)|('"'"'(?:[^'"'"'\\\n]|\\.)*'"'"')|"((?:[^"\\\n]|\\.)*)"|(.))}gs) {
				if (defined $3) { push @parts, $3; }
				elsif (!defined $1) { $flush->(); }
			}
			$flush->();
		}
	' "$@"
}
relay_sql_qualified() {
	local hits
	hits=$(relay_sql_faults relay/src/*.cpp relay/include/pg_outbox/*.hpp)
	[ -z "$hits" ] || { echo "# $hits" >&2; return 1; }
}
check "the relay's statements qualify every function, operator and type and type every parameter" relay_sql_qualified

# The checks find what they look for.
finds_sql_faults() {
	local dir out
	dir=$(mktemp -d)
	cat >"$dir/bad.cpp" <<-'EOF'
		const char* a = "SELECT outbox_lead($1::pg_catalog.text)";
		const char* b = "SELECT @extschema@.outbox_lead($1)";
		const char* c = "SELECT x FROM @extschema@.f($1::pg_catalog.text)"
		                " WHERE x = 'a=b'";
		const char* d = "SELECT $1::text";
		const char* e = "SELECT @extschema@.f($1::pg_catalog.text, pg_catalog.now() - $2::pg_catalog.interval)";
		const char* ok = "SELECT @extschema@.f($1::pg_catalog.text) WHERE a OPERATOR(pg_catalog.=) 'x=y'";
	EOF
	out=$(relay_sql_faults "$dir/bad.cpp")
	rm -r "$dir"
	eq "$(cut -d: -f2 <<<"$out" | tr '\n' ,)" \
		" unqualified call of outbox_lead, untyped parameter \$1, unqualified operator =, cast to an unqualified type, unqualified operator -,"
}
check "the statement check finds unqualified calls, operators, casts and untyped parameters" finds_sql_faults

check "the table-read pattern matches a query that reads outbox.groups" \
	grep -qiE "$TABLE_READ" <<<'    "SELECT streams FROM outbox.groups WHERE name = $1";'
# Throwaway servers are started by the test kit only (test/kit: the
# relay's tests link it, the scripts run pg_outbox_testkit through
# scripts/lib.sh): no script, test or benchmark starts a PostgreSQL, a
# Redis, a Sentinel or a Redis Cluster of its own.
SERVER_START='redis-server[[:space:]]+(--port|--sentinel|[^[:space:]]+\.conf)|\binitdb[[:space:]]+-|pg_basebackup[[:space:]]+-|pg_ctl\b.*[[:space:]]start\b|--cluster[[:space:]]+create|"redis-server"|"initdb|"create"'
only_the_kit_starts_servers() {
	local hits
	hits=$(grep -nE "$SERVER_START" scripts/*.sh test/*.sh test/*/*.sh bench/*.sh examples/*.sh \
		relay/tests/*.cpp relay/tests/*.hpp bench/*.cpp test/soak/*.cpp 2>/dev/null |
		grep -vE '^test/layout\.sh:|^[^:]+:[0-9]+:[[:space:]]*(#|//)' || true)
	[ -z "$hits" ] || { echo "# $hits" >&2; return 1; }
}
check "only the test kit starts throwaway servers" only_the_kit_starts_servers
finds_server_starts() {
	local line
	for line in 'redis-server --port "$port" --bind 127.0.0.1 --dir "$dir"' \
		'pg_run initdb -D "$dir/data" -A trust -U postgres' \
		'pg_run pg_ctl -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null' \
		'redis-cli --cluster create "${addresses[@]}" --cluster-replicas 1' \
		'::execvp("redis-server", argv.data());'; do
		grep -qE "$SERVER_START" <<<"$line" || { echo "# not found: $line" >&2; return 1; }
	done
	! grep -qE "$SERVER_START" <<<'echo "Redis $(redis-server --version)"'
}
check "the server-start pattern finds redis-server, initdb, pg_ctl start and cluster create" finds_server_starts

finds_a_cycle() { [ -n "$(printf 'emit writer\nwriter emit\n' | tsort 2>&1 >/dev/null)" ]; }
check "tsort reports an include cycle" finds_a_cycle

finish
