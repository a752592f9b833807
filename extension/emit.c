/*-------------------------------------------------------------------------
 *
 * emit.c
 *	  outbox_emit() and outbox_emit_many(): write events in the caller's
 *	  transaction.
 *
 * An event row carries the caller's top-level transaction id (also when
 * emitted inside a savepoint or an exception block) and a sequence number
 * that orders the events of that transaction. (txid, seq) is the event's
 * position in the feed. The sequence number comes from a backend-local
 * counter: a transaction runs in one backend, so it only has to grow within
 * one transaction id, and no shared sequence is touched on the hot path.
 *
 * Rows go straight into the partition that holds the transaction id,
 * through writer.c, the way COPY writes them. Callers need EXECUTE on the
 * function, not INSERT on the table, so nobody can write a row with a
 * forged position.
 *
 * This file keeps the SQL API and its argument checks: every argument is
 * checked before anything is written. pg_outbox.max_payload_size is
 * defined here because only these checks read it.
 *
 * An event's trace context (W3C traceparent and tracestate, two keys of its
 * headers) comes from the caller's headers when they have a "traceparent",
 * else from the settings pg_outbox.traceparent and pg_outbox.tracestate
 * (trace.c), else there is none and the headers are left as given. A value
 * that is not valid, and the settings' trace context where it would make
 * the event too large, is dropped with one warning per call (OB006), never
 * an error: a trace must not roll back the business transaction.
 *
 * Layering: emit.c calls writer.c to write the rows, xact.c to note that
 * the transaction emitted (xact.c then runs the commit steps), pack.c for
 * the size of a payload as JSON text, trace.c for the trace context, and
 * tables.c for the columns; nothing calls into it but fmgr and _PG_init.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "tcop/utility.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"
#include "utils/xid8.h"

#include "emit.h"
#include "pack.h"
#include "sqlstates.h"
#include "tables.h"
#include "trace.h"
#include "writer.h"
#include "xact.h"

/* Limits of an event's identity fields, in bytes. */
#define OUTBOX_MAX_TOPIC_LEN	255
#define OUTBOX_MAX_KEY_LEN		1024

/* pg_outbox.max_payload_size, in bytes */
#define OUTBOX_DEFAULT_MAX_PAYLOAD_SIZE (1024 * 1024)
#define OUTBOX_MIN_MAX_PAYLOAD_SIZE		1024
#define OUTBOX_MAX_MAX_PAYLOAD_SIZE		OUTBOX_MAX_EVENT_TEXT

PG_FUNCTION_INFO_V1(outbox_emit);
PG_FUNCTION_INFO_V1(outbox_emit_many);

/* pg_outbox.max_payload_size */
static int	pg_outbox_max_payload_size = OUTBOX_DEFAULT_MAX_PAYLOAD_SIZE;

/* Sequence numbers within the current top-level transaction. */
static FullTransactionId SeqFxid = {0};
static int64 SeqLast = 0;

/*
 * Random bytes for event ids, drawn from pg_strong_random() a pool at a
 * time: a call costs microseconds whatever its size (with OpenSSL, most of
 * an emit's CPU when made per event), and an event id needs ten bytes.
 * The pool belongs to the backend that filled it: one inherited across
 * fork would hand out the same ids in two processes.
 */
#define OUTBOX_RANDOM_POOL_SIZE 4096
static uint8 RandomPool[OUTBOX_RANDOM_POOL_SIZE];
static int	RandomPoolLeft = 0;
static int	RandomPoolPid = 0;

/* Defines pg_outbox.max_payload_size; called once from _PG_init. */
void
OutboxEmitInit(void)
{
	DefineCustomIntVariable("pg_outbox.max_payload_size",
							"Largest event payload outbox_emit() accepts.",
							"Payload and headers together, in bytes, both as stored (jsonb) and as JSON text (as the relay publishes them).",
							&pg_outbox_max_payload_size,
							OUTBOX_DEFAULT_MAX_PAYLOAD_SIZE,
							OUTBOX_MIN_MAX_PAYLOAD_SIZE,
							OUTBOX_MAX_MAX_PAYLOAD_SIZE,
							PGC_SUSET,
							GUC_UNIT_BYTE,
							NULL, NULL, NULL);
}

/* Refuses emission where no row can be written. */
static void
OutboxCheckWritable(void)
{
	PreventCommandIfReadOnly("outbox_emit()");
	PreventCommandIfParallelMode("outbox_emit()");
	PreventCommandDuringRecovery("outbox_emit()");
}

