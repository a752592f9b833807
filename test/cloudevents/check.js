// Reads pg_outbox_relay's CloudEvents stream entries with the CloudEvents
// JavaScript SDK (npm "cloudevents"), validates each one and compares what
// the SDK makes of it with the event that was emitted.
//
//   node check.js --redis URL --emitted FILE --default STREAM
//                 --binary STREAM --binary-source SOURCE
//                 --structured STREAM --structured-source SOURCE
//                 [--verdicts FILE]
//   node check.js --redis URL --emitted FILE --chain STREAM --vias LIST
//
// --emitted: the events as stored (one JSON object a line: event_id, topic,
// key, payload, headers). --default: the same events published in the
// default format, which gives each event's position and created_at.
// --binary / --structured: the streams published with --format cloudevents
// and --format cloudevents-structured, with the source each one should
// carry.
//
// Binary content mode: the ce_* fields are the attributes, content-type the
// datacontenttype, data the payload (parsed as JSON: application/json); the
// event is built with new CloudEvent({...}) and validate()d. Structured
// content mode: the "event" field is a CloudEvent in the JSON event format,
// read with HTTP.toEvent (the SDK's receiver, structured headers) and with
// new CloudEvent(JSON.parse(...)), both validate()d.
//
// Beyond the SDK's schema, each entry is checked against the CloudEvents
// 1.0.2 rules that the SDK does not check (attribute names; the String
// type's disallowed characters; time in RFC 3339; no data_base64 for JSON
// data) and against pg_outbox's mapping (docs/cloudevents-redis-streams.md).
//
// --chain: the stream of the events that consume handlers emitted, one for
// each event they applied, in the default format; each payload records
// what its handler got ($1 topic, $2 key, $3 payload, $4 headers, $5 event
// id, $6 traceparent) and "via" (one of LIST: which stream it came from).
// Each must be the emitted event's, and the handler's event must carry the
// emitted event's trace context: A -> B -> C is one trace.
//
// Output: one TAP line per entry ("ok"/"not ok", the problems after "#"),
// then "N passed, N failed"; with --verdicts, also one JSON object a line
// per entry (stream, entry, mode, event_id, valid, problems, and the SDK's
// view: id, type, source, subject, time, datacontenttype, data,
// extensions). Exit status 1 when an entry failed or an event is missing.

import { readFileSync, writeFileSync } from 'node:fs';
import { isDeepStrictEqual } from 'node:util';
import { CloudEvent, HTTP } from 'cloudevents';
import Redis from 'ioredis';

const args = {};
for (let i = 2; i < process.argv.length; i += 2) args[process.argv[i].replace(/^--/, '')] = process.argv[i + 1];
for (const required of args.chain !== undefined ? ['redis', 'emitted', 'vias']
  : ['redis', 'emitted', 'default', 'binary', 'binary-source', 'structured', 'structured-source']) {
  if (args[required] === undefined) {
    console.error(`check.js: --${required} is required`);
    process.exit(2);
  }
}

const TRACE_KEYS = ['traceparent', 'tracestate'];
const CORE = new Set(['specversion', 'id', 'source', 'type', 'datacontenttype', 'dataschema', 'subject', 'time', 'data']);
const EXTENSIONS = ['partitionkey', 'sequence', 'traceparent', 'tracestate', 'pgoutboxheaders'];
// RFC 3339 date-time, as pg_outbox writes it: UTC, six fractional digits.
const RFC3339 = /^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)$/;
const SEQUENCE = /^\d{20}-\d{20}$/;

// Values of the String type must not hold the characters CloudEvents 1.0.2
// disallows: controls U+0000-U+001F and U+007F-U+009F, surrogates (a lone
// one in a JS string), noncharacters U+FDD0-U+FDEF and U+xFFFE/U+xFFFF.
function stringProblem(value) {
  if (typeof value !== 'string') return `not a string (${typeof value})`;
  for (let i = 0; i < value.length; i++) {
    const c = value.codePointAt(i);
    if (c > 0xffff) i++;
    if (c <= 0x1f || (c >= 0x7f && c <= 0x9f)) return `control character U+${c.toString(16).padStart(4, '0')}`;
    if (c >= 0xd800 && c <= 0xdfff) return 'a lone surrogate';
    if ((c >= 0xfdd0 && c <= 0xfdef) || (c & 0xfffe) === 0xfffe) return `noncharacter U+${c.toString(16)}`;
  }
  return null;
}

