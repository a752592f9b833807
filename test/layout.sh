#!/usr/bin/env bash
# Checks the boundaries the code is organised by, which no compiler
# checks: the extension's files include each other without a cycle (each
# part calls only the parts below it), and the relay reads PostgreSQL only
# through the extension's functions, never its tables (outbox.<table> in a
# query of relay/src), each upgrade script is built with every function
# of the install parts, none of them written by hand, and only the test
# kit starts throwaway servers. Prints an "ok"/"not ok" line per check,
# then "N passed, N failed".
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

# The relay's queries name functions (outbox_fetch(...), outbox_groups(),
# outbox.engine()) and never a relation of the extension's schema.
TABLE_READ='\b(from|join|update|into)[[:space:]]+outbox\.[a-z_]+([^a-z_(]|$)'
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

# The upgrade scripts are built (sql/upgrade.awk, as make runs it) from a
# hand part with the schema changes (sql/upgrade/A--B.sql) and the
# functions of the install parts. Read with a parser of its own (not the
# generator's): each statement of the install parts that makes or
# describes a function (CREATE FUNCTION, COMMENT ON, GRANT or REVOKE ON,
# ALTER FUNCTION) is in the built script as written (CREATE OR REPLACE for
# CREATE), and the hand part creates or comments none of their functions.
# The install parts are read with the C engine's functions put in (the
# upgrade scripts are the C engine's; the SQL engine starts at 0.2.0).
# Prints a line for each fault: upgrade_faults HAND_PART BUILT_SCRIPT.
c_engine_parts() {
	awk -v engine=c -v version=0 -f sql/engine.awk sql/install/*.sql
}
upgrade_faults() {
	local parts rc
	parts=$(mktemp)
	c_engine_parts >"$parts" || { rm -f "$parts"; return 1; }
	upgrade_faults_in "$1" "$2" "$parts"
	rc=$?
	rm -f "$parts"
	return $rc
}
upgrade_faults_in() {
	perl - "$1" "$2" "$3" <<'PERL'
use strict;
use warnings;
my ($hand, $built, @parts) = @ARGV;
sub slurp { open(my $fh, "<", $_[0]) or die "$_[0]: $!"; local $/; return <$fh>; }
# A statement's text up to its ";": dollar-quoted bodies, strings (E''
# strings with backslash escapes) and line comments may hold a ";".
my $body = qr{(?:\$(?<tag>\w*)\$.*?\$\k<tag>\$|\$|(?<![\w\$])[Ee]'(?:[^'\\]|\\.|'')*'|'(?:[^']|'')*'|--[^\n]*|[^;'\$-]|-)*?;}s;
my $function_stmt = qr{^((?:CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION|COMMENT\s+ON\s+FUNCTION|ALTER\s+FUNCTION
	|(?:GRANT|REVOKE)\s[^;]*?\sON\s+FUNCTION)\s$body)}mix;
sub norm { my $t = shift; $t =~ s/^CREATE\s+OR\s+REPLACE\s+FUNCTION/CREATE FUNCTION/mgi; return $t; }
my $script = norm(slurp($built));
my (%defined, $n);
for my $part (@parts) {
	my $text = slurp($part);
	while ($text =~ /$function_stmt/g) {
		my $stmt = $1;
		$n++;
		$defined{lc $1} = 1 if $stmt =~ /^CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+([^\s(]+)/i;
		next if index($script, norm($stmt)) >= 0;
		(my $first = $stmt) =~ s/\n.*//s;
		print "not in $built: $first ($part)\n";
	}
}
print "no function statement found in the install parts\n" unless $n;
my $text = slurp($hand);
while ($text =~ /^\s*(CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION|COMMENT\s+ON\s+FUNCTION)\s+([^\s(]+)/mgi) {
	print "$hand: $1 $2, a function of the install parts\n" if $defined{lc $2};
}
PERL
}
# Builds the upgrade script of a hand part into a file: build_upgrade HAND_PART OUT.
build_upgrade() {
	local from
	from=$(basename "$1" .sql)
	from=${from%%--*}
	awk -f sql/upgrade.awk "sql/released/pg_outbox--$from.sql" "$1" <(c_engine_parts) >"$2"
}
upgrades_built_from_the_install_parts() {
	local hand out faults all=""
	[ -n "$(ls sql/upgrade/*--*.sql 2>/dev/null)" ] || { echo "# no hand part in sql/upgrade/" >&2; return 1; }
	for hand in sql/upgrade/*--*.sql; do
		out=$(mktemp)
		build_upgrade "$hand" "$out" || { rm -f "$out"; echo "# $hand: the build fails" >&2; return 1; }
		faults=$(upgrade_faults "$hand" "$out")
		rm -f "$out"
		[ -z "$faults" ] || all+="$faults"$'\n'
	done
	[ -z "$all" ] || { printf '%s' "$all" | sed 's/^/# /' >&2; return 1; }
}
check "each upgrade script has every function of the install parts, and its hand part writes none" \
	upgrades_built_from_the_install_parts
# Consume mode is split by the state each part owns: the StreamReader
# talks to Redis only, the InboxSession to PostgreSQL only, and the
# Consumer, which orchestrates them, sends nothing to either itself.
REDIS_USE='#include "pg_outbox/(redis|redis_cluster|stream_reader)\.hpp"|\bRedis(Connection|Cluster|Reply)\b|"X[A-Z]+"'
PG_USE='#include "pg_outbox/(pg|inbox_session)\.hpp"|\bPg(Connection|Result)\b|(->|\.)exec(_prepared)?\('
ORCHESTRATOR_SENDS='\b(pg_|redis_)->|"X[A-Z]+"|(->|\.)exec(_prepared)?\('
consume_sides_apart() {
	local hits
	hits=$(grep -nHE "$PG_USE" relay/src/stream_reader.cpp relay/include/pg_outbox/stream_reader.hpp
		grep -nHE "$REDIS_USE" relay/src/inbox_session.cpp relay/include/pg_outbox/inbox_session.hpp
		grep -nHE "$ORCHESTRATOR_SENDS" relay/src/consumer.cpp relay/include/pg_outbox/consumer.hpp)
	[ -z "$hits" ] || { echo "# $hits" >&2; return 1; }
}
check "consume mode's Redis side sends no SQL, its PostgreSQL side no Redis command, its orchestrator neither" \
	consume_sides_apart
check "the consume-side patterns match a Redis command, a query and a connection" \
	eval 'grep -qE "$REDIS_USE" <<<"    command(s, {\"XACK\", s, g});" &&
		grep -qE "$PG_USE" <<<"    pg_->exec(sql, {a});" &&
		grep -qE "$ORCHESTRATOR_SENDS" <<<"    redis_->command(argv);"'

# Redis's error replies become typed exceptions in the connection layer
# only (redis_error.hpp: throw_error(), Replies::get()); the rest of the
# relay catches classes, and looks at a raw reply only through is_error().
REDIS_LAYER='relay/(src|include/pg_outbox)/redis(_cluster|_error|_target)?\.(cpp|hpp)$'
raw_redis_error_checks() {
	local f
	for f in "$@"; do
		grep -qE "$REDIS_LAYER" <<<"$f" && continue
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

# A hand part that writes a function of the install parts is refused by
# the build and by the check; a built script without one of the functions
# (or with its text changed) fails the check.
finds_upgrade_faults() {
	local dir hand out
	dir=$(mktemp -d)
	hand=$(ls sql/upgrade/*--*.sql | head -n 1)
	{
		cat "$hand"
		printf 'CREATE OR REPLACE FUNCTION outbox.lock_class() RETURNS oid LANGUAGE sql AS $$ SELECT 1::oid $$;\n'
	} >"$dir/$(basename "$hand")"
	if build_upgrade "$dir/$(basename "$hand")" "$dir/built" 2>"$dir/err"; then
		echo "# the build took a hand part that creates outbox.lock_class()" >&2
		rm -r "$dir"
		return 1
	fi
	out=$(grep -c 'creates function outbox.lock_class' "$dir/err")
	build_upgrade "$hand" "$dir/built"
	out+=,$(upgrade_faults "$dir/$(basename "$hand")" "$dir/built" | grep -c 'CREATE OR REPLACE FUNCTION outbox.lock_class, a function of the install parts')
	# The built script without outbox.horizon()'s definition, and with
	# outbox.partition_name()'s body changed.
	perl -0pi -e 's/^CREATE (OR REPLACE )?FUNCTION outbox\.horizon\(\).*?\$\$;\n//ms; s/'"'"'event_%s'"'"', lower/'"'"'event%s'"'"', lower/' "$dir/built"
	out+=,$(upgrade_faults "$hand" "$dir/built" | grep -c '^not in .*: CREATE FUNCTION outbox\.\(horizon()\|partition_name(lower xid8)\)')
	rm -r "$dir"
	eq "$out" "1,1,2"
}
check "the upgrade checks find a hand-written function and a function missing from the built script" finds_upgrade_faults

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
		relay/tests/*.cpp relay/tests/*.hpp bench/*.cpp bench/*.hpp bench/workloads/*.cpp test/soak/*.cpp 2>/dev/null |
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
	ob_literals_sql sql/install/*.sql sql/engine/*/*.sql
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
# it (outbox.split_group_name(), outbox.group_of()), and in the SQL engine
# sql/engine/sql/group_names.sql, checked against it by the same test
# (test/sql/group_names.sql runs on both engines); no other C file looks
# for the slash of a group name and no other SQL part splits one. The relay's
# parser is relay/src/config.cpp's split_group_name(), checked against the
# extension's by test/vectors/group_names.txt; no other relay file looks
# for the slash in a group's name.
GRAMMAR_SQL="strpos\([^)]*'/'\)|split_part\([^)]*'/'|regexp_[a-z]*\([^)]*/|position\('/'"
one_group_grammar() {
	local hits
	hits=$( (grep -nE "(memchr|strchr|strrchr)\([^)]*'/'" extension/*.c | grep -v '^extension/group\.c:'
		grep -nE "$GRAMMAR_SQL" sql/install/*.sql sql/engine/*/*.sql | grep -v '^sql/engine/sql/group_names\.sql:'
		grep -nE "group.*'/'|'/'.*group" relay/src/*.cpp relay/include/pg_outbox/*.hpp |
			grep -v '^relay/src/config\.cpp:') ||
		true)
	[ -z "$hits" ] || { echo "# $hits" >&2; return 1; }
}
check "group names are parsed in extension/group.c (and the relay's config.cpp) only" one_group_grammar
check "the grammar check matches an ad-hoc split" \
	grep -qE "$GRAMMAR_SQL" <<<"	IF strpos(group_name, '/') > 0 THEN"

# Two engines, one API: each part of sql/install/ that names an engine's
# file (-- @engine NAME@) has it in both sql/engine/c/ and sql/engine/sql/,
# neither engine has a file no part names, and nothing but the C engine's
# files binds a function to C.
engine_files_paired() {
	local named c sql
	named=$(sed -n 's/^-- @engine \([a-z0-9_]*\)@$/\1/p' sql/install/*.sql | sort)
	c=$(cd sql/engine/c && ls -- *.sql | sed 's/\.sql$//' | sort)
	sql=$(cd sql/engine/sql && ls -- *.sql | sed 's/\.sql$//' | sort)
	[ -n "$named" ] && eq "$c" "$named" && eq "$sql" "$named"
}
check "each engine has one file per engine part the install parts name, and no other" engine_files_paired
no_c_outside_c_engine() {
	local hits
	hits=$(grep -nEi "MODULE_PATHNAME|LANGUAGE +c\b|\\\$libdir" sql/install/*.sql sql/engine/sql/*.sql sql/preamble.sql ||
		true)
	[ -z "$hits" ] || { echo "# $hits" >&2; return 1; }
}
check "only sql/engine/c/ binds functions to C" no_c_outside_c_engine

# Every invariant the code, tests and docs cite ("I-10") is defined in
# docs/design.md.
invariants_defined() {
	local cited defined missing
	cited=$(grep -rhoE '\bI-[0-9]+\b' extension sql relay/src relay/include relay/tests test scripts bench docs \
		README.md CONTRIBUTING.md 2>/dev/null | sort -u)
	defined=$(sed -n 's/^## \(I-[0-9]*\) .*/\1/p' docs/design.md | sort -u)
	missing=$(comm -23 <(echo "$cited") <(echo "$defined"))
	[ -n "$defined" ] && [ -z "$missing" ] || { echo "# not in docs/design.md: $missing" >&2; return 1; }
}
check "every invariant cited (I-NN) is defined in docs/design.md" invariants_defined

# The reference tables each live in one page, which the rest links to:
# the stream entry's fields, the relay's metrics, the settings.
tables_once() {
	local header files
	for header in '| field | format | example | when absent |' '| metric | type | labels | meaning |' \
		'| GUC | default | who may set | meaning |'; do
		files=$(git ls-files -- '*.md' | xargs grep -lxF -- "$header" | tr '\n' ' ')
		[ "$(wc -w <<<"$files")" -eq 1 ] || { echo "# \"$header\" in: ${files:-no page}" >&2; return 1; }
	done
}
check "the entry fields, metrics and settings tables each live in one page" tables_once

finish
