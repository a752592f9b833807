#!/usr/bin/env bash
# Runs one example application end to end on throwaway servers and checks
# it: examples/run.sh python|node|go
#
# PostgreSQL and Redis start on free loopback ports, the example's
# setup.sql makes the "shop" and "reports" databases, and pg_outbox_relay
# publishes the shop's outbox to Redis. Then:
#   1. the consumer starts with CRASH_AFTER_COMMIT set, so it dies (SIGKILL)
#      right after one of its commits, before the XACK;
#   2. the order service places checkouts, some declined after emitting
#      (rolled back), some retried after serialization failures;
#   3. the consumer restarts under another worker name, reclaims the
#      pending entry with XAUTOCLAIM and must report it as a duplicate;
#   4. a copy of an entry, a forged one (same event id, another amount) and
#      two malformed ones (not an event; bytes that are not UTF-8 text) are
#      added to the stream: a duplicate, an identity conflict, dead letters;
#   5. exactly the committed orders must have been applied, each once;
#   6. trace context: the checkouts that came in traced handed it to their
#      events (SET LOCAL pg_outbox.traceparent), and the consumer's span of
#      each such event is a child of the checkout's span, in its trace
#      (from the spans both services write to SPANS_FILE).
# Exit status: non-zero if any check failed. Servers are stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

example=${1:-}
CHECKOUTS=${EXAMPLE_CHECKOUTS:-30}
REJECT_EVERY=5
CRASH_AFTER=4

case $example in
python) packages=(jq python3 python3-psycopg python3-psycopg-pool python3-redis) ;;
go) packages=(jq golang-go golang-github-jackc-pgx-v4-dev golang-github-gomodule-redigo-dev golang-opentelemetry-otel-dev) ;;
node)
	packages=(jq nodejs)
	# A Node.js from elsewhere (NodeSource) brings its own npm and conflicts
	# with Debian's npm package.
	command -v npm >/dev/null || packages+=(npm)
	;;
*)
	echo "usage: $0 python|node|go" >&2
	exit 2
	;;
esac

ensure_packages "${packages[@]}"
build_extension
build_relay pg_outbox_relay
RELAY=$PWD/build/relay/pg_outbox_relay

throwaway_workspace "example_$example"
RELAY_PID=
CONSUMER_PID=
stop_all() {
	stop_pid "$CONSUMER_PID"
	stop_pid "$RELAY_PID"
	stop_servers
}
cleanup() {
	stop_all
	rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "building the $example example"
case $example in
python)
	# Debian's psycopg and redis-py are installed for Debian's interpreter,
	# which another python3 first in PATH (pyenv, a virtualenv) does not see.
	orders=(/usr/bin/python3 examples/python/orders.py)
	consumer=(/usr/bin/python3 examples/python/consumer.py)
	;;
node)
	(cd examples/node && npm ci --no-audit --no-fund --loglevel=error >"$WORK/npm.log" 2>&1) ||
		{ cat "$WORK/npm.log"; exit 1; }
	orders=(node examples/node/orders.js)
	consumer=(node examples/node/consumer.js)
	;;
go)
	# Offline, from Debian's Go packages (see examples/go/README.md).
	(cd examples/go && GO111MODULE=off GOPATH=/usr/share/gocode GOPROXY=off GOFLAGS= \
		go build -o "$WORK/shop" .) >"$WORK/go-build.log" 2>&1 || { cat "$WORK/go-build.log"; exit 1; }
	orders=("$WORK/shop" orders)
	consumer=("$WORK/shop" consumer)
	;;
esac

psql_as() { # psql_as USER DATABASE [psql arguments]
	local user=$1 db=$2
	shift 2
	psql -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U "$user" -d "$db" "$@"
}
shop() { psql_as postgres shop "$@"; }
reports() { psql_as postgres reports "$@"; }
redis() { redis-cli -p "$REDIS_PORT" "$@"; }
STREAM=outbox:orders
export REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
export SPANS_FILE=$WORK/spans.jsonl

start_consumer() { # start_consumer WORKER [VAR=value ...]
	local worker=$1
	shift
	env DATABASE_URL="postgresql://reports_app@127.0.0.1:$PG_PORT/reports" WORKER="$worker" \
		MIN_IDLE_MS=1000 CLAIM_INTERVAL_MS=500 "$@" "${consumer[@]}" >>"$WORK/consumer.log" 2>&1 &
	CONSUMER_PID=$!
}
committed() { shop -c "SELECT count(*) FROM orders"; }
applied() { reports -c "SELECT count(*) FROM applied_orders"; }
pending() { redis xpending "$STREAM" reports | head -n 1; }
field() { # field NAME: a field's value from an entry printed by redis-cli, on stdin
	grep -A1 -x "$1" | sed -n 2p
}

