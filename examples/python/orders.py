#!/usr/bin/env python3
"""The order service: places orders and emits their events in the same transaction.

A checkout (one to three orders of one customer) is one transaction: it
inserts the orders, counts them on the customer's row, and emits one event
per order on topic "orders", with outbox_emit() for one order and
outbox_emit_many() for several. A checkout refused after emitting (the
payment was declined) rolls back, and its events with it: nothing of it is
ever published. Serialization failures (40001) and deadlocks (40P01) are
retried with the same ids.

Environment:
  DATABASE_URL   the shop database, as shop_app (libpq URI or key=value string)
  ORDERS         checkouts to place (default 20)
  WORKERS        threads placing them, each with a pooled connection (default 2)
  REJECT_EVERY   every n-th checkout is declined after emitting (default 0: none)
  SPANS_FILE     where to write the finished spans, one JSON object a line (default: nowhere)

Tracing (W3C Trace Context by hand, tracecontext.py): each checkout request
comes in with trace context (a storefront's span, simulated here), except
every third one, as from a batch import. The checkout runs in a span of its
own, a child of the storefront's, and hands its context to the events it
emits: in the transaction, SET LOCAL pg_outbox.traceparent and
pg_outbox.tracestate (set_config(..., true)) before outbox_emit(). pg_outbox
stores them in the events' headers, the relay passes them on in the stream
entries, and the consumer starts its span as a child of this one.
"""

import logging
import os
import random
import sys
import threading
import time
import uuid

from psycopg import IsolationLevel, errors
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool
from tracecontext import Span

log = logging.getLogger("orders")

# What a retry can fix: the transaction lost a race, not an argument.
RETRYABLE = (errors.SerializationFailure, errors.DeadlockDetected)
MAX_ATTEMPTS = 10
CUSTOMERS = ["ann", "bob", "eve", None]  # None: a guest checkout, emitted without a key


class Declined(Exception):
    """The payment was declined: the checkout must leave no trace."""


def plan(n):
    """The orders of checkout n. Ids are made here, once, outside the retry
    loop: a retried transaction emits the same event ids as the attempt that
    rolled back."""
    customer = CUSTOMERS[(n // 2) % len(CUSTOMERS)]  # two checkouts in a row share a customer
    return [
        {
            "order_id": uuid.uuid4(),
            "event_id": uuid.uuid4(),
            "customer": customer,
            "amount_cents": 100 + (n * 37 + i * 11) % 900,
        }
        for i in range(1 + n % 3)
    ]


def payload(order):
    # json.dumps, which Jsonb uses, cannot serialize uuid.UUID: pass text.
    return {
        "order_id": str(order["order_id"]),
        "customer": order["customer"],
        "amount_cents": order["amount_cents"],
    }


def place(pool, orders, decline, span=None):
    """Places one checkout in one transaction; returns how often it was
    retried. The events it emits carry span's trace context (none when span
    is None)."""
    customer = orders[0]["customer"]
    for attempt in range(1, MAX_ATTEMPTS + 1):
        try:
            # The pool's context manager commits when the block ends and rolls
            # back when it raises: the orders and their events go together.
            with pool.connection() as conn:
                for o in orders:
                    conn.execute(
                        "INSERT INTO orders (id, customer, amount_cents) VALUES (%s, %s, %s)",
                        (o["order_id"], customer, o["amount_cents"]),
                    )
                if customer is not None:
                    # Every checkout of a customer updates this row: concurrent
                    # ones collide, which REPEATABLE READ reports as 40001.
                    conn.execute(
                        "UPDATE customers SET orders_placed = orders_placed + %s WHERE id = %s",
                        (len(orders), customer),
                    )
                if span is not None:
                    # Transaction-local (is_local true): it ends with the
                    # transaction, and a pooled connection never hands it to
                    # the next checkout.
                    conn.execute(
                        "SELECT set_config('pg_outbox.traceparent', %s, true), set_config('pg_outbox.tracestate', %s, true)",
                        (span.traceparent(), span.tracestate or ""),
                    )
                if len(orders) == 1:
                    o = orders[0]
                    conn.execute(
                        "SELECT outbox_emit('orders', %s, %s, %s, %s)",
                        (customer, Jsonb(payload(o)), Jsonb({"source": "python"}), o["event_id"]),
                    )
                else:
                    # Lists of Jsonb are sent as jsonb[]; a list of str would be
                    # text[], for which there is no outbox_emit_many().
                    conn.execute(
                        "SELECT count(*) FROM outbox_emit_many('orders', %s, %s, NULL, %s)",
                        (
                            None if customer is None else [customer] * len(orders),
                            [Jsonb(payload(o)) for o in orders],
                            [o["event_id"] for o in orders],
                        ),
                    )
                if decline:
                    raise Declined(f"payment declined for {len(orders)} order(s)")
            return attempt - 1
        except RETRYABLE as e:
            if attempt == MAX_ATTEMPTS:
                raise
            delay = min(0.5, 0.01 * 2**attempt) * random.uniform(0.5, 1.0)
            log.info("retrying checkout after %s (SQLSTATE %s), attempt %d", type(e).__name__, e.sqlstate, attempt)
            time.sleep(delay)


def main():
    logging.basicConfig(level=logging.INFO, format="orders: %(message)s", stream=sys.stderr)
    checkouts = int(os.environ.get("ORDERS", "20"))
    workers = int(os.environ.get("WORKERS", "2"))
    reject_every = int(os.environ.get("REJECT_EVERY", "0"))

    def configure(conn):
        conn.isolation_level = IsolationLevel.REPEATABLE_READ

    stats = {"orders": 0, "checkouts": 0, "declined": 0, "declined_orders": 0, "retries": 0}
    lock = threading.Lock()
    failures = []

    def work(first):
        try:
            for n in range(first, checkouts, workers):
                orders = plan(n)
                decline = reject_every > 0 and n % reject_every == reject_every - 1
                span = None
                if n % 3 != 1:
                    # The storefront's context, as a web framework would take
                    # it from the request's traceparent and tracestate headers.
                    storefront = Span("storefront", tracestate="storefront=python")
                    span = Span.child_of("checkout", storefront.traceparent(), storefront.tracestate)
                    span.attributes = {"checkout.number": n, "event_ids": [str(o["event_id"]) for o in orders],
                                       "committed": False}
                try:
                    retries = place(pool, orders, decline, span)
                    if span is not None:
                        span.attributes["committed"] = True
                    with lock:
                        stats["orders"] += len(orders)
                        stats["checkouts"] += 1
                        stats["retries"] += retries
                except Declined as e:
                    log.info("checkout %d rolled back: %s", n, e)
                    with lock:
                        stats["declined"] += 1
                        stats["declined_orders"] += len(orders)
                finally:
                    if span is not None:
                        span.end("orders")
        except Exception as e:  # reported once all threads are done
            failures.append(e)
            log.exception("worker failed")

    # autocommit off (psycopg's default, said here because it matters): each
    # block above is one transaction.
    with ConnectionPool(
        os.environ["DATABASE_URL"],
        min_size=workers,
        max_size=workers,
        kwargs={"autocommit": False},
        configure=configure,
    ) as pool:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    print(
        f"orders: committed {stats['orders']} orders in {stats['checkouts']} checkouts; "
        f"declined {stats['declined']} checkouts ({stats['declined_orders']} orders); "
        f"retried {stats['retries']}"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
