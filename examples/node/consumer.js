// The reporting service: applies order events from Redis exactly once.
//
// Reads the stream through a Redis consumer group (XREADGROUP) and applies
// each entry in its own transaction: inbox_apply() and, when the event is
// new, the projection. The entry is acknowledged (XACK) only after the
// commit. A worker that dies between its commit and its XACK leaves the entry
// pending; another worker (or this one, restarted) reclaims it with
// XAUTOCLAIM, inbox_apply() reports it as a duplicate, and it is acknowledged
// without being applied again. The same event id with another payload is an
// identity conflict (SQLSTATE OB001): logged, dead-lettered, acknowledged,
// never applied.
//
// Environment:
//   DATABASE_URL        the reports database, as reports_app
//   REDIS_URL           redis://host:port/db (default redis://127.0.0.1:6379/0)
//   STREAM              the stream to read (default outbox:orders)
//   CONSUMER            the inbox consumer and Redis consumer group (default reports)
//   WORKER              this worker's name in the group (default host:pid)
//   MIN_IDLE_MS         reclaim pending entries idle this long (default 30000)
//   CLAIM_INTERVAL_MS   how often to look for them (default 5000)
//   CRASH_AFTER_COMMIT  test hook: die (SIGKILL) right after the n-th commit, before its XACK
//   SPANS_FILE          where to write the finished spans, one JSON object a line (default: nowhere)
//
// Tracing: an entry of an event emitted with trace context has the fields
// "traceparent" (and "tracestate"), which are also in its headers. The
// consumer extracts that context with the W3C propagator and applies the
// entry in a span that is its child: the order service's checkout and this
// apply are one trace. An entry without (valid) trace context is applied in
// a new trace.

import { isUtf8 } from 'node:buffer';
import { hostname } from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import Redis from 'ioredis';
import { SpanKind } from '@opentelemetry/api';
import pg from 'pg';
import { extract, flushSpans, tracer } from './tracing.js';

const STREAM = process.env.STREAM ?? 'outbox:orders';
const CONSUMER = process.env.CONSUMER ?? 'reports';
const GROUP = CONSUMER;
const WORKER = process.env.WORKER ?? `${hostname()}:${process.pid}`;
const MIN_IDLE_MS = Number(process.env.MIN_IDLE_MS ?? 30000);
const CLAIM_INTERVAL_MS = Number(process.env.CLAIM_INTERVAL_MS ?? 5000);
const CRASH_AFTER_COMMIT = Number(process.env.CRASH_AFTER_COMMIT ?? 0);
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

const log = (msg) => console.error(`consumer: ${msg}`);
let stopping = false;
let commits = 0;

class Malformed extends Error {}

// Lost connection (class 08 or a socket error), serialization failure,
// deadlock, shutdown: the transaction rolled back and a retry may succeed.
function transient(err) {
  const code = err.code ?? '';
  return code.startsWith('08') || ['40001', '40P01', '57P01', '57P03'].includes(code) ||
    code.startsWith('E') || /Connection terminated/.test(err.message);
}

// Redis returns an entry's fields as [name, value, name, value, ...], here
// as Buffers (the ...Buffer commands): ioredis's strings would silently turn
// bytes that are not UTF-8 into U+FFFD. Such fields (and those with NUL) are
// listed under INVALID, their bytes outside ASCII written \xNN.
const INVALID = Symbol('fields that are not UTF-8');
const escaped = (buf) => Array.from(buf, (b) => (b > 0 && b < 0x80 ? String.fromCharCode(b) : `\\x${b.toString(16).padStart(2, '0')}`)).join('');
function fieldsOf(list) {
  const fields = { [INVALID]: [] };
  for (let i = 0; i + 1 < list.length; i += 2) {
    const name = escaped(list[i]);
    const valid = isUtf8(list[i + 1]) && !list[i + 1].includes(0); // no PostgreSQL text holds a NUL
    fields[name] = valid ? list[i + 1].toString() : escaped(list[i + 1]);
    if (!valid) fields[INVALID].push(name);
  }
  return fields;
}

// Reads an entry's fields. "key" and "headers" are absent when the producer
// emitted NULL; the others are always there.
function parse(f) {
  if (f[INVALID].length > 0) throw new Malformed(`not UTF-8 text: ${f[INVALID].join(', ')}`);
  try {
    if (!UUID.test(f.event_id ?? '')) throw new Error(`event_id ${JSON.stringify(f.event_id)} is not a uuid`);
    const order = JSON.parse(f.payload);
    const headers = f.headers === undefined ? {} : JSON.parse(f.headers);
    if (!UUID.test(order?.order_id ?? '') || !Number.isInteger(order.amount_cents)) throw new Error('not an order');
    return {
      eventId: f.event_id,
      key: f.key ?? null,
      payload: f.payload, // sent as text: the server compares it as jsonb
      orderId: order.order_id,
      amountCents: order.amount_cents,
      source: headers?.source ?? null,
      // The entry's own fields, else the headers' keys (the same values).
      trace: {
        traceparent: f.traceparent ?? headers?.traceparent,
        tracestate: f.tracestate ?? headers?.tracestate,
      },
    };
  } catch (err) {
    throw new Malformed(err.message);
  }
}

