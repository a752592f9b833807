#!/usr/bin/env bash
# Installing pg_outbox where it cannot go: each attempt fails with a clear
# error (SQLSTATE, message, hint) and leaves nothing behind, which the
# catalogs show (the extensions, schema outbox and what is in it, the API
# functions, the roles), compared before and after. Both engines and the
# SQL engine's plain script (sql/pg_outbox_sql.sql, built by make), in one
# cluster:
#
# - by a role without CREATEROLE while pg_outbox's roles do not exist yet
#   (so first, on a fresh cluster): 42501, which roles are missing and how
#   to make them; then a role with CREATEROLE (no superuser) installs the
#   plain script, and the role without it can install it in another
#   database, the roles existing now;
# - twice: the extension (PostgreSQL's own 42710), the plain script
#   (42P06: schema outbox is there);
# - one engine over the other, both ways, as an extension and as the plain
#   script (42P06);
# - the SQL engine into a schema another role owns (42501).
#
# Runs against the server in PG* (as a superuser; a fresh cluster: the
# first case needs pg_outbox's roles not to exist); prints one "ok" /
# "not ok" line per check and exits non-zero if any failed.
set -uo pipefail

. "$(dirname "$0")/tap.bash"
root=$(cd "$(dirname "$0")/../.." && pwd)
plain=$root/sql/pg_outbox_sql.sql
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
q() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$@"; }

# An attempt's output, with the error's SQLSTATE, detail and hint (psql's
# verbose errors): attempt DB ROLE FILE-OR-STATEMENT. ROLE "-" is the
# superuser. The plain script runs as psql -f without options (no
# ON_ERROR_STOP: its own BEGIN ... COMMIT must leave nothing behind).
attempt() {
	local db=$1 role=$2 what=$3 opts='-c client_min_messages=warning'
	[ "$role" = - ] || opts="$opts -c role=$role"
	if [ -f "$what" ]; then
		PGOPTIONS=$opts psql -X -q -d "$db" -v VERBOSITY=verbose -f "$what"
	else
		PGOPTIONS=$opts psql -X -q -d "$db" -v VERBOSITY=verbose -c "$what"
	fi >"$work/out" 2>&1
	# The first error; those after it only say the transaction is aborted.
	grep -m1 -A3 'ERROR:' "$work/out" | grep -v '^CONTEXT\|^LOCATION' >"$work/error"
}

# What pg_outbox installed in a database, as the catalogs show it. Not the
# partitions, their indexes and the tables made to become one, which the
# C engine's maintenance makes when it likes, on a cluster that preloads
# pg_outbox.
installed() {
	q "$1" <<'SQL'
SELECT 'extensions: ' || coalesce(string_agg(extname, ',' ORDER BY extname), '') FROM pg_extension WHERE extname LIKE 'pg\_outbox%';
SELECT 'schema outbox: ' || count(*) FROM pg_namespace WHERE nspname = 'outbox';
SELECT 'in outbox: ' || count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'outbox' AND NOT c.relispartition AND c.relname !~ '^(event|inbox|commit_log)_[0-9]';
SELECT 'functions: ' || coalesce(string_agg(n.nspname || '.' || p.proname || ':' || (SELECT l.lanname FROM pg_language l WHERE l.oid = p.prolang), ',' ORDER BY 1), '')
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE p.proname IN ('outbox_emit', 'engine', 'inbox_apply');
SELECT 'roles: ' || coalesce(string_agg(rolname, ',' ORDER BY rolname), '') FROM pg_roles WHERE rolname LIKE 'outbox\_%';
SQL
}

# An attempt that must fail: refused WHAT DB ROLE FILE-OR-STATEMENT SQLSTATE
# MESSAGE-PATTERN [HINT-PATTERN].
refused() {
	local what=$1 db=$2 role=$3 sql=$4 state=$5 message=$6 hint=${7:-}
	installed "$db" >"$work/before"
	attempt "$db" "$role" "$sql"
	check "$what: fails with $state" grep -q "^\(psql:[^ ]* \)\?ERROR:  $state: $message" "$work/error"
	[ -z "$hint" ] || check "$what: the error says what to do" grep -q "^HINT:  $hint" "$work/error"
	installed "$db" >"$work/after"
	check "$what: nothing is left behind" diff -u "$work/before" "$work/after"
	sed 's/^/#   /' "$work/error"
}

# An install that must work: installs WHAT DB ROLE FILE-OR-STATEMENT.
installs() {
	local what=$1
	attempt "$2" "$3" "$4"
	check "$what" eq "$(cat "$work/error")" ""
	sed 's/^/#   /' "$work/error"
}

