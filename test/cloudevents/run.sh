#!/usr/bin/env bash
# CloudEvents conformance of pg_outbox's Redis Streams entries, read with
# the CloudEvents JavaScript SDK (npm "cloudevents", pinned in
# package-lock.json), and one trace from producer to a consumer's handler
# and on: test/cloudevents/run.sh
#
# On throwaway servers (PostgreSQL, Redis on free loopback ports):
#   1. database "ce shop/ü" (a name that the source attribute must
#      percent-encode) emits events covering the binding's cases: every
#      optional attribute present (subject, partitionkey, traceparent,
#      tracestate, pgoutboxheaders), each absent (no key, no headers, no
#      trace context), payloads that are a JSON object, array, string,
#      number, 0 and null, keys with non-ASCII characters, trace context
#      from the headers and from the pg_outbox.traceparent setting, an
#      invalid tracestate and an invalid traceparent (both dropped);
#   2. three relays publish them: --format default, cloudevents (binary
#      content mode, default source) and cloudevents-structured (with
#      --ce-source);
#   3. check.js reads each entry with the SDK (new CloudEvent(...),
#      HTTP.toEvent, validate()) and compares it with the emitted event;
#   4. chain: two consume workers apply the binary and the structured
#      stream in database "ce_chain", each with a handler that emits a
#      further event (whose payload records what the handler got, $1 to
#      $6); a relay publishes those, and check.js --chain checks that each
#      one carries the first event's trace (A -> B -> C is one trace) and
#      that consume mapped every attribute back.
# PG_OUTBOX_ENGINE=sql runs it on the SQL engine (CREATE EXTENSION
# pg_outbox_sql), else the C engine, not preloaded: the first
# set_config('pg_outbox.traceparent') of a session comes before pg_outbox.so
# is loaded.
# Prints TAP ("ok"/"not ok" lines, then "N passed, N failed"); exit status
# non-zero when a check failed. Servers are stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib.sh

case ${PG_OUTBOX_ENGINE:-c} in
c) EXTENSION=pg_outbox ;;
sql) EXTENSION=pg_outbox_sql ;;
*) echo "PG_OUTBOX_ENGINE is c or sql, not \"$PG_OUTBOX_ENGINE\"" >&2; exit 2 ;;
esac
packages=(jq nodejs)
# A Node.js from elsewhere (NodeSource) brings its own npm and conflicts
# with Debian's npm package.
command -v npm >/dev/null || packages+=(npm)
ensure_packages "${packages[@]}"
build_extension
build_relay pg_outbox_relay
RELAY=$PWD/build/relay/pg_outbox_relay

