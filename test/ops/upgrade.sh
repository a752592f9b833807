#!/usr/bin/env bash
# ALTER EXTENSION pg_outbox UPDATE from every released version: a database
# made with the old version and filled (groups in both orders, events
# published and waiting, inbox rows, dead letters) is updated; its schema
# must then be the one a fresh install of the current version makes (every
# function with its definition, settings, privileges and comment; every
# table, view, column, constraint, index and trigger; the dump settings),
# and the data must still flow: the waiting events are fetched, cursors
# advance, the inbox still deduplicates.
#
# The steps of docs/operations.md ("Upgrading") that a test can take are
# taken as written: the shell loop that lists every database of the
# cluster with pg_outbox and its version finds the old ones, and none
# after the update; a relay of the current version exits 2 (which
# systemd does not restart) against a database still on the old version,
# naming both, and publishes once the database is updated.
#
# Runs against the server in PG* (preloaded), with the relay
# PG_OUTBOX_RELAY (default build/relay/pg_outbox_relay) and a throwaway
# Redis started by the test kit (PG_OUTBOX_TESTKIT, see scripts/lib.sh);
# prints one "ok" / "not ok" line per check and exits non-zero if any
# failed.
set -uo pipefail

. "$(dirname "$0")/tap.bash"
. "$(dirname "$0")/../../scripts/lib.sh"
q() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$@"; }
RELAY=${PG_OUTBOX_RELAY:-$PWD/build/relay/pg_outbox_relay}
[ -x "$RELAY" ] || { echo "not ok 1 - the relay is built ($RELAY)"; echo "0 passed, 1 failed"; exit 1; }
work=$(mktemp -d)
chmod 755 "$work"
WORK=$work
RELAY_PID=
trap 'stop_pid "$RELAY_PID"; stop_servers; rm -rf "$work"' EXIT
REDIS_PORT=$(free_port)
redis_start "$work/redis" "$REDIS_PORT" || exit 1

# The documented loop (docs/operations.md, "Upgrading"): every database
# of the cluster that has pg_outbox (either engine), with its version.
versions() { bash -c "$(doc_block docs/operations.md versions)"; }
check "docs/operations.md has the loop" eval 'doc_block docs/operations.md versions >/dev/null'

current=$(sed -n "s/^default_version[[:space:]]*=[[:space:]]*'\([^']*\)'.*/\1/p" "$(dirname "$0")/../../pg_outbox.control")

# Everything of the extension's schema that a user or the relay can see,
# one line each, in a stable order. Partitions that maintenance makes (by
# transaction id or day) differ between databases and are left out.
fingerprint() {
	psql -X -q -At -v ON_ERROR_STOP=1 -d "$1" <<'SQL'
WITH ext AS (SELECT oid, extnamespace FROM pg_extension WHERE extname = 'pg_outbox'),
nsp AS (SELECT oid, nspname FROM pg_namespace WHERE nspname = 'outbox' OR oid = (SELECT extnamespace FROM ext)),
rels AS (
	SELECT c.oid, n.nspname, c.relname, c.relkind, c.relacl
	  FROM pg_class c JOIN nsp n ON n.oid = c.relnamespace
	 WHERE c.relname !~ '^(event|commit_log)_[0-9]+' AND c.relname !~ '^inbox_[0-9]{8}'
	   AND (n.nspname = 'outbox' OR EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = c.oid AND d.deptype = 'e'))
)
SELECT 'function ' || n.nspname || '.' || p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ') '
	   || coalesce((SELECT string_agg(x::text, ',' ORDER BY x::text) FROM unnest(p.proacl) x), '') || ' ' || coalesce(obj_description(p.oid, 'pg_proc'), '') || E'\n'
	   || CASE WHEN p.prokind = 'a' THEN '' ELSE pg_get_functiondef(p.oid) END
  FROM pg_proc p JOIN nsp n ON n.oid = p.pronamespace
 WHERE EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = p.oid AND d.deptype = 'e')
