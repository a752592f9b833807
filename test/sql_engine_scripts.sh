#!/usr/bin/env bash
# The SQL engine's two scripts for servers where no C extension may be
# installed, checked on the text make generated (run make first):
#
# - sql/pg_outbox_sql.pgtle.sql, for pg_tle: one call of
#   pgtle.install_extension() whose last argument, dollar-quoted, is the
#   extension's script without its \echo guard. pg_tle runs that script as
#   CREATE EXTENSION would, as the role that creates the extension (not a
#   superuser), and takes no C: so no backslash command, no LANGUAGE c or
#   internal, no MODULE_PATHNAME or $libdir, no superuser-only statement,
#   no schema but @extschema@ and outbox named for the API (no hard-coded
#   public), and the dollar tag absent from the script. pg_tle itself is
#   not installable here (it is a C extension built against the server,
#   not packaged for Debian's PostgreSQL 15), so this checks the rules it
#   enforces, not a pg_tle install; the ordinary extension, which is the
#   same script, is installed by every other test of the SQL engine.
# - sql/pg_outbox_sql.sql, for psql -f: the same rules, and what only
#   CREATE EXTENSION allows is gone (no @extschema@, no
#   pg_extension_config_dump), in one transaction (BEGIN first, COMMIT
#   last). test/managed.sh installs it.
#
# The rules are checked on a copy with a violation planted too, once per
# rule, so that a rule that matches nothing is caught. Prints one "ok" /
# "not ok" line per check and exits non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
. test/ops/tap.bash
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

version=$(sed -n "s/^default_version[[:space:]]*=[[:space:]]*'\([^']*\)'.*/\1/p" pg_outbox_sql.control)
tle=sql/pg_outbox_sql.pgtle.sql
plain=sql/pg_outbox_sql.sql
tag='$_pg_outbox_sql_$'

# The statements of a script, "--" comments and the text of string
# literals out (a message may name a statement it does not run), one line
# per input line. Dollar-quoted bodies stay: a function's body and a DO
# block are code.
code() {
	perl -pe "s/'(?:[^']|'')*'/''/g; s/--.*//" "$1"
}

