package main

// Tracing for both services: OpenTelemetry's Go SDK with an in-memory
// exporter and the W3C Trace Context propagator.
//
// The spans go nowhere but to SPANS_FILE (when set): one JSON object a line,
// written after each span ends, so that examples/run.sh can check that the
// consumer's span is a child of the order service's one, across the outbox,
// the relay and Redis. A real service would export them to a collector
// (OTLP) instead.

import (
	"context"
	"encoding/json"
	"log"
	"os"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

var (
	spanExporter = tracetest.NewInMemoryExporter()
	// WithSyncer: each span is exported when it ends, not in batches.
	tracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSyncer(spanExporter))
	propagator     = propagation.TraceContext{}
	spansMu        sync.Mutex
)

func tracer(service string) trace.Tracer {
	return tracerProvider.Tracer("pg-outbox-example-" + service)
}

// traceHeaders is a propagation.TextMapCarrier over a plain map, keys as
// they are (http.Header would canonicalize them).
type traceHeaders map[string]string

func (h traceHeaders) Get(key string) string { return h[key] }
func (h traceHeaders) Set(key, value string) { h[key] = value }
func (h traceHeaders) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}

// inject returns the trace context of ctx's span as W3C headers:
// traceparent and, when the span has one, tracestate.
func inject(ctx context.Context) traceHeaders {
	h := traceHeaders{}
	propagator.Inject(ctx, h)
	return h
}

// extract returns a context holding the remote parent that the headers
// name; one without a span when they name none (or an invalid one: the
// propagator checks the format).
func extract(h traceHeaders) context.Context {
	return propagator.Extract(context.Background(), h)
}

// flushSpans writes the spans ended since the last call to SPANS_FILE, one
// JSON object a line: service, name, trace and span ids, the parent span
// id (null for a root), tracestate and attributes.
func flushSpans(service string) {
	spansMu.Lock()
	defer spansMu.Unlock()
	spans := spanExporter.GetSpans()
	spanExporter.Reset()
	path := os.Getenv("SPANS_FILE")
	if path == "" || len(spans) == 0 {
		return
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		log.Printf("spans: %v", err)
		return
	}
	defer f.Close()
	enc := json.NewEncoder(f)
	for _, s := range spans {
		var parent *string
		if s.Parent.IsValid() {
			id := s.Parent.SpanID().String()
			parent = &id
		}
		var tracestate *string
		if ts := s.SpanContext.TraceState().String(); ts != "" {
			tracestate = &ts
		}
		attrs := map[string]interface{}{}
		for _, kv := range s.Attributes {
			attrs[string(kv.Key)] = attributeValue(kv.Value)
		}
		if err := enc.Encode(map[string]interface{}{
			"service": service, "name": s.Name,
			"trace_id": s.SpanContext.TraceID().String(), "span_id": s.SpanContext.SpanID().String(),
			"parent_span_id": parent, "tracestate": tracestate, "attributes": attrs,
		}); err != nil {
			log.Printf("spans: %v", err)
		}
	}
}

func attributeValue(v attribute.Value) interface{} {
	switch v.Type() {
	case attribute.BOOL:
		return v.AsBool()
	case attribute.INT64:
		return v.AsInt64()
	case attribute.STRINGSLICE:
		return v.AsStringSlice()
	default:
		return v.Emit()
	}
}
