"""W3C Trace Context by hand, for both services: no tracing SDK.

What an SDK (OpenTelemetry's, say) does for you, in the few lines the
outbox needs: make a span's ids, write its context as a traceparent
header, read a traceparent from a stream entry and start a child span in
its trace. The spans go nowhere but to SPANS_FILE (when set): one JSON
object a line, so that examples/run.sh can check that the consumer's span
is a child of the order service's one. With OpenTelemetry, use its
TraceContextTextMapPropagator's inject() and extract() instead.
"""

import json
import os
import re
import secrets
import threading

# version 00 only, lowercase hex; all-zero ids are invalid (checked below).
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_lock = threading.Lock()


def parse_traceparent(value):
    """(trace_id, parent_span_id, flags) from a traceparent header, or None
    when it is missing or invalid (a consumer then starts a new trace)."""
    if not isinstance(value, str):
        return None
    m = _TRACEPARENT.fullmatch(value)
    if m is None or m.group(1) == "0" * 32 or m.group(2) == "0" * 16:
        return None
    return m.group(1), m.group(2), m.group(3)


class Span:
    """A span: its ids, its parent's span id (None for a root) and the
    tracestate it carries on, unchanged, to its children."""

    def __init__(self, name, trace_id=None, parent_span_id=None, flags="01", tracestate=None):
        self.name = name
        self.trace_id = trace_id or secrets.token_hex(16)
        self.span_id = secrets.token_hex(8)
        self.parent_span_id = parent_span_id
        self.flags = flags
        self.tracestate = tracestate
        self.attributes = {}

    @classmethod
    def child_of(cls, name, traceparent, tracestate=None):
        """A span in the trace that traceparent names, its child; a new
        trace (a root span) when traceparent is missing or invalid. A
        tracestate without a valid traceparent is dropped with it."""
        parent = parse_traceparent(traceparent)
        if parent is None:
            return cls(name)
        trace_id, parent_span_id, flags = parent
        return cls(name, trace_id, parent_span_id, flags, tracestate if isinstance(tracestate, str) and tracestate else None)

    def traceparent(self):
        """This span's context as a traceparent header: what goes into
        pg_outbox.traceparent to make the events emitted its children."""
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"

    def end(self, service):
        """Writes the span to SPANS_FILE, if set."""
        path = os.environ.get("SPANS_FILE")
        if not path:
            return
        line = json.dumps({
            "service": service, "name": self.name, "trace_id": self.trace_id, "span_id": self.span_id,
            "parent_span_id": self.parent_span_id, "tracestate": self.tracestate, "attributes": self.attributes,
        })
        with _lock, open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