// Applies one event in one transaction; true if new, false if a duplicate.
async function apply(pool, entryId, e) {
  const client = await pool.connect();
  let broken;
  try {
    await client.query('BEGIN');
    const { rows } = await client.query('SELECT inbox_apply($1, $2, $3) AS new', [CONSUMER, e.eventId, e.payload]);
    if (rows[0].new) {
      await client.query(
        `INSERT INTO applied_orders (order_id, event_id, customer, amount_cents, entry_id, source)
         VALUES ($1, $2, $3, $4, $5, $6)`,
        [e.orderId, e.eventId, e.key, e.amountCents, entryId, e.source]);
      await client.query(
        `INSERT INTO order_totals AS t (customer, orders, amount_cents) VALUES (coalesce($1, '(guest)'), 1, $2)
         ON CONFLICT (customer) DO UPDATE SET orders = t.orders + 1, amount_cents = t.amount_cents + excluded.amount_cents`,
        [e.key, e.amountCents]);
    }
    await client.query('COMMIT');
    return rows[0].new;
  } catch (err) {
    await client.query('ROLLBACK').catch((rollbackErr) => { broken = rollbackErr; });
    throw err;
  } finally {
    client.release(broken);
  }
}

// Records an entry given up on, with what can be kept of it.
async function deadLetter(pool, entryId, f, reason, sqlstate = null) {
  const json = (text) => { try { JSON.parse(text); return text; } catch { return null; } };
  const payload = json(f.payload);
  // Keep what is not JSON (or not UTF-8) in the reason: a dead letter loses nothing.
  if (f.payload !== undefined && payload === null) reason += ` (payload: ${f.payload})`;
  await pool.query('SELECT inbox_dead_letter($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)',
    [CONSUMER, STREAM, entryId, UUID.test(f.event_id ?? '') ? f.event_id : null, f.topic ?? null, f.key ?? null,
      payload, json(f.headers), reason, sqlstate]);
}

// Applies, dead-letters or skips one entry, then acknowledges it.
async function handle(pool, redis, entryId, f) {
  if (f === null) { // trimmed from the stream while pending
    log(`dead-lettered ${entryId}: the entry was trimmed from the stream before it was applied`);
    await deadLetter(pool, entryId, {}, 'trimmed from the stream while pending');
    await redis.xack(STREAM, GROUP, entryId);
    return;
  }
  let e;
  let isNew;
  for (let attempt = 1; ; attempt++) {
    try {
      e = parse(f);
      const span = tracer('consumer').startSpan('apply order', {
        kind: SpanKind.CONSUMER,
        attributes: { 'messaging.message.id': entryId, event_id: e.eventId },
      }, extract(e.trace));
      try {
        isNew = await apply(pool, entryId, e);
        span.setAttribute('new', isNew);
      } finally {
        span.end();
        flushSpans('consumer');
      }
      break;
    } catch (err) {
      if (err instanceof Malformed) {
        log(`dead-lettered ${entryId}: malformed entry (${err.message})`);
        await deadLetter(pool, entryId, f, `malformed entry: ${err.message}`);
      } else if (err.code === 'OB001') {
        // Same event id, another payload: never applied, never silent.
        log(`CONFLICT ${entryId} event ${f.event_id}: ${err.message} ${err.detail}`);
        await deadLetter(pool, entryId, f, err.message, err.code);
      } else if (err.code?.startsWith('22')) { // invalid uuid or JSON text, a NULL
        log(`dead-lettered ${entryId}: ${err.message} (SQLSTATE ${err.code})`);
        await deadLetter(pool, entryId, f, err.message, err.code);
      } else if (transient(err) && !stopping) {
        log(`retrying ${entryId} after ${err.message}`);
        await sleep(Math.min(5000, 100 * 2 ** attempt));
        continue;
      } else {
        throw err; // a fault of ours (privileges, schema): stop, the entry stays pending
      }
      await redis.xack(STREAM, GROUP, entryId);
      return;
    }
  }
  commits += 1;
  if (commits === CRASH_AFTER_COMMIT) {
    log(`committed ${entryId}, dying before XACK`);
    process.kill(process.pid, 'SIGKILL');
  }
  await redis.xack(STREAM, GROUP, entryId); // only now: after the commit
  log(isNew ? `applied ${entryId} event ${e.eventId}` : `duplicate ${entryId} event ${e.eventId} (applied before; acknowledged)`);
}

// Takes over entries that another worker (perhaps a dead one) left pending.
async function reclaim(pool, redis) {
  let cursor = '0-0';
  do {
    const [next, entries, deleted = []] = await redis.xautoclaimBuffer(STREAM, GROUP, WORKER, MIN_IDLE_MS, cursor, 'COUNT', 100);
    if (entries.length + deleted.length > 0) log(`reclaimed ${entries.length + deleted.length} pending entries`);
    for (const [id, fields] of entries) await handle(pool, redis, id.toString(), fieldsOf(fields));
    for (const id of deleted) await handle(pool, redis, id.toString(), null);
    cursor = next.toString();
  } while (cursor !== '0-0');
}

async function main() {
  process.on('SIGTERM', () => { stopping = true; });
  process.on('SIGINT', () => { stopping = true; });
  const redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379/0', { maxRetriesPerRequest: null });
  const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL, max: 2 });
  try {
    await redis.xgroup('CREATE', STREAM, GROUP, '0', 'MKSTREAM');
  } catch (err) {
    if (!String(err.message).includes('BUSYGROUP')) throw err;
  }
  log(`worker ${WORKER} reading ${STREAM} as consumer ${CONSUMER}`);
  let nextClaim = 0;
  while (!stopping) {
    if (Date.now() >= nextClaim) {
      await reclaim(pool, redis);
      nextClaim = Date.now() + CLAIM_INTERVAL_MS;
    }
    const reply = await redis.xreadgroupBuffer('GROUP', GROUP, WORKER, 'COUNT', 10, 'BLOCK', 1000, 'STREAMS', STREAM, '>');
    for (const [, entries] of reply ?? []) {
      for (const [id, fields] of entries) await handle(pool, redis, id.toString(), fieldsOf(fields));
    }
  }
  redis.disconnect();
  await pool.end();
  log('stopped');
}

main().catch((err) => {
  log(err.stack ?? String(err));
  process.exit(1);
});