throwaway_workspace cloudevents
PIDS=()
cleanup() {
	local pid
	for pid in "${PIDS[@]}"; do stop_pid "$pid"; done
	stop_servers
	rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "installing the CloudEvents SDK (npm ci from package-lock.json)"
(cd test/cloudevents && npm ci --prefer-offline --no-audit --no-fund --loglevel=error >"$WORK/npm.log" 2>&1) ||
	{ cat "$WORK/npm.log"; exit 1; }

SHOP='ce shop/ü'
SHOP_ENCODED='ce%20shop%2F%C3%BC'
psql_db() { # psql_db DATABASE [psql arguments]
	local db=$1
	shift
	PGOPTIONS='-c client_min_messages=warning' psql -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U postgres -d "$db" "$@"
}
shop() { psql_db "$SHOP" "$@"; }
chain() { psql_db ce_chain "$@"; }
redis() { redis-cli -p "$REDIS_PORT" "$@"; }
conninfo() { # conninfo DATABASE USER
	printf "host=127.0.0.1 port=%s dbname='%s' user=%s" "$PG_PORT" "$1" "$2"
}
publish() { # publish DATABASE GROUP STREAM-TEMPLATE LOG [flag ...]: a relay in the background
	local db=$1 group=$2 stream=$3 log=$4
	shift 4
	"$RELAY" publish --pg "$(conninfo "$db" relay)" --redis "127.0.0.1:$REDIS_PORT" --group "$group" \
		--stream "$stream" --poll-interval 100ms --retry-max 1s "$@" >>"$WORK/$log" 2>&1 &
	PIDS+=($!)
}
xlen() { redis xlen "$1"; }

say "PostgreSQL on 127.0.0.1:$PG_PORT, Redis on 127.0.0.1:$REDIS_PORT (throwaway, in $WORK)"
pg_start "$WORK/pg" "$PG_PORT"
redis_start "$WORK/redis" "$REDIS_PORT"

psql_db postgres <<SQL >/dev/null
CREATE ROLE app LOGIN;
CREATE ROLE relay LOGIN;
CREATE ROLE chain_app LOGIN;
CREATE DATABASE "$SHOP" ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0;
CREATE DATABASE ce_chain ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0;
SQL
shop <<SQL >/dev/null
CREATE EXTENSION $EXTENSION;
GRANT outbox_writer TO app;
GRANT outbox_relay TO relay;
SELECT outbox_group_create(g, ARRAY['orders']) FROM unnest(ARRAY['ce-default', 'ce-binary', 'ce-structured']) g;
SQL
chain <<SQL >/dev/null
CREATE EXTENSION $EXTENSION;
GRANT outbox_consumer, outbox_writer TO chain_app;
GRANT outbox_relay TO relay;
SELECT inbox_consumer_create('chain-binary', 'chain_app'), inbox_consumer_create('chain-structured', 'chain_app');
SELECT outbox_group_create('ce-chain', ARRAY['handled']);
SQL

say "emitting the conformance cases"
TP1=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
TP2=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00
TP3=00-f0e1d2c3b4a5968778695a4b3c2d1e0f-1122334455667788-01
psql -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U app -d "$SHOP" <<SQL >"$WORK/emit.log" 2>&1
-- Every attribute: key (subject, partitionkey), headers beside the trace
-- context, which comes from the settings.
BEGIN;
SELECT set_config('pg_outbox.traceparent', '$TP1', true), set_config('pg_outbox.tracestate', 'shop=ce,vendor@tenant=x y', true);
SELECT outbox_emit('orders', 'customer-1', '{"order_id": 1, "amount": 12.50, "items": [{"sku": "a", "qty": 2}]}',
                   '{"source": "ce-test", "n": 1, "nested": {"ü": ["ж", null, true]}}', '10000000-0000-4000-8000-000000000001');
-- Two events of one call, with the same trace; a JSON array and a string.
SELECT count(*) FROM outbox_emit_many('orders', ARRAY['ключ-键', 'ключ-键'], ARRAY['[1, "two", {"three": 3}]', '"just a string"']::jsonb[],
                   NULL, ARRAY['10000000-0000-4000-8000-000000000002', '10000000-0000-4000-8000-000000000003']::uuid[]);
COMMIT;
-- Trace context from the headers, nothing else in them: no pgoutboxheaders.
SELECT outbox_emit('orders', 'emoji 🎉 and "quotes"', '42.5', '{"traceparent": "$TP2"}', '10000000-0000-4000-8000-000000000004');
-- Nothing optional: no key, no headers, no trace context; data null, then 0.
SELECT outbox_emit('orders', NULL, 'null', NULL, '10000000-0000-4000-8000-000000000005');
SELECT outbox_emit('orders', NULL, '0', NULL, '10000000-0000-4000-8000-000000000006');
-- An invalid tracestate (upper case in its key) and an invalid traceparent
-- (version ff): dropped with a warning (OB006), the rest kept.
BEGIN;
SELECT set_config('pg_outbox.traceparent', '$TP1', true), set_config('pg_outbox.tracestate', 'Bad=key', true);
SELECT outbox_emit('orders', 'k', '{"case": "invalid tracestate"}', '{"keep": "me"}', '10000000-0000-4000-8000-000000000007');
COMMIT;
SELECT outbox_emit('orders', 'k', '{"case": "invalid traceparent"}', '{"traceparent": "ff-$(cut -d- -f2- <<<"$TP3")", "keep": 1}',
                   '10000000-0000-4000-8000-000000000008');
-- The headers' traceparent comes before the settings'; a tracestate too.
BEGIN;
SELECT set_config('pg_outbox.traceparent', '$TP1', true);
SELECT outbox_emit('orders', 'k', '{"case": "headers first"}', '{"traceparent": "$TP3", "tracestate": "a=1,b=2"}',
                   '10000000-0000-4000-8000-000000000009');
COMMIT;
-- Empty headers: no pgoutboxheaders (they come back as NULL).
SELECT outbox_emit('orders', 'k', '[]', '{}', '10000000-0000-4000-8000-000000000010');
SQL
EMITTED=10
shop -c "SELECT json_build_object('event_id', event_id, 'topic', topic, 'key', key, 'payload', payload, 'headers', headers)
           FROM outbox.event ORDER BY event_id" >"$WORK/emitted.jsonl"

publish "$SHOP" ce-default 'ce-default:{topic}' relay-default.log
publish "$SHOP" ce-binary 'ce-binary:{topic}' relay-binary.log --format cloudevents
publish "$SHOP" ce-structured 'ce-structured:{topic}' relay-structured.log --format cloudevents-structured \
	--ce-source 'https://events.example/{group}/{database}'
wait_for 30 '[ "$(xlen ce-default:orders)" = $EMITTED ] && [ "$(xlen ce-binary:orders)" = $EMITTED ] && [ "$(xlen ce-structured:orders)" = $EMITTED ]' || true

failures=0
say "reading the entries with the CloudEvents SDK"
node test/cloudevents/check.js --redis "redis://127.0.0.1:$REDIS_PORT/0" --emitted "$WORK/emitted.jsonl" \
	--default ce-default:orders \
	--binary ce-binary:orders --binary-source "/pg_outbox/$SHOP_ENCODED/ce-binary" \
	--structured ce-structured:orders --structured-source "https://events.example/ce-structured/$SHOP_ENCODED" \
	--verdicts "$WORK/verdicts.jsonl" >"$WORK/check.tap" 2>&1 || failures=$((failures + 1))
conformance=$(tail -n 1 "$WORK/check.tap")

# The checker itself: a copy of the binary stream with one entry made
# non-conformant (time as PostgreSQL writes it, not RFC 3339; a newline in
# the subject) must fail, naming both.
redis eval "for _, e in ipairs(redis.call('XRANGE', KEYS[1], '-', '+')) do
	local f = e[2]
	for i = 1, #f, 2 do
		if e[1] == ARGV[1] and f[i] == 'ce_time' then f[i + 1] = '2026-12-04 17:20:05.123456+00' end
		if e[1] == ARGV[1] and f[i] == 'ce_subject' then f[i + 1] = 'line' .. string.char(10) .. 'break' end
	end
	redis.call('XADD', KEYS[2], e[1], unpack(f))
end" 2 ce-binary:orders ce-forged:orders "$(redis xrange ce-binary:orders - + COUNT 1 | head -n 1)" >/dev/null
forged_status=0
node test/cloudevents/check.js --redis "redis://127.0.0.1:$REDIS_PORT/0" --emitted "$WORK/emitted.jsonl" \
	--default ce-default:orders \
	--binary ce-forged:orders --binary-source "/pg_outbox/$SHOP_ENCODED/ce-binary" \
	--structured ce-structured:orders --structured-source "https://events.example/ce-structured/$SHOP_ENCODED" \
	>"$WORK/forged.tap" 2>&1 || forged_status=$?

say "chain: consume both streams with handlers that emit, publish what they emitted"
handler() { # handler VIA: emits one event per applied entry, recording $1 to $6
	printf "SELECT outbox_emit('handled', \$2, jsonb_build_object('via', '%s'::text, 'topic', \$1, 'key', \$2, 'payload', \$3, 'headers', \$4, 'event_id', \$5, 'traceparent', \$6))" "$1"
}
for via in binary structured; do
	"$RELAY" consume --pg "$(conninfo ce_chain chain_app)" --redis "127.0.0.1:$REDIS_PORT" --consumer "chain-$via" \
		--stream "ce-$via:orders" --handler "$(handler "$via")" --block 200ms >>"$WORK/consume-$via.log" 2>&1 &
	PIDS+=($!)
done
publish ce_chain ce-chain 'ce-chain:{topic}' relay-chain.log
wait_for 30 '[ "$(xlen ce-chain:handled)" = $((2 * EMITTED)) ]' || true
node test/cloudevents/check.js --redis "redis://127.0.0.1:$REDIS_PORT/0" --emitted "$WORK/emitted.jsonl" \
	--chain ce-chain:handled --vias binary,structured >"$WORK/chain.tap" 2>&1 || failures=$((failures + 1))

# One TAP stream: the checker's lines renumbered, then this script's.
n=0
passed=0
failed=0
tap() { # tap OK TEXT
	n=$((n + 1))
	if [ "$1" = 0 ]; then
		passed=$((passed + 1))
		echo "ok $n - $2"
	else
		failed=$((failed + 1))
		echo "not ok $n - $2"
	fi
}
while IFS= read -r line; do
	case $line in
	"ok "*) tap 0 "${line#ok * - }" ;;
	"not ok "*) tap 1 "${line#not ok * - }" ;;
	esac
