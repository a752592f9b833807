#!/usr/bin/env bash
# Moves a database from one engine of pg_outbox to the other, in one
# transaction: the state is copied aside (outbox_export_state()), the
# extension dropped, the other engine's extension created in the same
# schema, the state copied back (outbox_import_state()) and the copy
# dropped. Either all of it commits or none of it does: a refusal (a group
# with events it has not published, a relay leading a group, a lock not
# granted within the lock timeout) leaves the database as it was.
#
#   scripts/move-engine.sh --to sql|c [--copy-schema NAME] [--lock-timeout DURATION] [--keep-copy] [PSQL-OPTION ...]
#
# The database is the one psql connects to with the options given (-d,
# -h, -p, -U) or the PG* environment. The role must be able to drop and
# create the extensions (their owner, or a superuser for pg_outbox).
# Stop the relays first; writers and consumers may go on: their
# transactions wait for the move and then fail (nothing is lost: a
# consumer's entry is delivered again, an emitting transaction rolls back).
# docs/engines.md, "Moving between engines", gives the steps and what moves.
set -euo pipefail

usage() {
	sed -n 's/^#   //p' "$0" >&2
	exit 2
}

to=
copy_schema=outbox_move
lock_timeout=10s
keep_copy=0
psql_args=()
while [ $# -gt 0 ]; do
	case $1 in
	--to) to=${2:-}; shift 2 ;;
	--copy-schema) copy_schema=${2:-}; shift 2 ;;
	--lock-timeout) lock_timeout=${2:-}; shift 2 ;;
	--keep-copy) keep_copy=1; shift ;;
	-h|-p|-U|-d) psql_args+=("$1" "${2:-}"); shift 2 ;;
	--help) usage ;;
	*) psql_args+=("$1"); shift ;;
	esac
done
case $to in
sql) target=pg_outbox_sql ;;
c) target=pg_outbox ;;
*) echo "move-engine.sh: --to must be sql or c" >&2; usage ;;
esac
[ -n "$copy_schema" ] || { echo "move-engine.sh: --copy-schema must not be empty" >&2; exit 2; }

q() { psql -X -q -At -v ON_ERROR_STOP=1 "${psql_args[@]}" "$@"; }

# What is installed: the extension, its schema and its engine.
info=$(q -F ' ' -c "SELECT x.extname, n.nspname, (SELECT e.engine FROM outbox.engine() e)
                      FROM pg_extension x JOIN pg_namespace n ON n.oid = x.extnamespace
                     WHERE x.extname IN ('pg_outbox', 'pg_outbox_sql')") || {
	echo "move-engine.sh: cannot read which engine of pg_outbox the database has" >&2
	exit 1
}
if [ -z "$info" ]; then
	echo "move-engine.sh: the database has no pg_outbox extension to move from" >&2
	echo "  (the SQL engine installed with psql -f: follow doc/engines.md, \"Moving between engines\", by hand)" >&2
	exit 1
fi
read -r source schema engine <<<"$info"
if [ "$source" = "$target" ]; then
	echo "move-engine.sh: the database is on engine \"$engine\" ($source) already" >&2
	exit 1
fi

echo "moving database from $source to $target (schema $schema, copy in schema $copy_schema)"
drop_copy='DROP SCHEMA :"copy" CASCADE;'
[ "$keep_copy" = 1 ] && drop_copy=
# The names go in as psql variables, quoted by psql (:"x" and :'x').
psql -X -v ON_ERROR_STOP=1 "${psql_args[@]}" \
	-v schema="$schema" -v source="$source" -v target="$target" \
	-v copy="$copy_schema" -v lock_timeout="$lock_timeout" <<SQL
BEGIN;
SET LOCAL lock_timeout = :'lock_timeout';
SELECT * FROM :"schema".outbox_export_state(:'copy');
DROP EXTENSION :"source";
CREATE EXTENSION :"target" SCHEMA :"schema";
SELECT * FROM :"schema".outbox_import_state(:'copy');
SET LOCAL client_min_messages = warning;
$drop_copy
SELECT engine AS "now on engine", version FROM outbox.engine();
COMMIT;
SQL