/*
 * Reserves "count" sequence numbers in the current top-level transaction and
 * returns the one before the first. Assigns the transaction id if needed.
 */
static int64
OutboxReserveSeq(FullTransactionId fxid, int count)
{
	int64		before;

	if (!FullTransactionIdEquals(fxid, SeqFxid))
	{
		SeqFxid = fxid;
		SeqLast = 0;
	}
	before = SeqLast;
	SeqLast += count;
	return before;
}

/* Copies "n" bytes, never handed out before, from the random pool. */
static void
OutboxRandomBytes(uint8 *dst, int n)
{
	Assert(n <= OUTBOX_RANDOM_POOL_SIZE);
	if (RandomPoolPid != MyProcPid || RandomPoolLeft < n)
	{
		if (!pg_strong_random(RandomPool, OUTBOX_RANDOM_POOL_SIZE))
			ereport(ERROR,
					(errcode(ERRCODE_INTERNAL_ERROR),
					 errmsg("could not generate random values")));
		RandomPoolLeft = OUTBOX_RANDOM_POOL_SIZE;
		RandomPoolPid = MyProcPid;
	}
	memcpy(dst, RandomPool + OUTBOX_RANDOM_POOL_SIZE - RandomPoolLeft, n);
	RandomPoolLeft -= n;
}

/*
 * A time-ordered (version 7) UUID: 48 bits of Unix milliseconds, then 74
 * random bits (the other 6 are the version and the variant). Time-ordered
 * ids keep the inbox's (consumer, event_id) index appending at its right
 * edge instead of writing all over it.
 */
static void
OutboxNewEventId(pg_uuid_t *uuid, TimestampTz now)
{
	uint64		unix_ms;
	int			i;

	unix_ms = (uint64) (now / 1000) +
		(uint64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY * 1000;

	OutboxRandomBytes(uuid->data + 6, UUID_LEN - 6);
	for (i = 0; i < 6; i++)
		uuid->data[i] = (unsigned char) (unix_ms >> (40 - 8 * i));
	uuid->data[6] = (uuid->data[6] & 0x0f) | 0x70;	/* version 7 */
	uuid->data[8] = (uuid->data[8] & 0x3f) | 0x80;	/* RFC 4122 variant */
}

/* Checks a topic: not empty, not too long. NULL is checked by the caller. */
static void
OutboxCheckTopic(text *topic)
{
	int			len = VARSIZE_ANY_EXHDR(topic);

	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("topic must not be empty")));
	if (len > OUTBOX_MAX_TOPIC_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("topic is too long"),
				 errdetail("The topic is %d bytes; the limit is %d bytes.",
						   len, OUTBOX_MAX_TOPIC_LEN)));
}

/* Checks a key's length; "element" is 0 for a scalar, else the array index. */
static void
OutboxCheckKey(text *key, int element)
{
	int			len = VARSIZE_ANY_EXHDR(key);

	if (len > OUTBOX_MAX_KEY_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 element ? errmsg("key %d is too long", element) : errmsg("key is too long"),
				 errdetail("The key is %d bytes; the limit is %d bytes.",
						   len, OUTBOX_MAX_KEY_LEN)));
}

/*
 * Checks an event's size, payload and headers together (the relay writes
 * both into one stream entry), against pg_outbox.max_payload_size: as
 * stored (jsonb), and as JSON text, which is what the relay fetches and
 * publishes. The two differ both ways: jsonb stores 1e131071 in a dozen
 * bytes and prints it with 131,072 digits, so that an event of a few
 * kilobytes could print as a gigabyte, a batch that no fetch can build.
 * The text's size is computed from the value's entries without printing
 * it (pack.c). "headers" may be NULL; "element" is 0 for a scalar, else
 * the array index.
 */