UNION ALL
SELECT 'relation ' || r.nspname || '.' || r.relname || ' ' || r.relkind::text || ' ' || coalesce((SELECT string_agg(x::text, ',' ORDER BY x::text) FROM unnest(r.relacl) x), '')
	   || ' ' || coalesce(obj_description(r.oid, 'pg_class'), '')
	   || coalesce(' view: ' || pg_get_viewdef(r.oid), '')
  FROM rels r
UNION ALL
SELECT 'column ' || r.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
	   || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
	   || coalesce(' default ' || pg_get_expr(ad.adbin, ad.adrelid), '') || ' ' || a.attgenerated::text
	   || ' ' || coalesce((SELECT string_agg(x::text, ',' ORDER BY x::text) FROM unnest(a.attacl) x), '') || ' ' || coalesce(col_description(r.oid, a.attnum), '')
  FROM rels r JOIN pg_attribute a ON a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped
  LEFT JOIN pg_attrdef ad ON ad.adrelid = r.oid AND ad.adnum = a.attnum
UNION ALL
SELECT 'constraint ' || r.relname || '.' || co.conname || ' ' || pg_get_constraintdef(co.oid)
  FROM rels r JOIN pg_constraint co ON co.conrelid = r.oid
UNION ALL
SELECT 'index ' || regexp_replace(pg_get_indexdef(i.indexrelid), '_[0-9]+', '_N', 'g')
  FROM rels r JOIN pg_index i ON i.indrelid = r.oid
UNION ALL
SELECT 'trigger ' || pg_get_triggerdef(t.oid)
  FROM rels r JOIN pg_trigger t ON t.tgrelid = r.oid AND NOT t.tgisinternal
UNION ALL
SELECT 'partition ' || r.relname || ' ' || pg_get_expr(c.relpartbound, c.oid)
  FROM rels r JOIN pg_class c ON c.oid = r.oid WHERE c.relispartition
UNION ALL
SELECT 'dumped ' || c.relname || ' ' || coalesce(e.extcondition[i], '')
  FROM pg_extension e, generate_subscripts(e.extconfig, 1) i, pg_class c
 WHERE e.extname = 'pg_outbox' AND c.oid = e.extconfig[i]
UNION ALL
SELECT 'role ' || rolname FROM pg_roles WHERE rolname LIKE 'outbox\_%'
ORDER BY 1
SQL
}

