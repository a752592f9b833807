-- W3C trace context: why a traceparent or tracestate is not valid
-- (extension/trace.c; the SQL engine's decide alike, with the same words).
CREATE FUNCTION outbox.traceparent_fault(value text)
RETURNS text
AS 'MODULE_PATHNAME', 'outbox_traceparent_fault'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION outbox.traceparent_fault(text) IS
	'pg_outbox: why a value is not a valid W3C traceparent (version 00), or NULL when it is';

CREATE FUNCTION outbox.tracestate_fault(value text)
RETURNS text
AS 'MODULE_PATHNAME', 'outbox_tracestate_fault'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION outbox.tracestate_fault(text) IS
	'pg_outbox: why a value is not a valid W3C tracestate, or NULL when it is';