static void
OutboxCheckSize(Jsonb *payload, Jsonb *headers, int element)
{
	Size		size = VARSIZE(payload);
	Size		hsize = headers ? VARSIZE(headers) : 0;
	uint64		text_size;

	if (size + hsize > (Size) pg_outbox_max_payload_size)
	{
		if (headers == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 element ? errmsg("payload %d is too large", element) : errmsg("payload is too large"),
					 errdetail("The payload is %zu bytes as jsonb; pg_outbox.max_payload_size is %d bytes.",
							   size, pg_outbox_max_payload_size),
					 errhint("Store large content elsewhere and emit a reference to it, or raise pg_outbox.max_payload_size.")));
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 element ? errmsg("payload and headers %d are too large", element) : errmsg("payload and headers are too large"),
				 errdetail("The payload is %zu bytes and the headers are %zu bytes as jsonb; pg_outbox.max_payload_size, which counts both, is %d bytes.",
						   size, hsize, pg_outbox_max_payload_size),
				 errhint("Store large content elsewhere and emit a reference to it, or raise pg_outbox.max_payload_size.")));
	}

	text_size = OutboxEventTextSize(payload, headers, (uint64) pg_outbox_max_payload_size);
	if (text_size <= (uint64) pg_outbox_max_payload_size)
		return;
	if (headers == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 element ? errmsg("payload %d is too large", element) : errmsg("payload is too large"),
				 errdetail("The payload is %zu bytes as jsonb but prints as " UINT64_FORMAT " bytes of JSON text, as the relay publishes it; pg_outbox.max_payload_size is %d bytes.",
						   size, text_size, pg_outbox_max_payload_size),
				 errhint("A number prints with every digit (1e1000 as 1001 bytes), a control character in a string as 6 bytes: store such content elsewhere and emit a reference to it, or raise pg_outbox.max_payload_size.")));
	ereport(ERROR,
			(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
			 element ? errmsg("payload and headers %d are too large", element) : errmsg("payload and headers are too large"),
			 errdetail("The payload and headers are %zu bytes as jsonb but print as " UINT64_FORMAT " bytes of JSON text, as the relay publishes them; pg_outbox.max_payload_size, which counts both, is %d bytes.",
					   size + hsize, text_size, pg_outbox_max_payload_size),
			 errhint("A number prints with every digit (1e1000 as 1001 bytes), a control character in a string as 6 bytes: store such content elsewhere and emit a reference to it, or raise pg_outbox.max_payload_size.")));
}

/*
 * Whether an event fits pg_outbox.max_payload_size, as OutboxCheckSize()
 * counts, without raising.
 */
static bool
OutboxFitsSize(Jsonb *payload, Jsonb *headers)
{
	Size		size = VARSIZE(payload) + (headers ? VARSIZE(headers) : 0);

	if (size > (Size) pg_outbox_max_payload_size)
		return false;
	return OutboxEventTextSize(payload, headers, (uint64) pg_outbox_max_payload_size) <=
		(uint64) pg_outbox_max_payload_size;
}

/*
 * The trace context of one call: the settings' (read at the first event
 * that uses them) and the first value dropped, for the call's one warning.
 */
typedef struct EmitTrace
{
	bool		settings_read;
	Jsonb	   *settings;		/* {"traceparent", "tracestate"?}, or NULL */
	char	   *dropped;		/* the warning's detail, or NULL */
} EmitTrace;

/* Notes a dropped value: "what" and "why" make the warning's detail. */
static void
OutboxTraceDropped(EmitTrace *trace, const char *what, const char *why)
{
	if (trace->dropped == NULL)
		trace->dropped = psprintf("%s %s.", what, why);
}

/* Whether either setting is set: a look at two strings. */
static bool
OutboxTraceSettingsSet(void)
{
	return (pg_outbox_traceparent != NULL && pg_outbox_traceparent[0] != '\0') ||
		(pg_outbox_tracestate != NULL && pg_outbox_tracestate[0] != '\0');
}

/* The settings' valid trace context as a headers object, or NULL. */
static Jsonb *
OutboxTraceSettings(EmitTrace *trace)
{
	const char *tp = pg_outbox_traceparent ? pg_outbox_traceparent : "";
	const char *ts = pg_outbox_tracestate ? pg_outbox_tracestate : "";
	const char *why;

	if (trace->settings_read)
		return trace->settings;
	trace->settings_read = true;
	if (tp[0] == '\0')
	{
		if (ts[0] != '\0')
			OutboxTraceDropped(trace, "The setting pg_outbox.tracestate", "comes without pg_outbox.traceparent");
		return NULL;
	}
	why = OutboxTraceparentFault(tp, strlen(tp));
	if (why != NULL)
	{
		OutboxTraceDropped(trace, "The setting pg_outbox.traceparent", why);
		return NULL;
	}
	if (ts[0] != '\0' && (why = OutboxTracestateFault(ts, strlen(ts))) != NULL)
	{
		OutboxTraceDropped(trace, "The setting pg_outbox.tracestate", why);
		ts = "";
	}
	trace->settings = OutboxTraceObject(tp, ts[0] != '\0' ? ts : NULL);
	return trace->settings;
}

