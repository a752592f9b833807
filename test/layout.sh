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
finds_a_cycle() { [ -n "$(printf 'emit writer\nwriter emit\n' | tsort 2>&1 >/dev/null)" ]; }
check "tsort reports an include cycle" finds_a_cycle

# The SQLSTATEs of pg_outbox's own (class OB) are defined once per
# language: extension/sqlstates.h (C), the comment table of
# sql/install/00_schema_roles.sql (SQL), relay/include/pg_outbox/sqlstates.hpp
# (the relay). Each prints "code name" lines, the name in lower case with
# underscores.
sqlstates_c() {
	sed -n 's/^#define OUTBOX_SQLSTATE_\([A-Z_]*\)[[:space:]]*"\(OB[0-9]\{3\}\)"$/\2 \1/p' extension/sqlstates.h |
		awk '{ print $1, tolower($2) }' | sort
}
sqlstates_sql() {
	sed -n 's/^--   \(OB[0-9]\{3\}\)[[:space:]]\{1,\}\([a-z_]\{1,\}\)[[:space:]].*/\1 \2/p' sql/install/00_schema_roles.sql | sort
}
sqlstates_relay() {
	sed -n 's/^inline constexpr std::string_view k\([A-Za-z]*\) = "\(OB[0-9]\{3\}\)";$/\2 \1/p' \
		relay/include/pg_outbox/sqlstates.hpp |
		sed 's/\([a-z]\)\([A-Z]\)/\1_\2/g' | awk '{ print $1, tolower($2) }' | sort
}
sqlstates_agree() {
	local c
	c=$(sqlstates_c)
	[ "$(wc -l <<<"$c")" -ge 4 ] || { echo "# extension/sqlstates.h: $c" >&2; return 1; }
	eq "$(sqlstates_sql)" "$c" && eq "$(sqlstates_relay)" "$c"
}
check "the OB SQLSTATEs of C, SQL and the relay are one table" sqlstates_agree

# No OB code written as a literal outside its one definition: in C a
# MAKE_SQLSTATE('O', 'B', ...) or a "OBnnn" string; in the relay a "OBnnn"
# string; in SQL a quoted 'OBnnn' anywhere but a RAISE's ERRCODE, and there
# only a code of the table.
OB_C="\"OB[0-9]{3}\"|'O', *'B'"
no_ob_literal_c() {
	local hits
	hits=$(grep -nE "$OB_C" extension/*.[ch] | grep -v '^extension/sqlstates\.h:' || true)
	[ -z "$hits" ] || { echo "# $hits" >&2; return 1; }
}
check "no OB SQLSTATE literal in the extension's C outside sqlstates.h" no_ob_literal_c
no_ob_literal_relay() {
	local hits
	hits=$(grep -nE '"OB[0-9]{3}"' relay/src/*.cpp relay/include/pg_outbox/*.hpp |
		grep -v '^relay/include/pg_outbox/sqlstates\.hpp:' || true)
	[ -z "$hits" ] || { echo "# $hits" >&2; return 1; }
}
check "no OB SQLSTATE literal in the relay outside sqlstates.hpp" no_ob_literal_relay
ob_literals_sql() {
	local table hits bad=""
	table=$(sqlstates_sql | cut -d' ' -f1)
	hits=$(grep -noE "[^ ]* *= *'OB[0-9]{3}'" "$@" || true)
	while IFS= read -r h; do
		[ -n "$h" ] || continue
		if ! grep -qE "ERRCODE = 'OB[0-9]{3}'$" <<<"$h" ||
			! grep -qx "$(grep -oE 'OB[0-9]{3}' <<<"$h")" <<<"$table"; then
			bad+="$h "
		fi
	done <<<"$hits"
	# Any other quoted code (not after "ERRCODE = ").
	hits=$(grep -nE "'OB[0-9]{3}'" "$@" | grep -vE "ERRCODE = 'OB[0-9]{3}'" || true)
	bad+="$hits"
	[ -z "$bad" ] || { echo "# $bad" >&2; return 1; }
}
check "SQL names an OB SQLSTATE only in a RAISE's ERRCODE, and only one of the table" \
	ob_literals_sql sql/install/*.sql
finds_ob_literals() {
	local dir rc=0
	dir=$(mktemp -d)
	printf "SELECT 'OB002';\n" >"$dir/a.sql"
	printf "\tRAISE EXCEPTION 'x' USING ERRCODE = 'OB009';\n" >"$dir/b.sql"
	! ob_literals_sql "$dir/a.sql" 2>/dev/null || rc=1
	! ob_literals_sql "$dir/b.sql" 2>/dev/null || rc=1
	printf "\tRAISE EXCEPTION 'x' USING ERRCODE = 'OB001';\n" >"$dir/c.sql"
	ob_literals_sql "$dir/c.sql" || rc=1
	rm -r "$dir"
	return $rc
}
check "the SQL check refuses a stray OB literal and a code not in the table" finds_ob_literals

# One grammar of group names, "<group>/<shard>": extension/group.c parses
# it (outbox.split_group_name(), outbox.group_of()); no other C file looks
# for the slash of a group name and no SQL part splits one. The relay's
# parser is relay/src/config.cpp's split_group_name(), checked against the
# extension's by test/vectors/group_names.txt; no other relay file looks
# for the slash in a group's name.
GRAMMAR_SQL="strpos\([^)]*'/'\)|split_part\([^)]*'/'|regexp_[a-z]*\([^)]*/|position\('/'"
one_group_grammar() {
	local hits
	hits=$( (grep -nE "(memchr|strchr|strrchr)\([^)]*'/'" extension/*.c | grep -v '^extension/group\.c:'
		grep -nE "$GRAMMAR_SQL" sql/install/*.sql
		grep -nE "group.*'/'|'/'.*group" relay/src/*.cpp relay/include/pg_outbox/*.hpp |
			grep -v '^relay/src/config\.cpp:') ||
		true)
	[ -z "$hits" ] || { echo "# $hits" >&2; return 1; }
}
check "group names are parsed in extension/group.c (and the relay's config.cpp) only" one_group_grammar
check "the grammar check matches an ad-hoc split" \
	grep -qE "$GRAMMAR_SQL" <<<"	IF strpos(group_name, '/') > 0 THEN"

# Every invariant the code, tests and docs cite ("I-10") is defined in
# doc/design.md.
invariants_defined() {
	local cited defined missing
	cited=$(grep -rhoE '\bI-[0-9]+\b' extension sql relay/src relay/include relay/tests test scripts bench \
		README.md 2>/dev/null | sort -u)
	defined=$(sed -n 's/^## \(I-[0-9]*\) .*/\1/p' doc/design.md | sort -u)
	missing=$(comm -23 <(echo "$cited") <(echo "$defined"))
	[ -n "$defined" ] && [ -z "$missing" ] || { echo "# not in doc/design.md: $missing" >&2; return 1; }
}
check "every invariant cited (I-NN) is defined in doc/design.md" invariants_defined

finish
