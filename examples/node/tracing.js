// Tracing for both services: OpenTelemetry's SDK with an in-memory exporter
// and the W3C Trace Context propagator.
//
// The spans go nowhere but to SPANS_FILE (when set): one JSON object a line,
// written after each span ends, so that examples/run.sh can check that the
// consumer's span is a child of the order service's one, across the outbox,
// the relay and Redis. A real service would export them to a collector
// (OTLP) instead.

import { appendFileSync } from 'node:fs';
import { ROOT_CONTEXT, defaultTextMapGetter, defaultTextMapSetter, trace } from '@opentelemetry/api';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';

const exporter = new InMemorySpanExporter();
const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
const propagator = new W3CTraceContextPropagator();
const SPANS_FILE = process.env.SPANS_FILE;

export const tracer = (service) => provider.getTracer(`pg-outbox-example-${service}`);

// The context to start a span in: ROOT_CONTEXT with the span set in it.
export const withSpan = (span) => trace.setSpan(ROOT_CONTEXT, span);

// The trace context of a span (or of a context) as W3C headers:
// { traceparent, tracestate? }.
export function inject(ctx) {
  const carrier = {};
  propagator.inject(ctx, carrier, defaultTextMapSetter);
  return carrier;
}

// A context holding the remote parent that the headers name; ROOT_CONTEXT
// when they name none (or an invalid one: the propagator checks the format).
export const extract = (headers) => propagator.extract(ROOT_CONTEXT, headers, defaultTextMapGetter);

// Writes the spans ended since the last call to SPANS_FILE, one JSON object
// a line: service, name, trace and span ids, the parent span id (null for a
// root), and the span's attributes.
export function flushSpans(service) {
  const spans = exporter.getFinishedSpans();
  exporter.reset();
  if (!SPANS_FILE || spans.length === 0) return;
  const lines = spans.map((s) => JSON.stringify({
    service,
    name: s.name,
    trace_id: s.spanContext().traceId,
    span_id: s.spanContext().spanId,
    parent_span_id: s.parentSpanContext?.spanId ?? null,
    tracestate: s.spanContext().traceState?.serialize() ?? null,
    attributes: s.attributes,
  }));
  appendFileSync(SPANS_FILE, lines.join('\n') + '\n');
}