/* Names a key of an event's headers in the warning's detail. */
static char *
OutboxTraceWhat(const char *key, int element)
{
	return element ? psprintf("The \"%s\" of headers %d", key, element) : psprintf("The \"%s\" of the headers", key);
}

/* headers without "key". */
static Jsonb *
OutboxHeadersWithout(Jsonb *headers, const char *key)
{
	return DatumGetJsonbP(DirectFunctionCall2(jsonb_delete, JsonbPGetDatum(headers), CStringGetTextDatum(key)));
}

/*
 * Why a value of the headers is not a valid traceparent (is_parent) or
 * tracestate, or NULL.
 */
static const char *
OutboxTraceValueFault(JsonbValue *v, bool is_parent)
{
	if (v->type != jbvString)
		return "is not a JSON string";
	return is_parent ? OutboxTraceparentFault(v->val.string.val, v->val.string.len) :
		OutboxTracestateFault(v->val.string.val, v->val.string.len);
}

/*
 * An event's headers (an object, or NULL) with its trace context: without
 * the values that are not valid, and with the settings' trace context
 * when the headers have no "traceparent" and it fits. "element" is 0 for
 * a scalar, else the array index.
 */
static Jsonb *
OutboxEmitTrace(EmitTrace *trace, Jsonb *payload, Jsonb *headers, int element)
{
	Jsonb	   *settings;
	Jsonb	   *with;

	if (headers != NULL)
	{
		JsonbValue	buf;
		JsonbValue *v;
		const char *why;

		v = getKeyJsonValueFromContainer(&headers->root, "traceparent", strlen("traceparent"), &buf);
		if (v != NULL)
		{
			/* The headers are the source: the settings are not read. */
			why = OutboxTraceValueFault(v, true);
			if (why != NULL)
			{
				OutboxTraceDropped(trace, OutboxTraceWhat("traceparent", element), why);
				headers = OutboxHeadersWithout(OutboxHeadersWithout(headers, "traceparent"), "tracestate");
				return headers;
			}
			v = getKeyJsonValueFromContainer(&headers->root, "tracestate", strlen("tracestate"), &buf);
			if (v != NULL && (why = OutboxTraceValueFault(v, false)) != NULL)
			{
				OutboxTraceDropped(trace, OutboxTraceWhat("tracestate", element), why);
				headers = OutboxHeadersWithout(headers, "tracestate");
			}
			return headers;
		}
		v = getKeyJsonValueFromContainer(&headers->root, "tracestate", strlen("tracestate"), &buf);
		if (v != NULL)
		{
			OutboxTraceDropped(trace, OutboxTraceWhat("tracestate", element), "comes without a \"traceparent\"");
			headers = OutboxHeadersWithout(headers, "tracestate");
		}
	}
	if (!OutboxTraceSettingsSet())
		return headers;
	settings = OutboxTraceSettings(trace);
	if (settings == NULL)
		return headers;
	with = headers == NULL ? settings :
		DatumGetJsonbP(DirectFunctionCall2(jsonb_concat, JsonbPGetDatum(headers), JsonbPGetDatum(settings)));
	if (OutboxFitsSize(payload, with))
		return with;
	if (OutboxFitsSize(payload, headers))
		OutboxTraceDropped(trace, "The setting pg_outbox.traceparent", "would make the event larger than pg_outbox.max_payload_size");
	return headers;
}

/* The call's one warning, when it dropped trace context. */
static void
OutboxTraceWarn(EmitTrace *trace)
{
	if (trace->dropped != NULL)
		ereport(WARNING,
				(errcode(ERRCODE_OUTBOX_TRACE_CONTEXT_DROPPED),
				 errmsg("trace context dropped"),
				 errdetail_internal("%s", trace->dropped)));
}

/* Checks that headers are a JSON object. */
static void
OutboxCheckHeaders(Jsonb *headers, int element)
{
	if (!JB_ROOT_IS_OBJECT(headers))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 element ? errmsg("headers %d must be a JSON object", element) : errmsg("headers must be a JSON object"),
				 errhint("Pass NULL for no headers.")));
}

/*
 * outbox_emit(topic text, key text, payload jsonb, headers jsonb, event_id uuid)
 *
 * Writes one event in the current transaction and returns its event id.
 */
