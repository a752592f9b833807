#!/usr/bin/env python3
"""The reporting service: applies order events from Redis exactly once.

Reads the stream through a Redis consumer group (XREADGROUP) and applies
each entry in its own transaction: inbox_apply() and, when the event is
new, the projection. The entry is acknowledged (XACK) only after the
commit. A worker that dies between its commit and its XACK leaves the
entry pending; another worker (or this one, restarted) reclaims it with
XAUTOCLAIM, inbox_apply() reports it as a duplicate, and it is acknowledged
without being applied again. The same event id with another payload is an
identity conflict (SQLSTATE OB001): logged, dead-lettered, acknowledged,
never applied.

Environment:
  DATABASE_URL        the reports database, as reports_app
  REDIS_URL           redis://host:port/db (default redis://127.0.0.1:6379/0)
  STREAM              the stream to read (default outbox:orders)
  CONSUMER            the inbox consumer and Redis consumer group (default reports)
  WORKER              this worker's name in the group (default host:pid)
  MIN_IDLE_MS         reclaim pending entries idle this long (default 30000)
  CLAIM_INTERVAL_MS   how often to look for them (default 5000)
  CRASH_AFTER_COMMIT  test hook: die (SIGKILL) right after the n-th commit, before its XACK
  SPANS_FILE          where to write the finished spans, one JSON object a line (default: nowhere)

Tracing (W3C Trace Context by hand, tracecontext.py): an entry of an event
emitted with trace context has the fields "traceparent" (and "tracestate"),
which are also in its headers. The consumer applies the entry in a span
that is a child of that context: the order service's checkout and this
apply are one trace. An entry without (valid) trace context is applied in
a new trace. To hand the trace on to events it emitted itself, it would set
pg_outbox.traceparent to its span's traceparent() in that transaction.
"""

import json
import logging
import os
import signal
import socket
import sys
import time
import uuid

import psycopg
import redis
from psycopg_pool import ConnectionPool
from tracecontext import Span

log = logging.getLogger("consumer")

STREAM = os.environ.get("STREAM", "outbox:orders")
CONSUMER = os.environ.get("CONSUMER", "reports")
GROUP = CONSUMER
WORKER = os.environ.get("WORKER", f"{socket.gethostname()}:{os.getpid()}")
MIN_IDLE_MS = int(os.environ.get("MIN_IDLE_MS", "30000"))
CLAIM_INTERVAL = int(os.environ.get("CLAIM_INTERVAL_MS", "5000")) / 1000
CRASH_AFTER_COMMIT = int(os.environ.get("CRASH_AFTER_COMMIT", "0"))

stopping = False
commits = 0


class Malformed(Exception):
    """The entry can never be applied: its fields are not an order event."""


def decode(raw):
    """Decodes an entry's fields, which Redis keeps as bytes. Returns them as
    text, bytes that are not UTF-8 (and NUL, which no PostgreSQL text holds)
    written as \\x escapes, and the names of such fields. (With
    decode_responses=True, redis-py would raise on such an entry at every
    read, and the consumer would never get past it.)"""

    def text(b):
        return b.decode("utf-8", "backslashreplace").replace("\0", "\\x00")

    fields, invalid = {}, []
    for name, value in raw.items():
        name = text(name)
        fields[name] = text(value)
        if fields[name].encode() != value:
            invalid.append(name)
    return fields, invalid


def parse(fields, invalid):
    """Reads an entry's fields. "key" and "headers" are absent when the
    producer emitted NULL; the others are always there."""
    if invalid:
        raise Malformed(f"not UTF-8 text: {', '.join(invalid)}")
    try:
        event_id = str(uuid.UUID(fields["event_id"]))
        order = json.loads(fields["payload"])
        headers = json.loads(fields["headers"]) if "headers" in fields else {}
        return {
            "event_id": event_id,
            "topic": fields.get("topic"),
            "key": fields.get("key"),
            "payload": fields["payload"],  # sent as text: the server compares it as jsonb
            "headers": fields.get("headers"),
            "order_id": str(uuid.UUID(order["order_id"])),
            "amount_cents": int(order["amount_cents"]),
            "source": headers.get("source") if isinstance(headers, dict) else None,
            # The entry's own fields, else the headers' keys (the same values).
            "traceparent": fields.get("traceparent", headers.get("traceparent") if isinstance(headers, dict) else None),
            "tracestate": fields.get("tracestate", headers.get("tracestate") if isinstance(headers, dict) else None),
        }
    except (KeyError, ValueError, TypeError) as e:  # json.JSONDecodeError is a ValueError
        raise Malformed(f"{type(e).__name__}: {e}") from None


def apply(pool, entry_id, e):
    """Applies one event in one transaction; True if new, False if a duplicate."""
    with pool.connection() as conn:  # commits at the end of the block
        new = conn.execute("SELECT inbox_apply(%s, %s, %s)", (CONSUMER, e["event_id"], e["payload"])).fetchone()[0]
        if new:
            conn.execute(
                "INSERT INTO applied_orders (order_id, event_id, customer, amount_cents, entry_id, source)"
                " VALUES (%s, %s, %s, %s, %s, %s)",
                (e["order_id"], e["event_id"], e["key"], e["amount_cents"], entry_id, e["source"]),
            )
            conn.execute(
                "INSERT INTO order_totals AS t (customer, orders, amount_cents)"
                " VALUES (coalesce(%s, '(guest)'), 1, %s)"
                " ON CONFLICT (customer) DO UPDATE"
                " SET orders = t.orders + 1, amount_cents = t.amount_cents + excluded.amount_cents",
                (e["key"], e["amount_cents"]),
            )
        return new


