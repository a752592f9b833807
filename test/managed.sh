#!/usr/bin/env bash
# A managed PostgreSQL service, simulated: pg_outbox's SQL engine where no
# C extension may be installed and nobody is a superuser but the provider.
#
# The cluster runs from a private copy of PostgreSQL's tree without any of
# pg_outbox's files (no pg_outbox.so, no extension), so nothing can load
# the C engine, and nothing is in shared_preload_libraries. The provider
# (the superuser) only makes the databases and a role managed_admin with
# CREATE on them and CREATEROLE, as a service's admin role has. From then
# on, no superuser:
#
# - managed_admin installs sql/pg_outbox_sql.sql with psql -f in a
#   producer database (app) and a consumer database (ledger), and makes the
#   application's, the relay's and the consumer's roles;
# - an application role (a member of outbox_writer) emits events, one
#   transaction rolled back;
# - pg_outbox_relay publishes them to Redis as a member of outbox_relay,
#   and a second pg_outbox_relay consumes them into ledger through the
#   inbox as a member of outbox_consumer;
# - managed_admin runs maintenance as pg_cron would.
#
# Then the stream has every committed event once, and the inbox and the
# handler's table have each once.
#
# The relay finds the API through outbox.engine() (a plain install has no
# pg_extension row). Prints one "ok" / "not ok" line per check and exits
# non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
. test/ops/tap.bash

RELAY=${PG_OUTBOX_RELAY:-$PWD/build/relay/pg_outbox_relay}
plain=$PWD/sql/pg_outbox_sql.sql
events=40