// A stream entry's fields as [name, value] pairs, in their order. Values
// that are not UTF-8 are a problem of their own (reported, not decoded).
function fieldList(raw) {
  const list = [];
  for (let i = 0; i + 1 < raw.length; i += 2) list.push([raw[i].toString('utf8'), raw[i + 1]]);
  return list;
}

function readEmitted(path) {
  const byId = new Map();
  for (const line of readFileSync(path, 'utf8').split('\n')) {
    if (line.trim() === '') continue;
    const e = JSON.parse(line);
    byId.set(e.event_id, e);
  }
  return byId;
}

// What the CloudEvent of an event must hold (docs/cloudevents-redis-streams.md).
function expectedAttributes(e, entry, source) {
  const [txid, seq] = entry.position.split('-');
  const rest = e.headers && typeof e.headers === 'object' ? { ...e.headers } : null;
  for (const k of TRACE_KEYS) if (rest) delete rest[k];
  const want = {
    specversion: '1.0',
    id: e.event_id,
    source,
    type: e.topic,
    time: entry.created_at,
    subject: e.key ?? undefined,
    partitionkey: e.key ?? undefined,
    sequence: `${txid.padStart(20, '0')}-${seq.padStart(20, '0')}`,
    traceparent: e.headers?.traceparent,
    tracestate: e.headers?.traceparent === undefined ? undefined : e.headers?.tracestate,
    pgoutboxheaders: rest && Object.keys(rest).length > 0 ? rest : undefined,
    datacontenttype: 'application/json',
    data: e.payload,
  };
  return want;
}

// Compares the SDK's event with the expected attributes; returns problems.
function compare(ce, want, label) {
  const problems = [];
  for (const name of ['specversion', 'id', 'source', 'type', 'time', 'subject', 'partitionkey', 'sequence',
    'traceparent', 'tracestate', 'datacontenttype']) {
    // The SDK's receiver (HTTP.toEvent) turns time into a Date and back:
    // milliseconds. Through it, the instant is compared.
    if (name === 'time' && label !== '' && typeof ce.time === 'string' &&
      new Date(ce.time).toISOString() === new Date(want.time).toISOString()) continue;
    if (ce[name] !== want[name]) problems.push(`${label}${name} is ${JSON.stringify(ce[name])}, emitted ${JSON.stringify(want[name])}`);
  }
  if (ce.pgoutboxheaders === undefined) {
    if (want.pgoutboxheaders !== undefined) problems.push(`${label}pgoutboxheaders missing, emitted ${JSON.stringify(want.pgoutboxheaders)}`);
  } else {
    let h;
    try { h = JSON.parse(ce.pgoutboxheaders); } catch { h = Symbol('not JSON'); }
    if (!isDeepStrictEqual(h, want.pgoutboxheaders)) {
      problems.push(`${label}pgoutboxheaders is ${JSON.stringify(ce.pgoutboxheaders)}, emitted ${JSON.stringify(want.pgoutboxheaders)}`);
    }
  }
  if (!isDeepStrictEqual(ce.data, want.data)) problems.push(`${label}data is ${JSON.stringify(ce.data)}, emitted ${JSON.stringify(want.data)}`);
  for (const name of Object.keys(ce)) {
    if (!CORE.has(name) && !EXTENSIONS.includes(name) && name !== 'data_base64' && ce[name] !== undefined) {
      problems.push(`${label}unexpected attribute ${name}`);
    }
  }
  if (ce.data_base64 !== undefined) problems.push(`${label}data_base64 set for JSON data`);
  return problems;
}