Datum
outbox_emit(PG_FUNCTION_ARGS)
{
	Datum		values[1][EVENT_NATTS];
	bool		nulls[1][EVENT_NATTS] = {{false}};
	text	   *topic;
	Jsonb	   *payload;
	Jsonb	   *headers = NULL;
	pg_uuid_t  *event_id;
	FullTransactionId fxid;
	TimestampTz now;
	EmitTrace	trace = {false, NULL, NULL};

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("topic must not be null")));
	topic = PG_GETARG_TEXT_PP(0);
	OutboxCheckTopic(topic);

	if (PG_ARGISNULL(1))
		nulls[0][EVENT_KEY] = true;
	else
	{
		text	   *key = PG_GETARG_TEXT_PP(1);

		OutboxCheckKey(key, 0);
		values[0][EVENT_KEY] = PointerGetDatum(key);
	}

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("payload must not be null"),
				 errhint("Use '{}' or 'null'::jsonb for an event without a payload.")));
	payload = PG_GETARG_JSONB_P(2);

	if (PG_ARGISNULL(3))
		nulls[0][EVENT_HEADERS] = true;
	else
	{
		headers = PG_GETARG_JSONB_P(3);
		OutboxCheckHeaders(headers, 0);
	}
	if (headers != NULL || OutboxTraceSettingsSet())
		headers = OutboxEmitTrace(&trace, payload, headers, 0);
	if (headers != NULL)
	{
		nulls[0][EVENT_HEADERS] = false;
		values[0][EVENT_HEADERS] = PointerGetDatum(headers);
	}
	OutboxCheckSize(payload, headers, 0);
	OutboxTraceWarn(&trace);

	OutboxCheckWritable();

	now = GetCurrentTimestamp();
	if (PG_ARGISNULL(4))
	{
		event_id = palloc(sizeof(pg_uuid_t));
		OutboxNewEventId(event_id, now);
	}
	else
		event_id = PG_GETARG_UUID_P(4);

	fxid = GetTopFullTransactionId();

	values[0][EVENT_TXID] = FullTransactionIdGetDatum(fxid);
	values[0][EVENT_SEQ] = Int64GetDatum(OutboxReserveSeq(fxid, 1) + 1);
	values[0][EVENT_EVENT_ID] = UUIDPGetDatum(event_id);
	values[0][EVENT_TOPIC] = PointerGetDatum(topic);
	values[0][EVENT_PAYLOAD] = PointerGetDatum(payload);
	values[0][EVENT_CREATED_AT] = TimestampTzGetDatum(now);

	OutboxWriteEvents(fxid, values[0], nulls[0], 1);
	OutboxXactEmitted();

	PG_RETURN_UUID_P(event_id);
}

/* Deconstructs a one-dimensional array argument; "name" is for errors. */
static int
OutboxDeconstruct(ArrayType *array, const char *name, Oid elemtype,
				  Datum **elems, bool **elemnulls)
{
	int16		typlen;
	bool		typbyval;
	char		typalign;
	int			n;

	if (ARR_NDIM(array) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a one-dimensional array", name)));
	get_typlenbyvalalign(elemtype, &typlen, &typbyval, &typalign);
	deconstruct_array(array, elemtype, typlen, typbyval, typalign, elems, elemnulls, &n);
	return n;
}

/* Raises the error for arrays of different lengths. */
static void
OutboxCheckLength(const char *name, int n, int expected)
{
	if (n != expected)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s has %d elements, payloads has %d", name, n, expected),
				 errdetail("The arrays of outbox_emit_many() are read in parallel and must have the same length.")));
}

/*
 * outbox_emit_many(topic text, keys text[], payloads jsonb[], headers jsonb[],
 *					event_ids uuid[])
 *
 * Writes one event per element of payloads and returns their event ids in
 * order. keys, headers and event_ids may be NULL (all NULL) or arrays as
 * long as payloads; a NULL event id is generated. Every element is checked
 * before anything is written.
 */
