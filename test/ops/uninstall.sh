#!/usr/bin/env bash
# Uninstalling pg_outbox from a cluster as docs/operations.md
# ("Uninstalling") says, in two databases that use it the way
# applications do: the roles hold privileges on the applications' tables
# (a handler's, a relay's), own an object, are granted to login roles, and
# pg_outbox settings are set per database and per role. DROP ROLE fails
# until REASSIGN OWNED and DROP OWNED ran in every database; the settings
# are found in pg_db_role_setting and reset. At the end no pg_outbox role
# and no pg_outbox setting is left, and the applications' roles and data
# are.
#
# Runs against the server in PG*, with the engine PG_OUTBOX_ENGINE names
# (tap.bash); prints one "ok" / "not ok" line per check and exits non-zero
# if any failed.
set -uo pipefail

. "$(dirname "$0")/tap.bash"
q() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$@"; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dbs="uninstall_a uninstall_b"

for db in $dbs; do
	createdb "$db"
	q "$db" -c "CREATE EXTENSION $EXT"
done
# Login roles that are members of pg_outbox's (DROP ROLE takes the
# memberships away by itself).
q postgres >/dev/null <<'SQL'
CREATE ROLE uninstall_app LOGIN IN ROLE outbox_writer;
CREATE ROLE uninstall_relay LOGIN IN ROLE outbox_relay;
CREATE ROLE uninstall_ledger LOGIN IN ROLE outbox_consumer;
SQL
for db in $dbs; do
	q "$db" -v db="$db" >/dev/null <<'SQL'
-- What applications grant the roles: a handler's table, a table a relay
-- reads, a sequence; and an object one of them owns.
CREATE TABLE orders (id int PRIMARY KEY);
CREATE TABLE ledger (id serial PRIMARY KEY, entry jsonb);
GRANT SELECT ON orders TO outbox_relay;
GRANT INSERT ON ledger TO outbox_consumer;
GRANT USAGE ON SEQUENCE ledger_id_seq TO outbox_consumer;
GRANT CONNECT ON DATABASE :"db" TO outbox_writer;
CREATE VIEW order_ids AS SELECT id FROM orders;
ALTER VIEW order_ids OWNER TO outbox_admin;
INSERT INTO orders VALUES (1), (2);
SELECT inbox_consumer_create('ledger', 'uninstall_ledger');
-- Settings made per database and per role.
ALTER DATABASE :"db" SET pg_outbox.notify = off;
ALTER ROLE uninstall_app IN DATABASE :"db" SET pg_outbox.notify = off;
SQL
done
q postgres >/dev/null <<'SQL'
ALTER DATABASE uninstall_b SET pg_outbox.lease = '20s';
ALTER ROLE uninstall_relay SET pg_outbox.lease = '30s';
ALTER ROLE outbox_relay SET pg_outbox.lease = '30s';
SQL
roles="outbox_writer, outbox_relay, outbox_consumer, outbox_admin"

# docs/operations.md, "Uninstalling". Step 1 done (nothing runs); step 2:
# the extension goes, database by database (first alone, to show that
# DROP ROLE fails after it).
for db in $dbs; do
	check "$db: DROP EXTENSION" q "$db" -c "DROP EXTENSION $EXT"
done
check "the roles stay after DROP EXTENSION" \
	eq "$(q postgres -c "SELECT count(*) FROM pg_roles WHERE rolname IN ('outbox_writer', 'outbox_relay', 'outbox_consumer', 'outbox_admin')")" 4
q postgres -c "DROP ROLE $roles" >"$work/out" 2>&1
check "DROP ROLE fails while the roles hold privileges on the applications' tables" \
	grep -q 'cannot be dropped because some objects depend on it' "$work/out"
check "... and the roles are all still there" \
	eq "$(q postgres -c "SELECT count(*) FROM pg_roles WHERE rolname LIKE 'outbox\_%'")" 4

# Step 2 as documented (the extension dropped above already, as a
# statement of its own): what the roles own and were granted.
check "docs/operations.md has the statements of each database and the reset" \
	eval 'doc_block docs/operations.md drop >/dev/null && doc_block docs/operations.md reset >/dev/null'
for db in $dbs; do
	check "$db: REASSIGN OWNED and DROP OWNED" \
		eval "doc_block docs/operations.md drop | grep -v '^DROP EXTENSION' | q $db"
done

# Step 3: the settings, one query for the whole cluster.
q postgres >"$work/settings" <<'SQL'
SELECT coalesce(d.datname, '(every database)') AS database, coalesce(r.rolname, '(every role)') AS role, s AS setting
  FROM pg_db_role_setting x
  LEFT JOIN pg_database d ON d.oid = x.setdatabase
  LEFT JOIN pg_roles r ON r.oid = x.setrole
 CROSS JOIN unnest(x.setconfig) s
 WHERE s LIKE 'pg\_outbox.%'
 ORDER BY 1, 2, 3;
SQL
# Left alone, a setting outlives the extension: every new session of the
# database takes it (without pg_outbox.so loaded, as a placeholder that
# nothing checks), and an install made later would run with it.
check "a new session still takes the database's setting after DROP EXTENSION" \
	eq "$(q uninstall_a -c "SHOW pg_outbox.notify")" off
check "the settings are listed, per database and per role" eq "$(cat "$work/settings")" \
"(every database)|outbox_relay|pg_outbox.lease=30s
(every database)|uninstall_relay|pg_outbox.lease=30s
uninstall_a|(every role)|pg_outbox.notify=off
uninstall_a|uninstall_app|pg_outbox.notify=off
uninstall_b|(every role)|pg_outbox.lease=20s
uninstall_b|(every role)|pg_outbox.notify=off
uninstall_b|uninstall_app|pg_outbox.notify=off"
doc_block docs/operations.md reset | q postgres >"$work/out" 2>&1
check "the settings are reset" eq "$(cat "$work/out")" ""

# Step 4: the roles.
check "DROP ROLE" q postgres -c "DROP ROLE $roles"
check "no pg_outbox role is left" \
	eq "$(q postgres -c "SELECT count(*) FROM pg_roles WHERE rolname LIKE 'outbox\_%'")" 0
check "no pg_outbox setting is left" \
	eq "$(q postgres -c "SELECT count(*) FROM pg_db_role_setting, unnest(setconfig) s WHERE s LIKE 'pg\_outbox.%'")" 0
check "the applications' roles stay" \
	eq "$(q postgres -c "SELECT string_agg(rolname, ',' ORDER BY rolname) FROM pg_roles WHERE rolname LIKE 'uninstall\_%'")" \
	"uninstall_app,uninstall_ledger,uninstall_relay"
for db in $dbs; do
	check "$db: the data stays; the view the admin role owned is the current user's now" \
		eq "$(q "$db" -c "SELECT count(*) FROM order_ids" -c "SELECT viewowner = CURRENT_USER FROM pg_views WHERE viewname = 'order_ids'")" "2
t"
	check "$db: nothing of pg_outbox is left (schema outbox, its functions)" \
		eq "$(q "$db" -c "SELECT count(*) FROM pg_namespace WHERE nspname = 'outbox'" -c "SELECT count(*) FROM pg_proc WHERE proname LIKE 'outbox\_%' OR proname LIKE 'inbox\_%'")" "0
0"
done

finish
