#!/usr/bin/env bash
# pg_outbox demo: a bank records transfers and emits events in the same
# transaction; the relay publishes them to Redis Streams; a ledger applies
# each one exactly once through the inbox. Then the five fault windows are
# injected one after another, and a table says what was observed. Last, the
# two orders of the feed side by side: a transaction inversion published in
# commit order and in xid8 order, and a forgotten open transaction that holds
# the xid8 group but not the commit-ordered ones.
#
# Everything runs on throwaway servers on loopback (one PostgreSQL with two
# databases, "bank" and "ledger", and one Redis), stopped by PID at the end,
# also on failure or Ctrl-C. Exit status: non-zero if any check failed.
#
# It builds and installs the extension and builds the relay from the tree.
# To run it on what is installed instead (the Debian packages, say):
#   PG_OUTBOX_SKIP_BUILD=1 PG_OUTBOX_RELAY=/usr/bin/pg_outbox_relay scripts/demo.sh
# PG_OUTBOX_SKIP_BUILD=1 uses the installed extension; PG_OUTBOX_RELAY names
# the relay binary to run (default: build/relay/pg_outbox_relay, built).
# The servers are started by the test kit's program (test/kit), a test tool
# that is not packaged: it is built into build/ when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

TRANSFERS=${DEMO_TRANSFERS:-300}

ensure_packages
if [ -z "${PG_OUTBOX_SKIP_BUILD:-}" ]; then
	build_extension
fi
RELAY=${PG_OUTBOX_RELAY:-}
if [ -z "$RELAY" ]; then
	build_relay pg_outbox_relay
	RELAY=build/relay/pg_outbox_relay
fi
say "relay: $RELAY ($("$RELAY" --version)); extension: $(pg_config --sharedir)/extension"

throwaway_workspace demo
PUBLISHER_PID=
CONSUMER_PID=
STEPS_PIDS=()
stop_all() {
	local pid
	for pid in "${STEPS_PIDS[@]}"; do stop_pid "$pid"; done
	stop_pid "$CONSUMER_PID"
	stop_pid "$PUBLISHER_PID"
	stop_servers
}
cleanup() {
	stop_all
	rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

bank() { psql -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U postgres -d bank "$@"; }
ledger() { psql -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U postgres -d ledger "$@"; }
redis() { redis-cli -p "$REDIS_PORT" "$@"; }
STREAM=outbox:transfers
HANDLER='SELECT apply_transfer($3, $5)'

start_publisher() {
	"$RELAY" publish --pg "host=127.0.0.1 port=$PG_PORT dbname=bank user=relay" --redis "127.0.0.1:$REDIS_PORT" \
		--group ledger-relay --poll-interval 200ms --retry-max 1s --stats-interval 2s >>"$WORK/publisher.log" 2>&1 &
	PUBLISHER_PID=$!
}
start_consumer() {
	"$RELAY" consume --pg "host=127.0.0.1 port=$PG_PORT dbname=ledger user=ledger_app" \
		--redis "127.0.0.1:$REDIS_PORT" --consumer accounting --worker demo-worker --stream "$STREAM" \
		--handler "$HANDLER" --block 200ms --min-idle 1s --claim-interval 500ms --retry-max 1s >>"$WORK/consumer.log" 2>&1 &
	CONSUMER_PID=$!
}
applied() { ledger -c "SELECT coalesce(sum(transfers), 0) FROM totals"; }
journal() { bank -c "SELECT count(*) FROM journal"; }
pending() { redis xpending "$STREAM" accounting | head -n 1; }

say "starting PostgreSQL on 127.0.0.1:$PG_PORT and Redis on 127.0.0.1:$REDIS_PORT (throwaway, in $WORK)"
# Preloaded, for commit-ordered groups (the default then).
pg_start "$WORK/pg" "$PG_PORT" "max_prepared_transactions = 10" "shared_preload_libraries = 'pg_outbox'"
redis_start "$WORK/redis" "$REDIS_PORT" --appendonly yes --appendfsync always

say "the bank (producer database): accounts, journal, entries, and the outbox"
psql -X -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -c "CREATE DATABASE bank" -c "CREATE DATABASE ledger"
bank >/dev/null <<'SQL'
CREATE EXTENSION pg_outbox;
CREATE ROLE relay LOGIN IN ROLE outbox_relay;
CREATE TABLE accounts (id int PRIMARY KEY, currency text NOT NULL, balance numeric NOT NULL DEFAULT 0);
CREATE TABLE journal (id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT now(), description text);
CREATE TABLE entries (journal_id bigint REFERENCES journal, account_id int REFERENCES accounts, amount numeric NOT NULL);
INSERT INTO accounts SELECT i, (ARRAY['EUR', 'USD', 'GBP'])[1 + i % 3], 1000000 FROM generate_series(1, 30) i;

-- A transfer: journal, two entries, two balances and the event, in one
-- transaction. If any of it fails, none of it happened, the event included.
CREATE FUNCTION transfer(from_account int, to_account int, amount numeric) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    j bigint;
    cur text;
BEGIN
    SELECT currency INTO cur FROM accounts WHERE id = from_account;
    INSERT INTO journal (description) VALUES (format('%s -> %s', from_account, to_account)) RETURNING id INTO j;
    INSERT INTO entries VALUES (j, from_account, -amount), (j, to_account, amount);
    UPDATE accounts SET balance = balance - amount WHERE id = from_account;
    UPDATE accounts SET balance = balance + amount WHERE id = to_account;
    PERFORM outbox_emit('transfers', j::text,
                        jsonb_build_object('journal_id', j, 'from', from_account, 'to', to_account,
                                           'amount', amount, 'currency', cur));
    RETURN j;
END
$$;
SELECT outbox_group_create('ledger-relay');

-- For the two orders: topic "steps", read by one group in each order.
CREATE TABLE steps (name text PRIMARY KEY);
SELECT outbox_group_create('steps-commit', ARRAY['steps'], 'now', 'commit');
SELECT outbox_group_create('steps-xid8', ARRAY['steps'], 'now', 'xid8');
SQL

say "the ledger (consumer database): a projection per consumer and currency, fed through the inbox"
ledger <<'SQL'
CREATE EXTENSION pg_outbox;
CREATE ROLE ledger_app LOGIN IN ROLE outbox_consumer;
CREATE TABLE totals (consumer text, currency text, transfers int NOT NULL, volume numeric NOT NULL,
                     PRIMARY KEY (consumer, currency));
CREATE TABLE refuse (journal_id bigint PRIMARY KEY);  -- to make the handler fail on purpose
CREATE FUNCTION apply_transfer(payload jsonb, event_id uuid) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM refuse WHERE journal_id = (payload->>'journal_id')::bigint) THEN
        RAISE EXCEPTION 'ledger refuses journal %', payload->>'journal_id';
    END IF;
    INSERT INTO totals VALUES ('accounting', payload->>'currency', 1, (payload->>'amount')::numeric)
    ON CONFLICT (consumer, currency)
    DO UPDATE SET transfers = totals.transfers + 1, volume = totals.volume + excluded.volume;