q postgres >/dev/null <<'SQL'
CREATE ROLE no_createrole LOGIN;
CREATE ROLE with_createrole LOGIN CREATEROLE;
CREATE ROLE stranger LOGIN;
SQL
for db in noroles plain_twice ext_twice sql_over_c c_over_sql plain_over_c c_over_plain theirs; do
	createdb "$db"
	q "$db" -c "GRANT CREATE ON DATABASE $db TO no_createrole, with_createrole, stranger" >/dev/null
done

# By a role without CREATEROLE, on a fresh cluster; then by one with it.
check "the cluster has none of pg_outbox's roles yet" eq "$(q postgres -c "SELECT count(*) FROM pg_roles WHERE rolname LIKE 'outbox\_%'")" 0
refused "the plain script by a role without CREATEROLE" noroles no_createrole "$plain" 42501 \
	'role "no_createrole" cannot install pg_outbox: it may not create the missing roles outbox_writer, outbox_relay, outbox_consumer, outbox_admin' \
	'Install pg_outbox as a role with CREATEROLE, or have such a role create the missing roles first: CREATE ROLE outbox_writer NOLOGIN; CREATE ROLE outbox_relay NOLOGIN; CREATE ROLE outbox_consumer NOLOGIN; CREATE ROLE outbox_admin NOLOGIN;'
check "the plain script without CREATEROLE: the error explains why" \
	grep -q "^DETAIL:  pg_outbox grants its privileges to the roles outbox_writer, outbox_relay, outbox_consumer and outbox_admin" "$work/error"
installs "the plain script by a role with CREATEROLE, no superuser" plain_twice with_createrole "$plain"
check "the plain script: its objects belong to the installing role, the API is in schema outbox" \
	eq "$(q plain_twice -c "SELECT string_agg(DISTINCT pg_get_userbyid(p.proowner) || ' ' || n.nspname, ',') FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE p.proname IN ('outbox_emit', 'engine')")" \
	"with_createrole outbox"
check "the plain script: outbox.engine() names the SQL engine and schema outbox" \
	eq "$(q plain_twice -c "SELECT engine || ' ' || api_schema FROM outbox.engine()")" "sql outbox"
check "the plain script: the roles it made are plain roles" \
	eq "$(q postgres -c "SELECT string_agg(rolname || ':' || (rolcanlogin OR rolsuper OR rolcreaterole OR rolbypassrls), ',' ORDER BY rolname) FROM pg_roles WHERE rolname LIKE 'outbox\_%'")" \
	"outbox_admin:false,outbox_consumer:false,outbox_relay:false,outbox_writer:false"
installs "the plain script by a role without CREATEROLE once the roles exist" noroles no_createrole "$plain"

# Twice.
refused "the plain script twice" plain_twice with_createrole "$plain" 42P06 \
	'pg_outbox is installed in database "plain_twice" already' 'SELECT \* FROM outbox.engine() names the engine installed'
installs "the SQL engine as an extension" ext_twice - "CREATE EXTENSION pg_outbox_sql"
refused "the SQL engine as an extension twice" ext_twice - "CREATE EXTENSION pg_outbox_sql" 42710 \
	'extension "pg_outbox_sql" already exists'

# One engine over the other.
installs "the C engine" sql_over_c - "CREATE EXTENSION pg_outbox"
refused "the SQL engine over the C engine" sql_over_c - "CREATE EXTENSION pg_outbox_sql" 42P06 \
	'pg_outbox is installed in database "sql_over_c" already' 'SELECT \* FROM outbox.engine() names the engine installed'
installs "the SQL engine" c_over_sql - "CREATE EXTENSION pg_outbox_sql"
refused "the C engine over the SQL engine" c_over_sql - "CREATE EXTENSION pg_outbox" 42P06 \
	'pg_outbox is installed in database "c_over_sql" already'
installs "the C engine" plain_over_c - "CREATE EXTENSION pg_outbox"
refused "the plain script over the C engine" plain_over_c with_createrole "$plain" 42P06 \
	'pg_outbox is installed in database "plain_over_c" already'
installs "the plain script" c_over_plain with_createrole "$plain"
refused "the C engine over the plain script" c_over_plain - "CREATE EXTENSION pg_outbox" 42P06 \
	'pg_outbox is installed in database "c_over_plain" already'
refused "the SQL engine as an extension over the plain script" c_over_plain - "CREATE EXTENSION pg_outbox_sql" 42P06 \
	'pg_outbox is installed in database "c_over_plain" already'

# Into a schema another role owns.
PGOPTIONS='-c role=stranger' q theirs -c "CREATE SCHEMA theirs" >/dev/null
refused "the SQL engine into a schema another role owns" theirs - "CREATE EXTENSION pg_outbox_sql SCHEMA theirs" 42501 \
	'pg_outbox cannot be installed in schema "theirs": it is owned by role "stranger"' \
	'Install pg_outbox in a schema owned by one of them'

finish