throwaway_workspace managed
BACKGROUND=()
cleanup() {
	local pid
	for pid in "${BACKGROUND[@]}"; do stop_pid "$pid"; done
	stop_servers
	rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

check "the relay is built ($RELAY)" test -x "$RELAY"
check "make built the plain script ($plain)" test -s "$plain"

# The private tree: PostgreSQL's own files, none of pg_outbox's. The
# server finds its libraries and extensions relative to its programs.
tree_root=${PG_BIN%/usr/lib/postgresql/15/bin}
mkdir -p "$WORK/tree/usr/lib/postgresql" "$WORK/tree/usr/share/postgresql"
cp -a "$tree_root/usr/lib/postgresql/15" "$WORK/tree/usr/lib/postgresql/"
cp -a "$tree_root/usr/share/postgresql/15" "$WORK/tree/usr/share/postgresql/"
rm -f "$WORK/tree/usr/lib/postgresql/15/lib/pg_outbox.so" "$WORK/tree/usr/share/postgresql/15/extension/pg_outbox"*
rm -rf "$WORK/tree/usr/lib/postgresql/15/lib/bitcode/pg_outbox"*
check "the private tree has no file of pg_outbox" \
	eq "$(find "$WORK/tree" -name 'pg_outbox*' | head -n 5)" ""
PG_OUTBOX_PG_BIN=$WORK/tree/usr/lib/postgresql/15/bin pg_start "$WORK/pg" "$PG_PORT" || exit 1
redis_start "$WORK/redis" "$REDIS_PORT" || exit 1

# psql as a role: as ROLE DB [psql argument ...] (trust authentication).
as() {
	local role=$1 db=$2
	shift 2
	PGOPTIONS='-c client_min_messages=warning' \
		psql -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U "$role" -d "$db" "$@"
}

check "pg_outbox is not in shared_preload_libraries" \
	eq "$(as postgres postgres -c "SHOW shared_preload_libraries")" ""
check "pg_outbox.so cannot be loaded" bash -c "! psql -X -q -h 127.0.0.1 -p $PG_PORT -U postgres -d postgres -c \"LOAD 'pg_outbox'\" 2>/dev/null"
check "neither engine can be created as an extension" \
	eq "$(as postgres postgres -c "SELECT count(*) FROM pg_available_extensions WHERE name LIKE 'pg\_outbox%'")" 0

# The provider: the databases, and the admin role it hands out.
as postgres postgres >/dev/null <<'SQL'
CREATE ROLE managed_admin LOGIN CREATEROLE;
CREATE DATABASE app;
CREATE DATABASE ledger;
GRANT CREATE ON DATABASE app, ledger TO managed_admin;
SQL
check "managed_admin is no superuser and owns neither database nor schema public" \
	eq "$(as managed_admin app -c "SELECT r.rolsuper, d.datdba = r.oid, n.nspowner = r.oid FROM pg_roles r, pg_database d, pg_namespace n
	                               WHERE r.rolname = current_user AND d.datname = 'app' AND n.nspname = 'public'")" "f|f|f"

# 1. managed_admin installs the SQL engine in both databases.
for db in app ledger; do
	check "$db: managed_admin installs the plain script with psql -f" \
		bash -c "PGOPTIONS='-c client_min_messages=warning' psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p $PG_PORT -U managed_admin -d $db -f '$plain' >'$WORK/install_$db.log' 2>&1"
	grep -A3 'ERROR' "$WORK/install_$db.log" | sed 's/^/#   /'
	check "$db: outbox.engine() says sql, the API in schema outbox" \
		eq "$(as managed_admin "$db" -c "SELECT engine || ' ' || api_schema FROM outbox.engine()")" "sql outbox"
done

# 2. The producer's side, as managed_admin: the business table, the
# application's and the relay's roles, the group.
as managed_admin app >/dev/null <<'SQL'
CREATE SCHEMA shop;
CREATE TABLE shop.orders (id bigint PRIMARY KEY, customer text NOT NULL, amount numeric NOT NULL);
CREATE ROLE shop_app LOGIN IN ROLE outbox_writer;
GRANT USAGE ON SCHEMA shop TO shop_app;
GRANT SELECT, INSERT ON shop.orders TO shop_app;
CREATE ROLE relay_app LOGIN IN ROLE outbox_relay;
SELECT outbox.outbox_group_create('billing', start_at => 'beginning');
SQL
check "app: the group is created, xid8-ordered" \
	eq "$(as managed_admin app -c "SELECT ordering FROM outbox.outbox_groups('billing')")" xid8

# 3. The application emits, with outbox on its search_path or naming it.
as shop_app app -v events="$events" >"$WORK/emit.log" 2>&1 <<'SQL'
SET search_path = shop, outbox;
SELECT count(*) FROM (
	SELECT outbox_emit('orders', 'c' || (i % 7), jsonb_build_object('id', i, 'customer', 'c' || (i % 7), 'amount', i))
	  FROM generate_series(1, :events / 2) i) e;
INSERT INTO orders SELECT i, 'c' || (i % 7), i FROM generate_series(1, :events / 2) i;
BEGIN;
INSERT INTO orders VALUES (0, 'nobody', 1);
SELECT outbox_emit('orders', 'nobody', '{"id": 0, "customer": "nobody", "amount": 1}');
ROLLBACK;
BEGIN;
INSERT INTO shop.orders SELECT i, 'c' || (i % 7), i FROM generate_series(:events / 2 + 1, :events) i;
SELECT count(*) FROM outbox.outbox_emit_many('orders',
	(SELECT array_agg('c' || (i % 7) ORDER BY i) FROM generate_series(:events / 2 + 1, :events) i),
	(SELECT array_agg(jsonb_build_object('id', i, 'customer', 'c' || (i % 7), 'amount', i) ORDER BY i)
	   FROM generate_series(:events / 2 + 1, :events) i));
COMMIT;
SQL
emitted=$?
check "app: shop_app (outbox_writer) emits" test "$emitted" -eq 0
[ "$emitted" -eq 0 ] || sed 's/^/#   /' "$WORK/emit.log"

# 4. The consumer's side, as managed_admin: the projection, the
# consumer's role, the consumer and its handler.
as managed_admin ledger >/dev/null <<'SQL'
CREATE SCHEMA books;
CREATE TABLE books.applied (event_id uuid PRIMARY KEY, customer text NOT NULL, amount numeric NOT NULL);
CREATE ROLE ledger_app LOGIN IN ROLE outbox_consumer;
GRANT USAGE ON SCHEMA books TO ledger_app;
GRANT SELECT, INSERT ON books.applied TO ledger_app;
SELECT outbox.inbox_consumer_create('accounting', 'ledger_app');
SQL
check "ledger: the consumer is registered to ledger_app" \
	eq "$(as managed_admin ledger -c "SELECT owner FROM outbox.inbox_consumers() WHERE consumer = 'accounting'")" ledger_app

# 5. The relay and the consumer, as their roles.
"$RELAY" publish --pg "host=127.0.0.1 port=$PG_PORT dbname=app user=relay_app" \
	--redis "127.0.0.1:$REDIS_PORT" --group billing >"$WORK/publish.log" 2>&1 &
BACKGROUND+=($!)
"$RELAY" consume --pg "host=127.0.0.1 port=$PG_PORT dbname=ledger user=ledger_app" \
	--redis "127.0.0.1:$REDIS_PORT" --consumer accounting --stream outbox:orders \
	--handler 'INSERT INTO books.applied VALUES ($5, $3->>'\''customer'\'', ($3->>'\''amount'\'')::numeric)' \
	>"$WORK/consume.log" 2>&1 &