END
$$;
GRANT ALL ON totals, refuse TO ledger_app;
-- The consumer "accounting" belongs to ledger_app: only its members apply for it.
SELECT inbox_consumer_create('accounting', 'ledger_app');
SQL

say "relay (publish) and consumer (consume) started; two more relays publish the steps groups to demo:<group>"
start_publisher
start_consumer
for group in steps-commit steps-xid8; do
	"$RELAY" publish --pg "host=127.0.0.1 port=$PG_PORT dbname=bank user=relay" --redis "127.0.0.1:$REDIS_PORT" \
		--group "$group" --stream 'demo:{group}' --poll-interval 200ms --retry-max 1s >>"$WORK/steps-$group.log" 2>&1 &
	STEPS_PIDS+=($!)
done

say "recording $TRANSFERS transfers, each in its own transaction"
bank -c "DO \$\$ BEGIN FOR i IN 1 .. $TRANSFERS LOOP PERFORM transfer(1 + (i * 7) % 30, 1 + (i * 7 + 3) % 30, 1 + i % 97); COMMIT; END LOOP; END \$\$"
wait_for 30 '[ "$(applied)" -eq "$(journal)" ]' || true
say "applied $(applied) of $(journal) transfers"

RESULTS="$WORK/results"
: >"$RESULTS"
failures=0
record() { # injection | durable afterwards | observed | ok?
	local status=PASS
	if [ "$4" != 0 ]; then
		status=FAIL
		failures=$((failures + 1))
	fi
	printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$status" >>"$RESULTS"
}
# The next id above the stream's top and below the relay's next ones.
id_between() { redis xrevrange "$STREAM" + - COUNT 1 | head -n 1 | awk -F- '{ print $1 "-" $2 + 1000000 }'; }