done < <(cat "$WORK/check.tap" "$WORK/chain.tap")
tap "$(grep -q '^[0-9]* passed, 0 failed$' "$WORK/check.tap"; echo $?)" "conformance checker: ${conformance:-no summary}"
tap "$(grep -q '^[0-9]* passed, 0 failed$' "$WORK/chain.tap"; echo $?)" "chain checker: $(tail -n 1 "$WORK/chain.tap")"
tap "$([ "$forged_status" = 1 ] && [ "$(grep -c '^not ok' "$WORK/forged.tap")" = 1 ] &&
	grep '^not ok' "$WORK/forged.tap" | grep -q 'is not RFC 3339' && grep '^not ok' "$WORK/forged.tap" | grep -q 'subject: control character U+000a'; echo $?)" \
	"the checker fails a forged entry (time not RFC 3339, a newline in the subject): $(grep '^not ok' "$WORK/forged.tap" | cut -c1-100)"
dropped=$(grep -c 'WARNING: *trace context dropped' "$WORK/emit.log" || true)
tap "$([ "$dropped" = 2 ]; echo $?)" "emit warned twice (an invalid tracestate, an invalid traceparent): $dropped warning(s)"
dead=$(chain -c "SELECT count(*) FROM outbox.dead_letters")
tap "$([ "$dead" = 0 ]; echo $?)" "consume dead-lettered no CloudEvents entry: $dead dead letter(s)"

echo "$passed passed, $failed failed"
if [ "$failed" -ne 0 ] || [ "$failures" -ne 0 ]; then
	for f in emit.log relay-default.log relay-binary.log relay-structured.log consume-binary.log consume-structured.log relay-chain.log; do
		echo "--- $f"
		tail -n 30 "$WORK/$f" 2>/dev/null || true
	done
	exit 1
fi