# What pg_tle and a role that is not a superuser refuse, one line per
# finding (empty when the script keeps the rules): violations FILE.
violations() {
	code "$1" | perl -ne '
		my @rules = (
			[qr/^\s*\\/, "a backslash command"],
			[qr/\bLANGUAGE\s+"?(c|internal)"?\b/i, "a function in C"],
			[qr/MODULE_PATHNAME|\$libdir/i, "a C library"],
			[qr/\bCREATE\s+EXTENSION\b/i, "CREATE EXTENSION"],
			[qr/(^|;)\s*LOAD\b/i, "LOAD"],
			[qr/\bALTER\s+SYSTEM\b/i, "ALTER SYSTEM"],
			[qr/\bCREATE\s+(OR\s+REPLACE\s+)?(TRUSTED\s+)?(PROCEDURAL\s+)?LANGUAGE\b/i, "CREATE LANGUAGE"],
			[qr/\bCOPY\b.*\b(PROGRAM|FROM\s+\x27|TO\s+\x27)/i, "COPY with a program or a server file"],
			[qr/\bCREATE\s+EVENT\s+TRIGGER\b/i, "an event trigger"],
			[qr/\bCREATE\s+(FOREIGN\s+DATA\s+WRAPPER|SERVER)\b/i, "a foreign data wrapper or server"],
			[qr/\b(CREATE|ALTER)\s+(ROLE|USER)\b.*\b(SUPERUSER|REPLICATION|BYPASSRLS)\b/i, "a privileged role"],
			[qr/\bsession_replication_role\b/i, "session_replication_role"],
			[qr/\b(pg_read_file|pg_read_binary_file|pg_ls_dir|pg_stat_file|pg_file_write|lo_import|lo_export|dblink\w*)\s*\(/i, "a server file or connection"],
			[qr/\bpublic\s*\.|\bSCHEMA\s+public\b/i, "schema public named"],
		);
		for my $r (@rules) { print "$.: $r->[1]\n" if $_ =~ $r->[0]; }
	'
}

# The extension's script inside the pg_tle call, between the dollar tags.
tle_body() { perl -0777 -ne 'print $1 if /\$_pg_outbox_sql_\$\n(.*)\$_pg_outbox_sql_\$\);\s*\z/s' "$tle"; }

check "make built $tle and $plain" test -s "$tle" -a -s "$plain"

# pg_tle.
first=$(grep -v '^--' "$tle" | head -n 1)
check "pg_tle: one call of pgtle.install_extension('pg_outbox_sql', '$version', ...)" \
	test "${first#"SELECT pgtle.install_extension('pg_outbox_sql', '$version', '"}" != "$first"
check "pg_tle: the dollar tag opens and closes the script, and the script does not contain it" \
	eq "$(grep -oF "$tag" "$tle" | wc -l)" 2
tle_body >"$work/tle"
check "pg_tle: the script is the extension's, without its \\echo guard" \
	diff <(sed '/^\\echo .*\\quit$/d' "sql/pg_outbox_sql--$version.sql") "$work/tle"
check "pg_tle: the script keeps the rules" eq "$(violations "$work/tle")" ""
check "pg_tle: the API is created in @extschema@" \
	grep -q '^CREATE FUNCTION @extschema@\.outbox_emit(' "$work/tle"

# The plain script.
check "plain: BEGIN is its first statement, COMMIT its last" \
	eq "$(grep -v '^--' "$plain" | grep -v '^$' | sed -n '1p;$p' | paste -sd ' ')" "BEGIN; COMMIT;"
check "plain: no other transaction control" \
	eq "$(code "$plain" | grep -ciE '^\s*(BEGIN|COMMIT|ROLLBACK|START TRANSACTION|ABORT)\s*;')" 2
check "plain: the script keeps the rules" eq "$(violations "$plain")" ""
check "plain: what only CREATE EXTENSION allows is gone" \
	eq "$(grep -v '^\s*--' "$plain" | grep -c '@extschema@\|@extversion@\|pg_extension_config_dump')" 0
check "plain: the API is created in schema outbox" grep -q '^CREATE FUNCTION outbox\.outbox_emit(' "$plain"

# Each rule finds its violation, on the last line of the planted copy.
planted_last=$(($(wc -l <"$work/tle") + 1))
while IFS='|' read -r what line; do
	{ cat "$work/tle"; printf '%s\n' "$line"; } >"$work/planted"
	check "a planted $what is found" grep -q "^$planted_last: " <(violations "$work/planted")
done <<'PLANTED'
backslash command|\i other.sql
function in C|CREATE FUNCTION f() RETURNS int LANGUAGE c AS 'lib', 'f';
C library|CREATE FUNCTION f() RETURNS int AS 'MODULE_PATHNAME', 'f' LANGUAGE C;
CREATE EXTENSION|CREATE EXTENSION pg_cron;
LOAD|LOAD 'auto_explain';
ALTER SYSTEM|ALTER SYSTEM SET work_mem = '1GB';
CREATE LANGUAGE|CREATE TRUSTED LANGUAGE plx HANDLER h;
COPY ... PROGRAM|COPY t FROM PROGRAM 'id';
COPY from a server file|COPY t TO '/tmp/x';
event trigger|CREATE EVENT TRIGGER e ON ddl_command_start EXECUTE FUNCTION f();
superuser role|CREATE ROLE r SUPERUSER;
server file read|SELECT pg_read_file('/etc/passwd');
hard-coded public|CREATE FUNCTION public.f() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$;
PLANTED
# And nothing in a comment or a message is taken for a statement.
{ cat "$work/tle"; printf '%s\n' "-- LOAD 'x'; CREATE EXTENSION y;" "SELECT 'ALTER SYSTEM SET a = 1; LANGUAGE c';"; } >"$work/planted"
check "a statement named in a comment or a string is no violation" \
	eq "$(violations "$work/planted")" "$(violations "$work/tle")"

finish
