// The order service: places orders and emits their events in the same transaction.
//
// A checkout (one to three orders of one customer) is one transaction: it
// inserts the orders, counts them on the customer's row, and emits one event
// per order on topic "orders", with outbox_emit() for one order and
// outbox_emit_many() for several. A checkout declined after emitting rolls
// back, and its events with it. Serialization failures (40001) and deadlocks
// (40P01) are retried with the same ids.
//
// Environment:
//   DATABASE_URL   the shop database, as shop_app
//   ORDERS         checkouts to place (default 20)
//   WORKERS        concurrent checkouts, each on a pooled connection (default 2)
//   REJECT_EVERY   every n-th checkout is declined after emitting (default 0: none)
//   SPANS_FILE     where to write the finished spans, one JSON object a line (default: nowhere)
//
// Tracing: each checkout request comes in with W3C trace context (a
// storefront's span, simulated here), except every third one, as from a
// batch import. The checkout runs in a span of its own, a child of the
// storefront's, and hands its trace context to the events it emits: in the
// transaction, SET LOCAL pg_outbox.traceparent and pg_outbox.tracestate
// (set_config(..., true)) before outbox_emit(). pg_outbox stores them in
// the events' headers, the relay passes them on in the stream entries, and
// the consumer starts its span as a child of this one.

