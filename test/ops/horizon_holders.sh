#!/usr/bin/env bash
# Ending what holds the horizon, as docs/operations.md ("Delivery paused")
# says: an open transaction holds an xid8 group's events back (not a
# commit-ordered group's); outbox.horizon_holders names it; the relay role
# may read that but may not end another role's session, a member of
# pg_signal_backend may (not a superuser's session: only a superuser
# may); a forgotten prepared transaction is ended with ROLLBACK PREPARED in
# the database that outbox.horizon_holders names for it, and nowhere else.
#
# Runs against the server in PG* (max_prepared_transactions > 0), with the
# engine PG_OUTBOX_ENGINE names (tap.bash); prints one "ok" / "not ok"
# line per check and exits non-zero if any failed. Stops the sessions it
# started by PID.
set -uo pipefail

. "$(dirname "$0")/tap.bash"
q() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$@"; }
# A session of a role that logs in with a password (the server's
# authentication may be trust or a password).
as() { local role=$1 db=$2; shift 2; PGUSER=$role PGPASSWORD=holders-test q "$db" "$@"; }
work=$(mktemp -d)
SESSIONS=()
cleanup() {
	local pid
	for pid in "${SESSIONS[@]}"; do kill "$pid" 2>/dev/null; done
	for pid in "${SESSIONS[@]}"; do wait "$pid" 2>/dev/null; done
	q postgres -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'holders_test'" \
		-o /dev/null 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT

createdb holders
createdb holders_other
q holders -v ext="$EXT" -v commit_order="$COMMIT_ORDER" >/dev/null <<'SQL'
CREATE EXTENSION :"ext";
DO $$ BEGIN
	CREATE ROLE holders_app LOGIN PASSWORD 'holders-test';
	CREATE ROLE holders_relay LOGIN PASSWORD 'holders-test' IN ROLE outbox_relay;
	CREATE ROLE holders_ops LOGIN PASSWORD 'holders-test' IN ROLE outbox_relay, pg_signal_backend;
EXCEPTION WHEN duplicate_object THEN NULL; END $$;
GRANT CONNECT ON DATABASE holders, holders_other TO holders_app, holders_relay, holders_ops;
SELECT outbox_group_create('billing', ordering => 'xid8', start_at => 'beginning');
SELECT outbox_group_create('audit', ordering => :'commit_order', start_at => 'beginning');
SQL

# Opens a transaction that takes an id and stays open: hold ROLE DB.
# (The superuser logs in as the test does, with its password if any.)
hold() {
	local password=holders-test
	[ "$1" != "${PGUSER:-postgres}" ] || password=${PGPASSWORD:-}
	PGUSER=$1 PGPASSWORD=$password PGAPPNAME=holders_test \
		psql -X -q -At -d "$2" -c "BEGIN" -c "SELECT pg_current_xact_id()" -c "SELECT pg_sleep(300)" >/dev/null 2>&1 &
	SESSIONS+=($!)
	wait_until "SELECT count(*) > 0 FROM pg_stat_activity WHERE application_name = 'holders_test'
	             AND usename = '$1' AND backend_xid IS NOT NULL"
}
# Waits (5 s at most) until a query in database holders says t.
wait_until() { until_sql 5 holders "$1"; }
# The pid of the session of a role that hold opened.
session_of() {
	q holders -c "SELECT pid FROM pg_stat_activity WHERE application_name = 'holders_test' AND usename = '$1'"
}
# The pid of the backend that holds the horizon, as the relay role reads it.
holder() { as holders_relay holders -c "SELECT pid FROM outbox.horizon_holders WHERE holds_horizon"; }

hold holders_app holders
q holders -c "SELECT outbox_emit('orders', 'o1', '{}')" -o /dev/null
app_pid=$(session_of holders_app)
# (A maintenance run that started before it may hold it for a moment.)
check "outbox.horizon_holders names the application's open transaction" \
	wait_until "SELECT pid = $app_pid AND username = 'holders_app' FROM outbox.horizon_holders WHERE holds_horizon"
check "the xid8 group's event is held back by it (held_back, held_by_pid)" \
	wait_until "SELECT waiting = 0 AND held_back = 1 AND held_by_pid = $app_pid FROM outbox.group_stats WHERE group_name = 'billing'"
if [ "$ENGINE" = c ]; then
	check "the commit-ordered group's event is not held: it waits to be published, no holder" \
		eq "$(q holders -c "SELECT waiting || ' ' || coalesce(held_back::text, 'null') || ' ' || coalesce(held_by_pid::text, 'null') FROM outbox.group_stats WHERE group_name = 'audit'")" "1 null null"
fi

# The relay role may not end another role's session.
as holders_relay holders -c "SELECT pg_terminate_backend($app_pid)" >"$work/out" 2>&1
check "the relay role may not terminate the application's session (42501)" \
	grep -q 'must be a member of the role whose process is being terminated or member of pg_signal_backend' "$work/out"
check "the session still holds the horizon" eq "$(holder)" "$app_pid"
check "a member of pg_signal_backend terminates it" \
	eq "$(as holders_ops holders -c "SELECT pg_terminate_backend($app_pid)")" t
check "the xid8 group is released: its event waits to be published" \
	wait_until "SELECT waiting = 1 AND held_back = 0 AND held_by_pid IS NULL FROM outbox.group_stats WHERE group_name = 'billing'"

# A superuser's session: only a superuser may end it.
hold "${PGUSER:-postgres}" holders
su_pid=$(session_of "${PGUSER:-postgres}")
as holders_ops holders -c "SELECT pg_terminate_backend($su_pid)" >"$work/out" 2>&1
check "a member of pg_signal_backend may not terminate a superuser's session" \
	grep -q 'must be a superuser to terminate superuser process' "$work/out"
check "a superuser may" eq "$(q holders -c "SELECT pg_terminate_backend($su_pid)")" t
check "nothing holds the horizon any more" \
	wait_until "SELECT count(*) = 0 FROM outbox.horizon_holders WHERE username = '${PGUSER:-postgres}' AND pid = $su_pid"

# A prepared transaction of another database holds the horizon of every
# database (transaction ids are the cluster's).
as holders_app holders_other -c "BEGIN" -c "SELECT pg_current_xact_id()" -c "PREPARE TRANSACTION 'holders_forgotten'" -o /dev/null
q holders -c "SELECT outbox_emit('orders', 'o2', '{}')" -o /dev/null
check "outbox.horizon_holders names the prepared transaction and its database" \
	eq "$(as holders_relay holders -c "SELECT gid || ' ' || database || ' ' || coalesce(pid::text, 'no pid') FROM outbox.horizon_holders WHERE holds_horizon")" \
	"holders_forgotten holders_other no pid"
check "the xid8 group names it as its holder (held_by_gid)" \
	eq "$(q holders -c "SELECT held_by_gid || ' ' || held_back FROM outbox.group_stats WHERE group_name = 'billing'")" "holders_forgotten 1"
q holders -c "ROLLBACK PREPARED 'holders_forgotten'" >"$work/out" 2>&1
check "ROLLBACK PREPARED in another database is refused" \
	grep -q 'prepared transaction belongs to another database' "$work/out"
check "ROLLBACK PREPARED in the database named ends it" \
	q holders_other -c "ROLLBACK PREPARED 'holders_forgotten'"
check "the xid8 group is released: both events wait to be published" \
	wait_until "SELECT waiting = 2 AND held_back = 0 AND held_by_gid IS NULL FROM outbox.group_stats WHERE group_name = 'billing'"

finish