# 1. The relay dies after XADD, before advancing its cursor.
say "fault 1: the relay dies after XADD, before advancing its cursor"
bank -c "REVOKE EXECUTE ON FUNCTION outbox_advance(text, text, jsonb) FROM outbox_relay"
before=$(bank -c "SELECT cursor FROM outbox.groups")
bank -c "SELECT transfer(2, 5, 11), transfer(3, 6, 12)" >/dev/null
wait "$PUBLISHER_PID" || true
PUBLISHER_PID=
after=$(bank -c "SELECT cursor FROM outbox.groups")
bank -c "GRANT EXECUTE ON FUNCTION outbox_advance(text, text, jsonb) TO outbox_relay"
start_publisher
wait_for 20 '[ "$(applied)" -eq "$(journal)" ]' || true
dups=$(redis xrange "$STREAM" - + | grep -A1 '^event_id$' | grep -v '^event_id$\|^--$' | sort | uniq -d | wc -l)
refused=$(grep -c 'already in Redis' "$WORK/publisher.log" || true)
record "relay dies after XADD, before advancing" \
	"events in Redis, cursor behind ($([ "$before" = "$after" ] && echo unchanged || echo moved))" \
	"replay refused by Redis ($refused batch), $dups duplicate entries, applied once" \
	"$([ "$before" = "$after" ] && [ "$dups" -eq 0 ] && [ "$refused" -ge 1 ] && [ "$(applied)" -eq "$(journal)" ]; echo $?)"

# 2. The consumer's transaction fails after inserting the inbox row.
say "fault 2: the consumer's transaction fails after inserting the inbox row"
j=$(bank -c "SELECT max(id) + 1 FROM journal")
ledger -c "INSERT INTO refuse VALUES ($j)"
bank -c "SELECT transfer(4, 7, 13)" >/dev/null
wait_for 10 'grep -q "stays pending" "$WORK/consumer.log"' || true
in_inbox=$(ledger -c "SELECT count(*) FROM outbox.inbox WHERE payload->>'journal_id' = '$j'")
applied_then=$(applied)
ledger -c "DELETE FROM refuse"
wait_for 20 '[ "$(applied)" -eq "$(journal)" ] && [ "$(pending)" = 0 ]' || true
record "consumer transaction fails after the inbox insert" \
	"rolled back: inbox rows $in_inbox, projection $applied_then of $(journal); entry pending" \
	"entry reclaimed and applied once ($(applied) of $(journal))" \
	"$([ "$in_inbox" = 0 ] && [ "$applied_then" -eq $(($(journal) - 1)) ] && [ "$(applied)" -eq "$(journal)" ]; echo $?)"

# 3. The consumer commits and dies before XACK.
say "fault 3: the consumer commits, then dies before XACK"
stop_pid "$CONSUMER_PID"
CONSUMER_PID=
bank -c "SELECT transfer(8, 11, 14)" >/dev/null
wait_for 10 '[ "$(redis xlen "$STREAM")" -ge "$(journal)" ]' || true
entry=$(redis xreadgroup GROUP accounting crashed-worker COUNT 1 STREAMS "$STREAM" '>')
event_id=$(echo "$entry" | grep -A1 '^event_id$' | tail -n 1)
payload=$(echo "$entry" | grep -A1 '^payload$' | tail -n 1)
ledger -c "SELECT status FROM inbox_consume('accounting', '$HANDLER', ARRAY[convert_to('$event_id', 'UTF8')], ARRAY[convert_to('transfers', 'UTF8')], NULL, ARRAY[convert_to(\$p\$$payload\$p\$, 'UTF8')], NULL)" >/dev/null
applied_then=$(applied)
pending_then=$(pending)
start_consumer
wait_for 20 '[ "$(pending)" = 0 ]' || true
record "consumer commits, dies before XACK" \
	"inbox and projection committed ($applied_then of $(journal)); $pending_then entry pending" \
	"reclaimed as a duplicate, acknowledged; projection $(applied) of $(journal)" \
	"$([ "$applied_then" -eq "$(journal)" ] && [ "$(applied)" -eq "$(journal)" ] && [ "$(pending)" = 0 ] && grep -q 'applied before; acknowledged' "$WORK/consumer.log"; echo $?)"

# 4. A new stream entry carrying a known event id.
say "fault 4: a new stream entry carries an event id already applied"
read -r event_id payload < <(bank -c "SELECT event_id, payload FROM outbox.event ORDER BY txid, seq LIMIT 1" -F ' ')
applied_then=$(applied)
redis xadd "$STREAM" "$(id_between)" event_id "$event_id" topic transfers payload "$payload" >/dev/null
wait_for 10 '[ "$(pending)" = 0 ] && [ "$(ledger -c "SELECT count(*) FROM outbox.inbox")" -eq "$(journal)" ]' || true
sleep 1
record "new entry with a known event id" \
	"two stream entries, one event id" \
	"duplicate, acknowledged; projection $(applied) of $(journal)" \
	"$([ "$(applied)" -eq "$applied_then" ] && [ "$(pending)" = 0 ]; echo $?)"

