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

# Redis's error replies become typed exceptions in the connection layer
# only (redis_error.hpp: throw_error(), Replies::get()); the rest of the
# relay catches classes, and looks at a raw reply only through is_error().
# consumer.cpp is the one remaining exception, until consume reads
# through RedisTarget alone.
REDIS_LAYER='relay/(src|include/pg_outbox)/redis(_cluster|_error|_target)?\.(cpp|hpp)$'
REDIS_ERROR_EXCEPTIONS='relay/src/consumer\.cpp$'
raw_redis_error_checks() {
	local f
	for f in "$@"; do
		grep -qE "$REDIS_LAYER" <<<"$f" && continue
		grep -qE "$REDIS_ERROR_EXCEPTIONS" <<<"$f" && continue
		grep -Hn 'REDIS_REPLY_ERROR' "$f"
	done
}
no_raw_redis_error_check() {
	local hits
	hits=$(raw_redis_error_checks relay/src/*.cpp relay/include/pg_outbox/*.hpp)
	[ -z "$hits" ] || { echo "# $hits" >&2; return 1; }
}
check "no Redis error reply is checked raw outside the connection layer" no_raw_redis_error_check

# The checks find what they look for.
finds_raw_redis_error_check() {
	local dir out
	dir=$(mktemp -d)
	mkdir -p "$dir/relay/src"
	echo 'if (r->type == REDIS_REPLY_ERROR) return;' >"$dir/relay/src/stream_writer.cpp"
	echo 'if (r->type == REDIS_REPLY_ERROR) return;' >"$dir/relay/src/redis.cpp"
	out=$(cd "$dir" && raw_redis_error_checks relay/src/stream_writer.cpp relay/src/redis.cpp)
	rm -r "$dir"
	eq "$out" "relay/src/stream_writer.cpp:1:if (r->type == REDIS_REPLY_ERROR) return;"
}
check "the Redis error check finds a raw check outside the connection layer only" finds_raw_redis_error_check

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
finds_a_cycle() { [ -n "$(printf 'emit writer\nwriter emit\n' | tsort 2>&1 >/dev/null)" ]; }
check "tsort reports an include cycle" finds_a_cycle

finish