for script in "$(dirname "$0")"/../../sql/released/pg_outbox--*.sql; do
	from=$(basename "$script" .sql)
	from=${from#pg_outbox--}
	[[ $from != *--* ]] || continue	# a released update's script, not a version
	db="from_${from//./_}"
	createdb "$db"
	q "$db" >/dev/null <<SQL
CREATE EXTENSION pg_outbox VERSION '$from';
SELECT outbox_group_create('x', ordering => 'xid8', start_at => 'beginning');
SELECT outbox_group_create('c', ordering => 'commit', start_at => 'beginning');
SELECT outbox_emit('t', 'before-' || i, jsonb_build_object('i', i)) FROM generate_series(1, 4) i;
SELECT inbox_apply('ledger', ('00000000-0000-4000-8000-00000000000' || i)::uuid, jsonb_build_object('n', i))
  FROM generate_series(1, 3) i;
SELECT inbox_dead_letter('ledger', 'outbox:t', '1-1', NULL, 't', NULL, NULL, NULL, 'broken');
SQL
	# Publish two events of each group before the update.
	for g in x c; do
		q "$db" -c "DO \$\$ DECLARE last text; BEGIN
			FOR i IN 1 .. 200 LOOP
				SELECT max(pos) INTO last FROM (SELECT pos FROM outbox_fetch('$g', 2)) f;
				EXIT WHEN last IS NOT NULL; PERFORM pg_sleep(0.05);
			END LOOP;
			PERFORM outbox_advance('$g', last); PERFORM outbox_resign('$g'); END \$\$" >/dev/null
	done
	check "$from -> $current: the loop over the cluster's databases lists $db at $from" \
		grep -qx "$db|pg_outbox|$from" <(versions)
	"$RELAY" publish --pg "dbname=$db" --redis "127.0.0.1:$REDIS_PORT" --group x >"$work/relay.log" 2>&1
	check "$from -> $current: a relay of $current against $from exits 2" eq "$?" 2
	check "$from -> $current: ... naming both versions and the update" \
		grep -q "database \"$db\" has pg_outbox $from; this relay is $current .*ALTER EXTENSION pg_outbox UPDATE" "$work/relay.log"
	started=$(date +%s%N)
	check "$from -> $current: ALTER EXTENSION UPDATE" q "$db" -c "ALTER EXTENSION pg_outbox UPDATE"
	echo "# ALTER EXTENSION pg_outbox UPDATE took $((($(date +%s%N) - started) / 1000000)) ms"
	check "$from -> $current: the version is $current" \
		eq "$(q "$db" -c "SELECT extversion FROM pg_extension WHERE extname = 'pg_outbox'")" "$current"
	createdb "fresh_$db"
	q "fresh_$db" -c "CREATE EXTENSION pg_outbox" >/dev/null
	fingerprint "$db" >"$work/updated"
	fingerprint "fresh_$db" >"$work/fresh"
	check "$from -> $current: the schema is described (fingerprint)" test "$(wc -l <"$work/fresh")" -gt 100
	check "$from -> $current: the schema is a fresh install's" diff -u "$work/fresh" "$work/updated"
	check "$from -> $current: event partitions belong to the extension, inbox day partitions do not" \
		eq "$(q "$db" -c "SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
			WHERE c.relkind = 'r' AND c.relname !~ '_default$'
			  AND (i.inhparent = 'outbox.inbox'::regclass) = EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = c.oid AND d.deptype = 'e')")" 0
	check "$from -> $current: the waiting events are fetched (xid8)" \
		eq "$(q "$db" -c "SELECT string_agg(key, ',' ORDER BY pos) FROM outbox_fetch('x', 10)")" "before-3,before-4"
	check "$from -> $current: the waiting events are fetched (commit order)" \
		eq "$(q "$db" -c "SELECT string_agg(key, ',' ORDER BY pos) FROM outbox_fetch('c', 10)")" "before-3,before-4"
	check "$from -> $current: cursors advance" \
		q "$db" -c "SELECT outbox_advance('x', (SELECT max(pos) FROM outbox_fetch('x', 10)))" -o /dev/null
	check "$from -> $current: consumers in use are registered (to outbox_consumer)" \
		eq "$(q "$db" -c "SELECT consumer || ':' || owner FROM inbox_consumers()")" "ledger:outbox_consumer"
	check "$from -> $current: the inbox still deduplicates" \
		eq "$(q "$db" -c "SELECT inbox_apply('ledger', '00000000-0000-4000-8000-000000000002', '{\"n\": 2}')")" f
	check "$from -> $current: dead letters are kept" \
		eq "$(q "$db" -c "SELECT count(*) FROM outbox.dead_letters")" 1
	check "$from -> $current: new events flow" \
		eq "$(q "$db" -c "SELECT count(*) FROM outbox_emit('t', 'after', '{}')" -c "SELECT 1" | tail -1)" 1
	"$RELAY" publish --pg "dbname=$db" --redis "127.0.0.1:$REDIS_PORT" --group x --stream "$db:{topic}" \
		>"$work/relay.log" 2>&1 &
	RELAY_PID=$!
	check "$from -> $current: the relay of $current starts and publishes what waited" \
		wait_for 30 'redis-cli -p "$REDIS_PORT" XRANGE "$db:t" - + | grep -qx after'
	grep -q 'critical' "$work/relay.log" && sed 's/^/# /' "$work/relay.log"
	kill -TERM "$RELAY_PID"
	wait "$RELAY_PID"
	check "$from -> $current: ... and stops with 0" eq "$?" 0
	RELAY_PID=
done
check "after the updates, the loop lists no database at another version than $current" \
	eq "$(versions | awk -F'|' -v v="$current" '$3 != v' | wc -l)" 0

finish