say "starting PostgreSQL on 127.0.0.1:$PG_PORT and Redis on 127.0.0.1:$REDIS_PORT (throwaway, in $WORK)"
pg_start "$WORK/pg" "$PG_PORT"
redis_start "$WORK/redis" "$REDIS_PORT"
psql_as postgres postgres -f examples/setup.sql >/dev/null

say "relay (publish) started; the consumer starts and will die after its commit number $CRASH_AFTER, before XACK"
"$RELAY" publish --pg "host=127.0.0.1 port=$PG_PORT dbname=shop user=relay" --redis "127.0.0.1:$REDIS_PORT" \
	--group shop-relay --poll-interval 200ms --retry-max 1s >>"$WORK/relay.log" 2>&1 &
RELAY_PID=$!
start_consumer worker-1 CRASH_AFTER_COMMIT=$CRASH_AFTER

say "the order service places $CHECKOUTS checkouts on 2 connections, every ${REJECT_EVERY}th declined after emitting"
timeout 120 env DATABASE_URL="postgresql://shop_app@127.0.0.1:$PG_PORT/shop" ORDERS="$CHECKOUTS" WORKERS=2 \
	REJECT_EVERY=$REJECT_EVERY "${orders[@]}" >"$WORK/orders.out" 2>"$WORK/orders.log" || {
	cat "$WORK/orders.log" "$WORK/orders.out"
	exit 1
}
cat "$WORK/orders.out"

RESULTS=$WORK/results
: >"$RESULTS"
failures=0
check() { # check NAME OBSERVED STATUS
	local status=PASS
	if [ "$3" != 0 ]; then
		status=FAIL
		failures=$((failures + 1))
	fi
	printf '%s\t%s\t%s\n' "$1" "$2" "$status" >>"$RESULTS"
}