// The rules of CloudEvents 1.0.2 that the SDK's schema leaves out.
function specProblems(attrs) {
  const problems = [];
  for (const [name, value] of Object.entries(attrs)) {
    if (name === 'data') continue;
    if (!/^[a-z0-9]+$/.test(name)) problems.push(`attribute name ${JSON.stringify(name)} is not [a-z0-9]+`);
    if (name.length > 20) problems.push(`attribute name ${name} is over 20 characters`);
    const p = stringProblem(value);
    if (p) problems.push(`${name}: ${p}`);
  }
  if (attrs.time !== undefined && !RFC3339.test(attrs.time)) problems.push(`time ${JSON.stringify(attrs.time)} is not RFC 3339`);
  if (attrs.sequence !== undefined && !SEQUENCE.test(attrs.sequence)) problems.push(`sequence ${JSON.stringify(attrs.sequence)} is not two 20-digit numbers`);
  for (const required of ['id', 'source', 'specversion', 'type']) {
    if (typeof attrs[required] !== 'string' || attrs[required] === '') problems.push(`${required} missing or empty`);
  }
  return problems;
}

// The SDK's view of an event, for the verdicts.
function view(ce) {
  const extensions = {};
  for (const [k, v] of Object.entries(ce)) if (!CORE.has(k) && k !== 'data_base64' && v !== undefined) extensions[k] = v;
  return { id: ce.id, type: ce.type, source: ce.source, subject: ce.subject, time: ce.time,
    datacontenttype: ce.datacontenttype, data: ce.data, extensions };
}

function checkBinary(fields, emitted, positions, source) {
  const problems = [];
  const names = fields.map(([n]) => n);
  const get = (n) => fields.find(([name]) => name === n)?.[1]?.toString('utf8');
  const attrs = {};
  for (const [name, value] of fields) {
    if (!name.startsWith('ce_')) continue;
    const text = value.toString('utf8');
    if (!Buffer.from(text, 'utf8').equals(value)) problems.push(`${name} is not UTF-8`);
    attrs[name.slice(3)] = text;
  }
  // Field order of the binding: ce_specversion first, content-type and
  // data after the attributes, prev last.
  const order = ['ce_specversion', 'ce_id', 'ce_source', 'ce_type', 'ce_time', 'ce_subject', 'ce_partitionkey',
    'ce_sequence', 'ce_traceparent', 'ce_tracestate', 'ce_pgoutboxheaders', 'content-type', 'data', 'prev'];
  const known = names.filter((n) => order.includes(n));
  if (known.length !== names.length) problems.push(`unexpected fields: ${names.filter((n) => !order.includes(n)).join(', ')}`);
  if (!isDeepStrictEqual(known, order.filter((n) => names.includes(n)))) problems.push(`field order ${names.join(',')}`);
  const contentType = get('content-type');
  if (contentType !== 'application/json') problems.push(`content-type is ${JSON.stringify(contentType)}`);
  const dataText = get('data');
  let data;
  try {
    data = JSON.parse(dataText); // application/json: the data is the JSON value
  } catch (err) {
    problems.push(`data is not JSON: ${err.message}`);
  }
  problems.push(...specProblems(attrs));
  let ce = null;
  try {
    ce = new CloudEvent({ ...attrs, datacontenttype: contentType, data }, false);
    ce.validate();
  } catch (err) {
    problems.push(`SDK: ${err.message.replace(/\s+/g, ' ')}`);
  }
  const e = emitted.get(attrs.id);
  if (!e) problems.push(`event ${attrs.id} was not emitted`);
  else if (!positions.has(attrs.id)) problems.push(`event ${attrs.id} is not in the default stream`);
  else if (ce) problems.push(...compare(ce, expectedAttributes(e, positions.get(attrs.id), source), ''));
  return { id: attrs.id, sequence: attrs.sequence, ce, problems };
}

