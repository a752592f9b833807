/*-------------------------------------------------------------------------
 *
 * trace.h
 *	  W3C trace context: the settings pg_outbox.traceparent and
 *	  pg_outbox.tracestate, the validation of both values, and the trace
 *	  context of an event's headers.
 *
 * emit.c takes an event's trace context from its headers or the settings;
 * consume.c passes an entry's to its handler and sets the settings while
 * it runs. trace.c calls nothing of pg_outbox.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_TRACE_H
#define OUTBOX_TRACE_H

#include "utils/jsonb.h"

/* The largest tracestate, in bytes, and its most list-members. */
#define OUTBOX_TRACESTATE_MAX_LEN		512
#define OUTBOX_TRACESTATE_MAX_MEMBERS	32
/* The length of a traceparent of version 00. */
#define OUTBOX_TRACEPARENT_LEN			55

/* pg_outbox.traceparent and pg_outbox.tracestate ("" when not set) */
extern char *pg_outbox_traceparent;
extern char *pg_outbox_tracestate;

extern void OutboxTraceInit(void);
extern const char *OutboxTraceparentFault(const char *s, int len);
extern const char *OutboxTracestateFault(const char *s, int len);
extern bool OutboxTraceOfHeaders(Jsonb *headers, text **traceparent, text **tracestate);
extern Jsonb *OutboxTraceObject(const char *traceparent, const char *tracestate);

#endif							/* OUTBOX_TRACE_H */