reported=$(sed -n 's/^orders: committed \([0-9]*\) orders.*/\1/p' "$WORK/orders.out")
declined=$(sed -n 's/.*declined \([0-9]*\) checkouts.*/\1/p' "$WORK/orders.out")
strays=$(shop -c "SELECT count(*) FROM outbox.event e FULL JOIN orders o ON o.id = (e.payload->>'order_id')::uuid
                   WHERE e.event_id IS NULL OR o.id IS NULL")
check "declined checkouts left no order and no event" \
	"$(committed) orders committed ($reported reported), $declined checkouts declined, $strays events without order or orders without event" \
	"$([ "$(committed)" = "$reported" ] && [ "${declined:-0}" -gt 0 ] && [ "$strays" = 0 ]; echo $?)"

say "waiting for the consumer to die after a commit"
wait_for 60 '! kill -0 "$CONSUMER_PID" 2>/dev/null' 2>/dev/null || true
status=0
{ wait "$CONSUMER_PID"; } 2>/dev/null || status=$?
CONSUMER_PID=
crashed=$(sed -n 's/.*committed \(.*\), dying before XACK$/\1/p' "$WORK/consumer.log" | head -n 1)
crashed_event=$(redis xrange "$STREAM" "$crashed" "$crashed" | field event_id)
in_inbox=$(reports -c "SELECT count(*) FROM outbox.inbox WHERE event_id = '${crashed_event:-00000000-0000-0000-0000-000000000000}'")
pending_then=$(pending)

say "restarting the consumer as another worker: it must reclaim entry $crashed"
start_consumer worker-2
wait_for 60 '[ "$(applied)" -ge "$(committed)" ] && [ "$(pending)" = 0 ] && grep -q "duplicate $crashed " "$WORK/consumer.log"' || true
check "consumer dies between commit and XACK" \
	"exit status $status after committing entry ${crashed:-?} (in the inbox: $in_inbox), $pending_then pending" \
	"$([ "$status" = 137 ] && [ -n "$crashed" ] && [ "$in_inbox" = 1 ] && [ "$pending_then" -ge 1 ]; echo $?)"
check "the restarted worker reclaims it (XAUTOCLAIM)" \
	"$(grep -c 'duplicate '"$crashed"' ' "$WORK/consumer.log" || true) duplicate report for $crashed; applied $(reports -c "SELECT count(*) FROM applied_orders WHERE event_id = '${crashed_event:-00000000-0000-0000-0000-000000000000}'") time(s); $(pending) pending" \
	"$(grep -q "duplicate $crashed " "$WORK/consumer.log" && [ "$(reports -c "SELECT count(*) FROM applied_orders WHERE event_id = '$crashed_event'")" = 1 ] && [ "$(pending)" = 0 ]; echo $?)"

say "adding a copy of an entry, a forged one (same event id, another amount) and two malformed ones to the stream"
applied_before=$(applied)
totals_before=$(reports -c "SELECT string_agg(format('%s %s %s', customer, orders, amount_cents), ', ' ORDER BY customer) FROM order_totals")
first=$(redis xrange "$STREAM" - + COUNT 1)
event_id=$(field event_id <<<"$first")
payload=$(field payload <<<"$first")
forged=$(sed 's/"amount_cents": [0-9]*/"amount_cents": 999999/' <<<"$payload")
id_between() { redis xrevrange "$STREAM" + - COUNT 1 | head -n 1 | awk -F- '{ print $1 "-" $2 + 1000000 }'; }
copy_id=$(redis xadd "$STREAM" "$(id_between)" event_id "$event_id" topic orders payload "$payload")
forged_id=$(redis xadd "$STREAM" "$(id_between)" event_id "$event_id" topic orders payload "$forged")
bad_id=$(redis xadd "$STREAM" "$(id_between)" event_id not-a-uuid topic orders payload '{"order_id": ')
# Bytes that are not UTF-8, and a NUL, which no PostgreSQL text can hold.
bytes_id=$(redis eval "return redis.call('XADD', KEYS[1], ARGV[1], 'event_id', ARGV[2], 'topic', 'orders',
	'payload', '{\"order_id\": \"' .. string.char(255, 0) .. '\"}')" 1 "$STREAM" "$(id_between)" "$(cat /proc/sys/kernel/random/uuid)")
wait_for 20 '[ "$(pending)" = 0 ] && [ "$(reports -c "SELECT count(*) FROM outbox.dead_letters")" -ge 3 ] && grep -q "duplicate $copy_id " "$WORK/consumer.log"' || true
dl=$(reports -c "SELECT sqlstate || ' ' || entry_id || ' applied ' || (applied_payload->>'amount_cents') || ', received ' || (payload->>'amount_cents') FROM outbox.dead_letters WHERE entry_id = '$forged_id'")
bad=$(reports -c "SELECT left(reason, 60) FROM outbox.dead_letters WHERE entry_id = '$bad_id' AND event_id IS NULL AND payload IS NULL")
bad_bytes=$(reports -c "SELECT left(reason, 40) FROM outbox.dead_letters WHERE entry_id = '$bytes_id' AND event_id IS NOT NULL")
totals_after=$(reports -c "SELECT string_agg(format('%s %s %s', customer, orders, amount_cents), ', ' ORDER BY customer) FROM order_totals")
check "a copy of an applied entry" \
	"$(grep -c "duplicate $copy_id " "$WORK/consumer.log" || true) duplicate report for $copy_id" \
	"$(grep -q "duplicate $copy_id " "$WORK/consumer.log"; echo $?)"
check "the same event id with another amount" \
	"dead letter: ${dl:-none}; $(grep -c "CONFLICT $forged_id " "$WORK/consumer.log" || true) conflict logged" \
	"$([ "${dl%% *}" = OB001 ] && [ "$(cut -d' ' -f2 <<<"$dl")" = "$forged_id" ] && grep -q "CONFLICT $forged_id " "$WORK/consumer.log" && [ "$(applied)" = "$applied_before" ] && [ "$totals_after" = "$totals_before" ] && [ "$(pending)" = 0 ]; echo $?)"

check "an entry that is not an event" \
	"dead letter: ${bad:-none}" \
	"$([ -n "$bad" ] && [ "$(pending)" = 0 ]; echo $?)"
check "an entry with bytes that are not UTF-8, and a NUL" \
	"dead letter: ${bad_bytes:-none}" \
	"$([ -n "$bad_bytes" ] && [ "$(pending)" = 0 ] && kill -0 "$CONSUMER_PID"; echo $?)"

# Exactly the committed orders, each once, with keys and headers where emitted.
shop -c "SELECT id FROM orders ORDER BY id" >"$WORK/committed.txt"
reports -c "SELECT order_id FROM applied_orders ORDER BY order_id" >"$WORK/applied.txt"
differ=$(diff "$WORK/committed.txt" "$WORK/applied.txt" | grep -c '^[<>]' || true)
check "exactly the committed orders applied, once each" \
	"$(applied) applied ($(reports -c "SELECT count(DISTINCT order_id) FROM applied_orders") distinct) of $(committed) committed; $differ differ" \
	"$([ "$(applied)" = "$(committed)" ] && [ "$differ" = 0 ]; echo $?)"
shop_totals=$(shop -c "SELECT string_agg(format('%s %s %s', customer, n, total), ', ' ORDER BY customer)
                         FROM (SELECT coalesce(customer, '(guest)') AS customer, count(*) AS n, sum(amount_cents) AS total
                                 FROM orders GROUP BY 1) t")
check "projection equals the shop's orders" "shop: $shop_totals; reports: $totals_after" \
	"$([ "$shop_totals" = "$totals_after" ]; echo $?)"
keyless=$(shop -c "SELECT count(*) FROM outbox.event WHERE key IS NULL")
without_headers=$(shop -c "SELECT count(*) FROM outbox.event WHERE headers IS NULL")
with_source=$(shop -c "SELECT count(*) FROM outbox.event WHERE headers ? 'source'")
guests=$(reports -c "SELECT count(*) FROM applied_orders WHERE customer IS NULL")
sourced=$(reports -c "SELECT count(*) FROM applied_orders WHERE source = '$example'")
check "entries without key or headers" \
	"$keyless events without key, $guests applied as guests; $without_headers without headers; $with_source with a source header, $sourced applied with source $example" \
	"$([ "$keyless" -gt 0 ] && [ "$keyless" = "$guests" ] && [ "$without_headers" -gt 0 ] && [ "$with_source" -gt 0 ] && [ "$with_source" -lt "$(committed)" ] && [ "$with_source" = "$sourced" ]; echo $?)"

# Trace context. The checkout spans (service "orders") name the events they
# emitted; each consumer span that applied an event (attribute new) must be
# in the checkout's trace, its child, with the storefront's tracestate. The
# events of untraced checkouts are applied in spans that are roots.
traced=$(shop -c "SELECT count(*) FROM outbox.event WHERE headers ? 'traceparent'")
stored=$(shop -c "SELECT count(*) FROM outbox.event WHERE headers->>'tracestate' = 'storefront=$example'")
read -r linked wrong roots strays checkout_spans < <(jq -rs '
	(map(select(.service == "orders" and .attributes.committed == true))) as $checkouts
	| ($checkouts | map(. as $p | .attributes.event_ids[] | {key: ., value: $p}) | from_entries) as $by_event
	| map(select(.service == "consumer" and .attributes.new == true))
	| map(. as $c | $by_event[$c.attributes.event_id] as $p
		| if $p == null then (if $c.parent_span_id == null then "root" else "stray" end)
		  elif $c.trace_id == $p.trace_id and $c.parent_span_id == $p.span_id and $c.tracestate == $p.tracestate then "linked"
		  else "wrong" end)
	| [(map(select(. == "linked")) | length), (map(select(. == "wrong")) | length),
	   (map(select(. == "root")) | length), (map(select(. == "stray")) | length), ($checkouts | length)]
	| @tsv' "$SPANS_FILE" 2>"$WORK/jq.log" || echo "? ? ? ? ?")
check "one trace from checkout to consumer" \
	"$traced events with a traceparent ($stored with the storefront's tracestate) from $checkout_spans checkout spans; consumer spans: $linked children of their checkout's, $wrong in another trace, $roots roots (untraced checkouts), $strays with another parent" \
	"$([ "$traced" -gt 0 ] && [ "$stored" = "$traced" ] && [ "$linked" = "$traced" ] && [ "$wrong" = 0 ] && [ "$strays" = 0 ] &&
		[ "$roots" = "$(($(committed) - traced))" ]; echo $?)"

stop_status=0
kill -TERM "$CONSUMER_PID"
wait_for 10 '! kill -0 "$CONSUMER_PID" 2>/dev/null' || true
wait "$CONSUMER_PID" || stop_status=$?
CONSUMER_PID=
check "SIGTERM stops the consumer" "exit status $stop_status" "$([ "$stop_status" = 0 ]; echo $?)"

echo
say "$example example"
awk -F '\t' '{ printf "%-50s | %-100s | %s\n", $1, $2, $3 }' "$RESULTS"
echo
if [ "$failures" -eq 0 ]; then
	echo "example $example: all checks passed"
else
	echo "example $example: $failures check(s) failed; logs below"
	for f in orders.log consumer.log relay.log jq.log; do
		echo "--- $f"
		tail -n 60 "$WORK/$f"
	done
	exit 1
fi