BACKGROUND+=($!)

applied() { as postgres ledger -c "SELECT count(*) FROM books.applied"; }
check "ledger: every committed event is applied (within 120 s)" wait_for 120 '[ "$(applied)" = "$events" ]'
[ "$(applied)" = "$events" ] || for log in publish consume; do
	tail -n 5 "$WORK/$log.log" | sed "s/^/#   $log: /"
done

# 6. Each once, in the stream, the inbox and the projection.
redis() { redis-cli -p "$REDIS_PORT" "$@"; }
check "the stream has every committed event once" \
	eq "$(redis --raw XRANGE outbox:orders - + | awk 'p { print; p = 0 } $0 == "event_id" { p = 1 }' | sort -u | wc -l) $(redis XLEN outbox:orders)" \
	"$events $events"
check "the stream has nothing of the rolled-back transaction" \
	eq "$(redis --raw XRANGE outbox:orders - + | grep -c nobody)" 0
check "the inbox has every event once" \
	eq "$(as postgres ledger -c "SELECT count(*) || ' ' || count(DISTINCT event_id) FROM outbox.inbox WHERE consumer = 'accounting'")" \
	"$events $events"
check "the projection has every order once, and the inbox the same events" \
	eq "$(as postgres ledger -c "SELECT count(*) || ' ' || sum(amount) FROM books.applied a JOIN outbox.inbox i ON i.consumer = 'accounting' AND i.event_id = a.event_id")" \
	"$events $((events * (events + 1) / 2))"
check "the group's cursor passed every event" \
	wait_for 30 '[ "$(as postgres app -c "SELECT waiting FROM outbox.outbox_group_stats('\''billing'\'')")" = 0 ]'

# 7. Who did it: no superuser anywhere but the provider.
check "the relay and the consumer ran as their roles, none a superuser" \
	eq "$(as postgres postgres -c "SELECT string_agg(DISTINCT a.usename || ':' || r.rolsuper, ',' ORDER BY a.usename || ':' || r.rolsuper)
	                               FROM pg_stat_activity a JOIN pg_roles r ON r.oid = a.usesysid
	                              WHERE a.application_name LIKE 'pg_outbox_relay%'")" \
	"ledger_app:false,relay_app:false"
check "managed_admin runs maintenance, as pg_cron would (app)" as managed_admin app -c "SELECT count(*) FROM outbox.outbox_maintain()" -o /dev/null
check "managed_admin runs maintenance, as pg_cron would (ledger: inbox partitions)" \
	as managed_admin ledger -c "SELECT count(*) FROM outbox.outbox_maintain()" -o /dev/null

finish