Datum
outbox_emit_many(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Datum		(*values)[EVENT_NATTS];
	bool		(*nulls)[EVENT_NATTS];
	text	   *topic;
	Datum	   *payloads;
	bool	   *payload_nulls;
	int			n;
	int			i;
	int64		seq;
	FullTransactionId fxid;
	TimestampTz now;
	EmitTrace	trace = {false, NULL, NULL};

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("topic must not be null")));
	topic = PG_GETARG_TEXT_PP(0);
	OutboxCheckTopic(topic);

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("payloads must not be null")));
	n = OutboxDeconstruct(PG_GETARG_ARRAYTYPE_P(2), "payloads", JSONBOID,
						  &payloads, &payload_nulls);

	values = palloc(sizeof(*values) * Max(n, 1));
	nulls = palloc0(sizeof(*nulls) * Max(n, 1));
	now = GetCurrentTimestamp();

	for (i = 0; i < n; i++)
	{
		if (payload_nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("payload %d must not be null", i + 1),
					 errhint("Use '{}' or 'null'::jsonb for an event without a payload.")));
		values[i][EVENT_PAYLOAD] = payloads[i];
		values[i][EVENT_TOPIC] = PointerGetDatum(topic);
		values[i][EVENT_CREATED_AT] = TimestampTzGetDatum(now);
		nulls[i][EVENT_KEY] = true;
		nulls[i][EVENT_HEADERS] = true;
		nulls[i][EVENT_EVENT_ID] = true;
	}

	if (!PG_ARGISNULL(1))
	{
		Datum	   *keys;
		bool	   *key_nulls;

		OutboxCheckLength("keys", OutboxDeconstruct(PG_GETARG_ARRAYTYPE_P(1), "keys", TEXTOID,
													&keys, &key_nulls), n);
		for (i = 0; i < n; i++)
		{
			if (key_nulls[i])
				continue;
			OutboxCheckKey(DatumGetTextPP(keys[i]), i + 1);
			values[i][EVENT_KEY] = keys[i];
			nulls[i][EVENT_KEY] = false;
		}
	}

	if (!PG_ARGISNULL(3))
	{
		Datum	   *headers;
		bool	   *header_nulls;

		OutboxCheckLength("headers", OutboxDeconstruct(PG_GETARG_ARRAYTYPE_P(3), "headers", JSONBOID,
													   &headers, &header_nulls), n);
		for (i = 0; i < n; i++)
		{
			if (header_nulls[i])
				continue;
			OutboxCheckHeaders(DatumGetJsonbP(headers[i]), i + 1);
			values[i][EVENT_HEADERS] = headers[i];
			nulls[i][EVENT_HEADERS] = false;
		}
	}
	for (i = 0; i < n; i++)
	{
		Jsonb	   *h = nulls[i][EVENT_HEADERS] ? NULL : DatumGetJsonbP(values[i][EVENT_HEADERS]);

		if (h == NULL && !OutboxTraceSettingsSet())
			continue;
		h = OutboxEmitTrace(&trace, DatumGetJsonbP(values[i][EVENT_PAYLOAD]), h, i + 1);
		nulls[i][EVENT_HEADERS] = h == NULL;
		values[i][EVENT_HEADERS] = h == NULL ? (Datum) 0 : JsonbPGetDatum(h);
	}
	for (i = 0; i < n; i++)
		OutboxCheckSize(DatumGetJsonbP(values[i][EVENT_PAYLOAD]),
						nulls[i][EVENT_HEADERS] ? NULL : DatumGetJsonbP(values[i][EVENT_HEADERS]),
						i + 1);
	OutboxTraceWarn(&trace);

	if (!PG_ARGISNULL(4))
	{
		Datum	   *given;
		bool	   *given_nulls;

		OutboxCheckLength("event_ids", OutboxDeconstruct(PG_GETARG_ARRAYTYPE_P(4), "event_ids", UUIDOID,
														 &given, &given_nulls), n);
		for (i = 0; i < n; i++)
		{
			if (given_nulls[i])
				continue;
			values[i][EVENT_EVENT_ID] = given[i];
			nulls[i][EVENT_EVENT_ID] = false;
		}
	}

	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	if (n == 0)
		return (Datum) 0;

	OutboxCheckWritable();
	fxid = GetTopFullTransactionId();
	seq = OutboxReserveSeq(fxid, n);

	for (i = 0; i < n; i++)
	{
		if (nulls[i][EVENT_EVENT_ID])
		{
			pg_uuid_t  *id = palloc(sizeof(pg_uuid_t));

			OutboxNewEventId(id, now);
			values[i][EVENT_EVENT_ID] = UUIDPGetDatum(id);
			nulls[i][EVENT_EVENT_ID] = false;
		}
		values[i][EVENT_TXID] = FullTransactionIdGetDatum(fxid);
		values[i][EVENT_SEQ] = Int64GetDatum(seq + i + 1);
	}

	OutboxWriteEvents(fxid, values[0], nulls[0], n);
	OutboxXactEmitted();

	for (i = 0; i < n; i++)
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc,
							 &values[i][EVENT_EVENT_ID], &nulls[i][EVENT_EVENT_ID]);
	return (Datum) 0;
}