function checkStructured(fields, emitted, positions, source) {
  const problems = [];
  const names = fields.map(([n]) => n);
  const get = (n) => fields.find(([name]) => name === n)?.[1]?.toString('utf8');
  const expectedNames = names.includes('prev') ? ['content-type', 'event', 'prev'] : ['content-type', 'event'];
  if (!isDeepStrictEqual(names, expectedNames)) problems.push(`fields ${names.join(',')}, not ${expectedNames.join(',')}`);
  const contentType = get('content-type');
  if (contentType !== 'application/cloudevents+json') problems.push(`content-type is ${JSON.stringify(contentType)}`);
  const text = get('event') ?? '';
  let obj = {};
  try {
    obj = JSON.parse(text);
    if (obj === null || typeof obj !== 'object' || Array.isArray(obj)) throw new Error('not a JSON object');
  } catch (err) {
    problems.push(`event is not a JSON object: ${err.message}`);
    obj = {};
  }
  if ('data_base64' in obj) problems.push('data_base64 in a structured event of JSON data');
  if (obj.datacontenttype !== 'application/json') problems.push(`datacontenttype is ${JSON.stringify(obj.datacontenttype)}`);
  if (obj.pgoutboxheaders !== undefined && typeof obj.pgoutboxheaders !== 'string') problems.push('pgoutboxheaders is not a string');
  const attrs = { ...obj };
  delete attrs.data;
  problems.push(...specProblems(attrs));
  let ce = null;
  try {
    ce = new CloudEvent(obj, false);
    ce.validate();
  } catch (err) {
    problems.push(`SDK (new CloudEvent): ${err.message.replace(/\s+/g, ' ')}`);
  }
  // The SDK's structured receiver. It skips attributes whose value is falsy
  // (data null, 0, false or ""): data is compared through it only otherwise.
  let received = null;
  try {
    received = HTTP.toEvent({ headers: { 'content-type': 'application/cloudevents+json' }, body: text });
    if (Array.isArray(received)) throw new Error('read as a batch');
    received.validate();
  } catch (err) {
    problems.push(`SDK (HTTP.toEvent): ${err.message.replace(/\s+/g, ' ')}`);
    received = null;
  }
  const e = emitted.get(obj.id);
  if (!e) problems.push(`event ${obj.id} was not emitted`);
  else if (!positions.has(obj.id)) problems.push(`event ${obj.id} is not in the default stream`);
  else {
    const want = expectedAttributes(e, positions.get(obj.id), source);
    if (ce) problems.push(...compare(ce, want, ''));
    if (received) {
      const r = compare(received, want, 'HTTP.toEvent: ');
      problems.push(...(want.data ? r : r.filter((p) => !p.startsWith('HTTP.toEvent: data is'))));
    }
  }
  return { id: obj.id, sequence: obj.sequence, ce, problems };
}

// The chain: each handler's event against the event its handler applied.
async function checkChain(redis, emitted, report) {
  const vias = args.vias.split(',');
  const seen = new Set();
  for (const [entryId, raw] of await redis.xrangeBuffer(args.chain, '-', '+')) {
    const f = Object.fromEntries(fieldList(raw).map(([n, v]) => [n, v.toString('utf8')]));
    const problems = [];
    let got = {};
    let headers = null;
    try {
      got = JSON.parse(f.payload);
      headers = f.headers === undefined ? null : JSON.parse(f.headers);
    } catch (err) {
      problems.push(`not JSON: ${err.message}`);
    }
    const e = emitted.get(got.event_id);
    if (!vias.includes(got.via)) problems.push(`via ${JSON.stringify(got.via)}`);
    if (seen.has(`${got.via} ${got.event_id}`)) problems.push('handled twice');
    seen.add(`${got.via} ${got.event_id}`);
    if (!e) {
      problems.push(`event ${got.event_id} was not emitted`);
    } else {
      // Headers that are an empty object have no pgoutboxheaders, and come
      // back as NULL (docs/cloudevents-redis-streams.md, 4.6).
      const headersBack = e.headers !== null && Object.keys(e.headers).length === 0 ? null : e.headers;
      for (const [name, want] of [['topic', e.topic], ['key', e.key], ['payload', e.payload], ['headers', headersBack],
        ['traceparent', e.headers?.traceparent ?? null]]) {
        if (!isDeepStrictEqual(got[name], want)) problems.push(`handler got ${name} ${JSON.stringify(got[name])}, emitted ${JSON.stringify(want)}`);
      }
      // The handler's event: the emitted event's trace context, in its
      // headers and in the entry's traceparent and tracestate fields.
      const tp = e.headers?.traceparent;
      const ts = tp === undefined ? undefined : e.headers?.tracestate;
      if (headers?.traceparent !== tp) problems.push(`handler's event has traceparent ${JSON.stringify(headers?.traceparent)}, the first event ${JSON.stringify(tp)}`);
      if (headers?.tracestate !== ts) problems.push(`handler's event has tracestate ${JSON.stringify(headers?.tracestate)}, the first event ${JSON.stringify(ts)}`);
      if (f.traceparent !== tp) problems.push(`entry field traceparent ${JSON.stringify(f.traceparent)}, the first event's ${JSON.stringify(tp)}`);
      if (f.tracestate !== ts) problems.push(`entry field tracestate ${JSON.stringify(f.tracestate)}, the first event's ${JSON.stringify(ts)}`);
    }
    const trace = e?.headers?.traceparent?.split('-')[1];
    report(problems.length === 0, `chain entry ${entryId}: ${got.via} event ${got.event_id} -> handler -> ${f.event_id}` +
      (trace ? ` in trace ${trace}` : ' (no trace context)') + (problems.length ? ` # ${problems.join('; ')}` : ''));
  }
  const missing = [];
  for (const via of vias) for (const id of emitted.keys()) if (!seen.has(`${via} ${id}`)) missing.push(`${via} ${id}`);
  report(missing.length === 0, `chain: every emitted event handled once per stream (${vias.join(', ')})` +
    (missing.length ? ` # missing: ${missing.join(', ')}` : ''));
}