import { randomBytes, randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { ROOT_CONTEXT, SpanKind, SpanStatusCode, TraceFlags, trace } from '@opentelemetry/api';
import { TraceState } from '@opentelemetry/core';
import pg from 'pg';
import { flushSpans, inject, tracer, withSpan } from './tracing.js';

// What a retry can fix: the transaction lost a race, not an argument.
const RETRYABLE = new Set(['40001', '40P01']);
const MAX_ATTEMPTS = 10;
const CUSTOMERS = ['ann', 'bob', 'eve', null]; // null: a guest checkout, emitted without a key

class Declined extends Error {}

// The orders of checkout n. Ids are made here, once, outside the retry loop:
// a retried transaction emits the same event ids as the attempt that rolled back.
function plan(n) {
  const customer = CUSTOMERS[Math.floor(n / 2) % CUSTOMERS.length]; // two checkouts in a row share a customer
  return Array.from({ length: 1 + (n % 3) }, (_, i) => ({
    orderId: randomUUID(),
    eventId: randomUUID(),
    customer,
    amountCents: 100 + ((n * 37 + i * 11) % 900),
  }));
}

const payload = (o) => ({ order_id: o.orderId, customer: o.customer, amount_cents: o.amountCents });

// The context a checkout request came in with: a storefront's span, remote,
// with a tracestate entry of its own. (A web framework's instrumentation
// extracts it from the request's traceparent and tracestate headers.)
function storefront() {
  return trace.setSpanContext(ROOT_CONTEXT, {
    traceId: randomBytes(16).toString('hex'),
    spanId: randomBytes(8).toString('hex'),
    traceFlags: TraceFlags.SAMPLED,
    traceState: new TraceState('storefront=node'),
    isRemote: true,
  });
}

// Places one checkout in one transaction; returns how often it was retried.
// traceContext ({ traceparent, tracestate? }, or null: untraced) goes to
// every event the transaction emits.
async function place(pool, orders, decline, traceContext) {
  const customer = orders[0].customer;
  for (let attempt = 1; ; attempt++) {
    const client = await pool.connect();
    let broken;
    try {
      await client.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
      for (const o of orders) {
        await client.query('INSERT INTO orders (id, customer, amount_cents) VALUES ($1, $2, $3)',
          [o.orderId, customer, o.amountCents]);
      }
      if (customer !== null) {
        // Every checkout of a customer updates this row: concurrent ones
        // collide, which REPEATABLE READ reports as 40001.
        await client.query('UPDATE customers SET orders_placed = orders_placed + $1 WHERE id = $2',
          [orders.length, customer]);
      }
      if (traceContext !== null) {
        // Transaction-local (is_local true): it ends with the transaction,
        // and a pooled connection never hands it to the next checkout.
        await client.query("SELECT set_config('pg_outbox.traceparent', $1, true), set_config('pg_outbox.tracestate', $2, true)",
          [traceContext.traceparent, traceContext.tracestate ?? '']);
      }
      if (orders.length === 1) {
        const o = orders[0];
        // Objects are sent as JSON text; parameters are untyped, so the
        // server takes their types from the function.
        await client.query("SELECT outbox_emit('orders', $1, $2, $3, $4)",
          [customer, payload(o), { source: 'node' }, o.eventId]);
      } else {
        // A JS array is sent as a PostgreSQL array literal whose elements are
        // the objects' JSON: jsonb[] here. (For a jsonb parameter, that is the
        // trap: pass JSON.stringify(array), not the array.)
        await client.query("SELECT count(*) FROM outbox_emit_many('orders', $1, $2, NULL, $3)",
          [customer === null ? null : orders.map(() => customer), orders.map(payload), orders.map((o) => o.eventId)]);
      }
      if (decline) throw new Declined(`payment declined for ${orders.length} order(s)`);
      await client.query('COMMIT');
      return attempt - 1;
    } catch (err) {
      try {
        await client.query('ROLLBACK');
      } catch (rollbackErr) {
        broken = rollbackErr; // the connection is gone: the pool must not reuse it
      }
      if (!RETRYABLE.has(err.code) || attempt === MAX_ATTEMPTS) throw err;
      console.error(`orders: retrying checkout after SQLSTATE ${err.code}, attempt ${attempt}`);
      await sleep(Math.min(500, 10 * 2 ** attempt) * (0.5 + Math.random() / 2));
    } finally {
      client.release(broken);
    }
  }
}

async function main() {
  const checkouts = Number(process.env.ORDERS ?? 20);
  const workers = Number(process.env.WORKERS ?? 2);
  const rejectEvery = Number(process.env.REJECT_EVERY ?? 0);
  const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL, max: workers });
  const stats = { orders: 0, checkouts: 0, declined: 0, declinedOrders: 0, retries: 0 };

  async function work(first) {
    for (let n = first; n < checkouts; n += workers) {
      const orders = plan(n);
      const decline = rejectEvery > 0 && n % rejectEvery === rejectEvery - 1;
      const traced = n % 3 !== 1;
      const span = traced ? tracer('orders').startSpan('checkout', {
        kind: SpanKind.PRODUCER,
        attributes: { 'checkout.number': n, 'messaging.destination.name': 'orders', event_ids: orders.map((o) => o.eventId) },
      }, storefront()) : null;
      try {
        stats.retries += await place(pool, orders, decline, span && inject(withSpan(span)));
        stats.orders += orders.length;
        stats.checkouts += 1;
        span?.setAttribute('committed', true);
      } catch (err) {
        span?.setStatus({ code: SpanStatusCode.ERROR, message: err.message });
        span?.setAttribute('committed', false);
        if (!(err instanceof Declined)) throw err;
        console.error(`orders: checkout ${n} rolled back: ${err.message}`);
        stats.declined += 1;
        stats.declinedOrders += orders.length;
      } finally {
        span?.end();
        flushSpans('orders');
      }
    }
  }

  const results = await Promise.allSettled(Array.from({ length: workers }, (_, i) => work(i)));
  await pool.end();
  const failed = results.find((r) => r.status === 'rejected');
  if (failed) throw failed.reason;
  console.log(`orders: committed ${stats.orders} orders in ${stats.checkouts} checkouts; ` +
    `declined ${stats.declined} checkouts (${stats.declinedOrders} orders); retried ${stats.retries}`);
}

main().catch((err) => {
  console.error(`orders: ${err.stack ?? err}`);
  process.exit(1);
});