def dead_letter(pool, entry_id, fields, reason, sqlstate=None):
    """Records an entry given up on, with what can be kept of it, in its own transaction."""

    def json_or_none(text):
        try:
            json.loads(text)
            return text
        except (TypeError, ValueError):
            return None

    try:
        event_id = str(uuid.UUID(fields.get("event_id", "")))
    except ValueError:
        event_id = None
    payload = json_or_none(fields.get("payload"))
    if payload is None and "payload" in fields:  # keep it in the reason: a dead letter loses nothing
        reason += f" (payload is not JSON: {fields['payload']})"
    with pool.connection() as conn:
        conn.execute(
            "SELECT inbox_dead_letter(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (CONSUMER, STREAM, entry_id, event_id, fields.get("topic"), fields.get("key"),
             payload, json_or_none(fields.get("headers")), reason, sqlstate),
        )


def handle(pool, r, entry_id, raw):
    """Applies, dead-letters or skips one entry, then acknowledges it."""
    global commits
    entry_id = entry_id.decode()
    if raw is None:  # trimmed from the stream while pending
        log.error("dead-lettered %s: the entry was trimmed from the stream before it was applied", entry_id)
        dead_letter(pool, entry_id, {}, "trimmed from the stream while pending")
        r.xack(STREAM, GROUP, entry_id)
        return
    fields, invalid = decode(raw)
    attempt = 0
    while True:
        attempt += 1
        try:
            e = parse(fields, invalid)
            span = Span.child_of("apply order", e["traceparent"], e["tracestate"])
            span.attributes = {"messaging.message.id": entry_id, "event_id": e["event_id"]}
            try:
                new = apply(pool, entry_id, e)
                span.attributes["new"] = new
            finally:
                span.end("consumer")
            break
        except Malformed as err:
            log.error("dead-lettered %s: malformed entry (%s)", entry_id, err)
            dead_letter(pool, entry_id, fields, f"malformed entry: {err}")
            r.xack(STREAM, GROUP, entry_id)
            return
        except psycopg.OperationalError as err:
            # Lost connection (08), serialization failure (40001), deadlock
            # (40P01), shutdown (57P01): the transaction rolled back; try again.
            if stopping:
                raise
            log.warning("retrying %s after %s", entry_id, str(err).strip().splitlines()[0])
            time.sleep(min(5.0, 0.1 * 2 ** min(attempt, 6)))
        except psycopg.Error as err:
            if err.sqlstate == "OB001":
                # Same event id, another payload: never applied, never silent.
                log.error("CONFLICT %s event %s: %s %s", entry_id, fields.get("event_id"),
                          err.diag.message_primary, err.diag.message_detail)
                dead_letter(pool, entry_id, fields, err.diag.message_primary, err.sqlstate)
                r.xack(STREAM, GROUP, entry_id)
                return
            if err.sqlstate and err.sqlstate.startswith("22"):  # invalid uuid or JSON text, a NULL
                log.error("dead-lettered %s: %s (SQLSTATE %s)", entry_id, err.diag.message_primary, err.sqlstate)
                dead_letter(pool, entry_id, fields, err.diag.message_primary, err.sqlstate)
                r.xack(STREAM, GROUP, entry_id)
                return
            raise  # a fault of ours (privileges, schema): stop, the entry stays pending

    commits += 1
    if commits == CRASH_AFTER_COMMIT:
        log.warning("committed %s, dying before XACK", entry_id)
        os.kill(os.getpid(), signal.SIGKILL)
    r.xack(STREAM, GROUP, entry_id)  # only now: after the commit
    if new:
        log.info("applied %s event %s", entry_id, e["event_id"])
    else:
        log.info("duplicate %s event %s (applied before; acknowledged)", entry_id, e["event_id"])


def reclaim(pool, r):
    """Takes over entries that another worker (perhaps a dead one) left pending."""
    cursor = "0-0"
    while True:
        reply = r.xautoclaim(STREAM, GROUP, WORKER, MIN_IDLE_MS, cursor, count=100)
        cursor, entries = reply[0].decode(), reply[1]
        deleted = reply[2] if len(reply) > 2 else []  # Redis 7: ids trimmed while pending
        if entries or deleted:
            log.info("reclaimed %d pending entries", len(entries) + len(deleted))
        for entry_id, fields in entries:
            handle(pool, r, entry_id, fields)
        for entry_id in deleted:
            handle(pool, r, entry_id, None)
        if cursor == "0-0":
            return


def main():
    global stopping
    logging.basicConfig(level=logging.INFO, format="consumer: %(message)s", stream=sys.stderr)

    def stop(signum, frame):
        global stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    r = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"), decode_responses=False)
    try:
        r.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    except redis.ResponseError as e:
        if "BUSYGROUP" not in str(e):
            raise

    with ConnectionPool(os.environ["DATABASE_URL"], min_size=1, max_size=2, kwargs={"autocommit": False}) as pool:
        log.info("worker %s reading %s as consumer %s", WORKER, STREAM, CONSUMER)
        next_claim = 0.0
        while not stopping:
            try:
                if time.monotonic() >= next_claim:
                    reclaim(pool, r)
                    next_claim = time.monotonic() + CLAIM_INTERVAL
                reply = r.xreadgroup(GROUP, WORKER, {STREAM: ">"}, count=10, block=1000)
                for _stream, entries in reply or []:
                    for entry_id, fields in entries:
                        handle(pool, r, entry_id, fields)
            except (redis.ConnectionError, redis.TimeoutError) as e:
                log.warning("redis: %s; retrying", e)
                time.sleep(1)
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