# 5. The same event id with a changed amount.
say "fault 5: the same event id arrives with a changed amount"
forged=$(echo "$payload" | sed 's/"amount": [0-9.]*/"amount": 999999/')
redis xadd "$STREAM" "$(id_between)" event_id "$event_id" topic transfers payload "$forged" >/dev/null
wait_for 10 '[ "$(ledger -c "SELECT count(*) FROM outbox.dead_letters")" -ge 1 ]' || true
dl=$(ledger -c "SELECT sqlstate || ' applied ' || (applied_payload->>'amount') || ', received ' || (payload->>'amount') FROM outbox.dead_letters")
record "same event id, changed amount" \
	"inbox keeps the original; dead letter with both payloads" \
	"identity conflict ($dl); projection $(applied) of $(journal)" \
	"$([ -n "$dl" ] && [ "${dl%% *}" = OB001 ] && [ "$(applied)" -eq "$applied_then" ] && [ "$(pending)" = 0 ]; echo $?)"

# The projection equals the producer's journal.
wait_for 10 '[ "$(applied)" -eq "$(journal)" ]' || true
bank_totals=$(bank -c "SELECT string_agg(format('%s %s %s', currency, n, total), ', ' ORDER BY currency)
                         FROM (SELECT a.currency, count(*) AS n, sum(e.amount) AS total
                                 FROM entries e JOIN accounts a ON a.id = e.account_id
                                WHERE e.amount > 0 GROUP BY a.currency) t")
ledger_totals=$(ledger -c "SELECT string_agg(format('%s %s %s', currency, transfers, volume), ', ' ORDER BY currency) FROM totals")
record "(end) projection vs journal" "bank: $bank_totals" "ledger: $ledger_totals" \
	"$([ "$bank_totals" = "$ledger_totals" ]; echo $?)"

# The two orders. A takes its transaction id first; B inserts a row, emits
# and commits; A reads B's row, emits and commits last.
say "two orders: A takes its transaction id first, B commits, then A reads B's row and commits"
# A stream's entries as "key@position key@position ...", and their keys as "key,key".
entries_of() { redis xrange "$1" - + | awk 'prev == "key" { k = $0 } prev == "position" { printf "%s%s@%s", sep, k, $0; sep = " " } { prev = $0 } END { print "" }'; }
keys_of() { entries_of "$1" | tr ' ' '\n' | cut -d@ -f1 | paste -sd, -; }
PGAPPNAME=demo-A psql -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U postgres -d bank >/dev/null <<'SQL' &
BEGIN;
INSERT INTO steps VALUES ('A');  -- A's transaction id, before B's
DO $$ BEGIN  -- until B has committed (each EXISTS takes a new snapshot), at most 10 s
    FOR i IN 1 .. 200 LOOP
        EXIT WHEN EXISTS (SELECT 1 FROM steps WHERE name = 'B');
        PERFORM pg_sleep(0.05);
    END LOOP;
END $$;
SELECT outbox_emit('steps', 'A', jsonb_build_object('read', (SELECT array_agg(name) FROM steps WHERE name <> 'A')));
COMMIT;
SQL
a_pid=$!
wait_for 10 '[ "$(bank -c "SELECT count(*) FROM pg_stat_activity WHERE application_name = '"'demo-A'"' AND backend_xid IS NOT NULL")" = 1 ]' || true
bank -c "BEGIN" -c "INSERT INTO steps VALUES ('B')" -c "SELECT outbox_emit('steps', 'B', '{}')" -c "COMMIT" >/dev/null
wait "$a_pid"
wait_for 10 '[ "$(redis xlen demo:steps-commit)" = 2 ] && [ "$(redis xlen demo:steps-xid8)" = 2 ]' || true
say "demo:steps-commit (commit order): $(entries_of demo:steps-commit)"
say "demo:steps-xid8   (xid8 order):   $(entries_of demo:steps-xid8)"
a_read=$(bank -c "SELECT payload->>'read' FROM outbox.event WHERE topic = 'steps' AND key = 'A'")
record "A (older xid) commits after B, reading B's row" \
	"A read $a_read; B committed first" \
	"commit order $(keys_of demo:steps-commit), xid8 order $(keys_of demo:steps-xid8)" \
	"$([ "$(keys_of demo:steps-commit)" = B,A ] && [ "$(keys_of demo:steps-xid8)" = A,B ] && [ "$a_read" = '["B"]' ]; echo $?)"

echo
say "live statistics of the producer, while a forgotten transaction holds the horizon"
PGAPPNAME=demo-forgotten psql -X -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -d bank \
	-c "BEGIN" -c "UPDATE accounts SET balance = balance WHERE id = 1" -c "SELECT pg_sleep(4)" -c "COMMIT" >/dev/null &
holder=$!
wait_for 10 '[ -n "$(bank -c "SELECT pid FROM pg_stat_activity WHERE application_name = '"'demo-forgotten'"' AND backend_xid IS NOT NULL")" ]' || true
holder_pid=$(bank -c "SELECT pid FROM pg_stat_activity WHERE application_name = 'demo-forgotten'")
bank -c "SELECT outbox_emit('steps', 'C', '{}')" >/dev/null
bank -c "SELECT transfer(9, 12, 15)" >/dev/null
wait_for 3 '[ "$(redis xlen demo:steps-commit)" = 3 ] && [ "$(applied)" -eq "$(journal)" ]' || true
sleep 0.5 # the xid8 relay's turn to publish C, if it could
psql -X -h 127.0.0.1 -p "$PG_PORT" -U postgres -d bank \
	-c "SELECT group_name, ordering, cursor_position, leader_pid IS NOT NULL AS led, waiting, horizon, commit_horizon, held_by_pid, held_for FROM outbox.group_stats" \
	-c "SELECT holds_horizon, pid, state, xid_age, left(query, 50) AS query FROM outbox.horizon_holders"
held=$(bank -c "SELECT string_agg(format('%s %s', group_name, coalesce(held_by_pid::text, '-')), ', ' ORDER BY group_name) FROM outbox.group_stats")
named=$(bank -c "SELECT pid FROM outbox.horizon_holders WHERE holds_horizon")
during="C in demo:steps-commit $(redis xlen demo:steps-commit)/3, demo:steps-xid8 $(redis xlen demo:steps-xid8)/3; transfers applied $(applied) of $(journal)"
delivered_while_held=$([ "$(redis xlen demo:steps-commit)" = 3 ] && [ "$(redis xlen demo:steps-xid8)" = 2 ] && [ "$(applied)" -eq "$(journal)" ]; echo $?)
wait "$holder"
wait_for 10 '[ "$(redis xlen demo:steps-xid8)" = 3 ]' || true
say "once it ended, the xid8 group published C too: demo:steps-xid8 $(keys_of demo:steps-xid8)"
record "a forgotten open transaction (pid $holder_pid)" \
	"held by (group_stats): $held; holder (horizon_holders): $named" \
	"while open: $during; after: xid8 $(keys_of demo:steps-xid8)" \
	"$([ "$delivered_while_held" = 0 ] && [ "$held" = "ledger-relay -, steps-commit -, steps-xid8 $holder_pid" ] && [ "$named" = "$holder_pid" ] && [ "$(keys_of demo:steps-xid8)" = A,B,C ]; echo $?)"
echo
say "the first stream entries (entry id = feed position)"
first=$(redis xrange "$STREAM" - + COUNT 1 | head -n 1)
second=$(redis xrange "$STREAM" "($first" + COUNT 1 | head -n 1)
for id in "$first" "$second"; do
	redis xrange "$STREAM" "$id" "$id" | awk 'NR == 1 { printf "    %s ", $0; next } NR % 2 == 0 { k = $0; next } { printf " %s=%s", k, $0 } END { print "" }'
done
say "dead letters in the ledger"
psql -X -h 127.0.0.1 -p "$PG_PORT" -U postgres -d ledger \
	-c "SELECT consumer, entry_id, sqlstate, deliveries, left(reason, 60) AS reason FROM outbox.dead_letters"

echo
say "fault windows and the two orders"
{
	printf 'injection\tdurable afterwards\tobserved\tresult\n'
	cat "$RESULTS"
} | awk -F '\t' '{ printf "%-46s | %-70s | %-72s | %s\n", $1, $2, $3, $4 }'
echo
if [ "$failures" -eq 0 ]; then
	echo "demo: all checks passed"
else
	echo "demo: $failures check(s) failed; logs: $WORK (kept)"
	trap - EXIT
	stop_all
	exit 1
fi