async function main() {
  const emitted = readEmitted(args.emitted);
  const redis = new Redis(args.redis, { maxRetriesPerRequest: 1 });
  if (args.chain !== undefined) {
    let passed = 0;
    let failed = 0;
    await checkChain(redis, emitted, (ok, text) => {
      if (ok) passed++; else failed++;
      console.log(`${ok ? 'ok' : 'not ok'} ${passed + failed} - ${text}`);
    });
    redis.disconnect();
    console.log(`${passed} passed, ${failed} failed`);
    process.exit(failed === 0 ? 0 : 1);
  }
  const positions = new Map();
  for (const [, raw] of await redis.xrangeBuffer(args.default, '-', '+')) {
    const f = Object.fromEntries(fieldList(raw).map(([n, v]) => [n, v.toString('utf8')]));
    positions.set(f.event_id, { position: f.position, created_at: f.created_at });
  }
  const verdicts = [];
  let passed = 0;
  let failed = 0;
  const report = (ok, text) => {
    if (ok) passed++; else failed++;
    console.log(`${ok ? 'ok' : 'not ok'} ${passed + failed} - ${text}`);
  };
  for (const [mode, stream, source] of [['binary', args.binary, args['binary-source']],
    ['structured', args.structured, args['structured-source']]]) {
    const seen = new Set();
    let previous = null;
    for (const [entryId, raw] of await redis.xrangeBuffer(stream, '-', '+')) {
      const fields = fieldList(raw);
      const r = (mode === 'binary' ? checkBinary : checkStructured)(fields, emitted, positions, source);
      // Sequences sort as text in the order of the stream.
      if (previous !== null && !(r.sequence > previous)) r.problems.push(`sequence ${r.sequence} does not sort after ${previous}`);
      previous = r.sequence ?? previous;
      if (seen.has(r.id)) r.problems.push(`event ${r.id} twice in the stream`);
      seen.add(r.id);
      verdicts.push({ stream, entry: entryId.toString(), mode, event_id: r.id ?? null, valid: r.problems.length === 0,
        problems: r.problems, sdk: r.ce ? view(r.ce) : null });
      const key = emitted.get(r.id)?.key;
      report(r.problems.length === 0, `${mode} entry ${entryId} event ${r.id} (key ${JSON.stringify(key ?? null)})` +
        (r.problems.length ? ` # ${r.problems.join('; ')}` : ''));
    }
    const missing = [...emitted.keys()].filter((id) => !seen.has(id));
    report(missing.length === 0 && seen.size > 0, `${mode}: all ${emitted.size} emitted events in ${stream}` +
      (missing.length ? ` # missing: ${missing.join(', ')}` : ''));
  }
  redis.disconnect();
  if (args.verdicts) writeFileSync(args.verdicts, verdicts.map((v) => JSON.stringify(v)).join('\n') + '\n');
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed === 0 ? 0 : 1);
}

main().catch((err) => {
  console.error(`check.js: ${err.stack ?? err}`);
  process.exit(2);
});
