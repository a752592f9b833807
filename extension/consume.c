/*-------------------------------------------------------------------------
 *
 * consume.c
 *	  inbox_consume(): a batch of stream entries applied through the inbox
 *	  and a handler, in one transaction and without a subtransaction per
 *	  entry.
 *
 * A consumer applies what it reads from a stream in batches. Applying each
 * entry in a subtransaction of its own (an exception block) isolates a bad
 * entry, but every entry that writes then takes a transaction id of its
 * own, and a transaction with more than 64 subtransactions overflows its
 * backend's cache, which sends visibility checks of every snapshot in the
 * cluster to pg_subtrans while it runs. So a batch applies as one:
 *
 *	1. Each entry's fields (bytes, as the stream holds them) are checked
 *	   without raising anything: UTF-8 without NUL bytes, an event id that
 *	   is a uuid, JSON that parses (PostgreSQL's own lexer, which reports
 *	   its errors instead of raising them). An entry that fails is
 *	   "malformed", with the SQLSTATE and message the cast would give.
 *	2. The inbox records the events of the well-formed entries with a
 *	   lookup and one insert (outbox.inbox_record(), below): each comes
 *	   back new, a duplicate (same payload applied before) or a conflict
 *	   (another payload under its id, OB001). Nothing raises.
 *	3. The handler runs for each new event, in the order of the entries,
 *	   as one prepared statement (kept for the calls that follow).
 *
 * What can still raise (a failing handler; a number beyond numeric's range
 * or JSON nested beyond the stack, which only the conversion to jsonb
 * finds) aborts the call. The caller then calls again with isolate =>
 * true, on parts of at most OUTBOX_CONSUME_ISOLATE_MAX entries: each entry
 * then applies in its own subtransaction and is reported alone ("failed",
 * or "malformed" when its conversion raised), as inbox_consume() always
 * did. The relay does exactly that, so the happy path of a batch takes one
 * transaction id and no subtransaction, and no path takes more than
 * OUTBOX_CONSUME_ISOLATE_MAX subtransactions in one transaction.
 *
 * The handler runs as the caller, with the caller's search_path: this
 * function is neither SECURITY DEFINER nor has it a SET clause. The inbox,
 * which consumers may not touch, is written by outbox.inbox_record(),
 * SECURITY DEFINER with its search_path pinned and granted to nobody,
 * called through fmgr after the consumer check, as inbox.c calls the
 * *_unchecked bodies.
 *
 * inbox_record() must find an event applied by a concurrent transaction in
 * whichever daily partition of outbox.inbox holds it (the unique index is
 * per partition). It serializes the applies of one event with the inbox
 * lock (locks.h), taken for the events of a batch in the order of their
 * keys, so that two batches sharing events wait for each other instead of
 * deadlocking, and then looks: in the partitions that hold rows, but for
 * the one where rows go now, which the insert itself checks (ON CONFLICT
 * DO NOTHING), so that each event costs one probe of the partition that
 * grows. At READ COMMITTED the look takes a new snapshot and sees the
 * other's commit. At
 * REPEATABLE READ and SERIALIZABLE the transaction's snapshot may predate
 * that commit: the look then also reads with the latest snapshot, as the RI
 * triggers do, and a row found only there is a serialization failure, so
 * that the client retries and then sees the event as applied, instead of a
 * unique violation on the same day or a second apply on another day.
 *
 * Layering: consume.c calls inbox.c (the consumer check), locks.c (the
 * inbox lock), trace.c (the entries' trace context) and tables.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/table.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "common/jsonapi.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "parser/parse_func.h"
#include "partitioning/partbounds.h"
#include "partitioning/partdesc.h"
#include "storage/bufmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/partcache.h"
#include "utils/rel.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "consume.h"
#include "inbox.h"
#include "locks.h"
#include "sqlstates.h"
#include "tables.h"
#include "trace.h"

/* The fields of an entry, in the order they are decoded. */
typedef enum EntryField
{
	FIELD_EVENT_ID,
	FIELD_TOPIC,
	FIELD_KEY,
	FIELD_PAYLOAD,
	FIELD_HEADERS,
	FIELD_COUNT
} EntryField;

static const char *const field_names[FIELD_COUNT] = {"event_id", "topic", "key", "payload", "headers"};

/* Whether a field may be absent (NULL). */
static const bool field_optional[FIELD_COUNT] = {false, false, true, false, true};

/* One entry of a batch, as it is decoded and applied. */
typedef struct Entry
{
	bytea	   *raw[FIELD_COUNT];	/* the fields as received; NULL: absent */
	char	   *text[FIELD_COUNT];	/* checked: in the server encoding */
	int			len[FIELD_COUNT];
	pg_uuid_t	id;
	Datum		topic,
				key,
				payload,
				headers;		/* decoded (key and headers may be NULL) */
	bool		well_formed;	/* every field checked */
	int			decoding;		/* the field being converted, or -1 */
	bool		decoded;		/* every field converted */
	const char *status;			/* the result, once known */
	char	   *error_code;
	char	   *error_message;
} Entry;

/* What a field's check found wrong, as the cast would have raised it. */
typedef struct FieldFault
{
	int			sqlerrcode;
	char	   *message;
} FieldFault;

PG_FUNCTION_INFO_V1(outbox_inbox_consume);
PG_FUNCTION_INFO_V1(outbox_inbox_record);

/* "message (detail)", the form inbox_consume() reports an error in. */
static char *
OutboxErrorText(const char *message, const char *detail)
{
	if (detail == NULL || detail[0] == '\0')
		return pstrdup(message);
	return psprintf("%s (%s)", message, detail);
}

/*
 * Checks that bytes are UTF-8 without NUL bytes (as convert_from() does);
 * on failure fills *fault with convert_from()'s error.
 */
static bool
OutboxCheckUtf8(const char *s, int len, FieldFault *fault)
{
	int			valid = pg_encoding_verifymbstr(PG_UTF8, s, len);
	StringInfoData bytes;
	int			n;

	if (valid == len)
		return true;
	/* The bytes of the offending character, as report_invalid_encoding(). */
	n = Min(Min(pg_encoding_mblen(PG_UTF8, s + valid), len - valid), 8);
	initStringInfo(&bytes);
	for (int i = 0; i < n; i++)
		appendStringInfo(&bytes, i == 0 ? "0x%02x" : " 0x%02x", (unsigned char) s[valid + i]);
	fault->sqlerrcode = ERRCODE_CHARACTER_NOT_IN_REPERTOIRE;
	fault->message = psprintf("invalid byte sequence for encoding \"%s\": %s", "UTF8", bytes.data);
	return false;
}

/* The value of a hex digit. */
static int
OutboxHexValue(char c)
{
	return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10;
}

/*
 * Parses a uuid as uuid_in() does (hex digits in pairs, optionally a hyphen
 * after any group of four, optionally in braces), without raising.
 */
static bool
OutboxParseUuid(const char *s, pg_uuid_t *uuid, FieldFault *fault)
{
	const char *p = s;
	bool		braces = false;

	if (*p == '{')
	{
		p++;
		braces = true;
	}
	for (int i = 0; i < UUID_LEN; i++)
	{
		if (!isxdigit((unsigned char) p[0]) || !isxdigit((unsigned char) p[1]))
			goto bad;
		uuid->data[i] = (unsigned char) ((OutboxHexValue(p[0]) << 4) | OutboxHexValue(p[1]));
		p += 2;
		if (p[0] == '-' && (i % 2) == 1 && i < UUID_LEN - 1)
			p++;
	}
	if (braces)
	{
		if (*p != '}')
			goto bad;
		p++;
	}
	if (*p == '\0')
		return true;
bad:
	fault->sqlerrcode = ERRCODE_INVALID_TEXT_REPRESENTATION;
	fault->message = psprintf("invalid input syntax for type %s: \"%s\"", "uuid", s);
	return false;
}

/*
 * Checks that text is JSON, with the lexer and parser jsonb_in() uses,
 * which report their errors instead of raising them; on failure fills
 * *fault as json_ereport_error() would raise it. Where the text has a \u
 * escape, escapes are decoded, so that \u0000 (which text cannot hold) and
 * lone surrogates are found. What the lexer still raises (a \u escape the
 * server encoding cannot hold, nesting beyond the stack) raises here. The
 * parser's memory is in "scratch", reset after each check.
 */
static bool
OutboxCheckJson(char *s, int len, MemoryContext scratch, FieldFault *fault)
{
	MemoryContext caller = MemoryContextSwitchTo(scratch);
	bool		escapes = memchr(s, '\\', len) != NULL && strstr(s, "\\u") != NULL;
	JsonLexContext *lex = makeJsonLexContextCstringLen(s, len, GetDatabaseEncoding(), escapes);
	JsonParseErrorType error = pg_parse_json(lex, &nullSemAction);
	char	   *detail = error == JSON_SUCCESS ? NULL : json_errdetail(error, lex);

	MemoryContextSwitchTo(caller);
	if (error == JSON_UNICODE_HIGH_ESCAPE || error == JSON_UNICODE_CODE_POINT_ZERO)
	{
		fault->sqlerrcode = ERRCODE_UNTRANSLATABLE_CHARACTER;
		fault->message = OutboxErrorText("unsupported Unicode escape sequence", detail);
	}
	else if (error != JSON_SUCCESS)
	{
		fault->sqlerrcode = ERRCODE_INVALID_TEXT_REPRESENTATION;
		fault->message = OutboxErrorText("invalid input syntax for type json", detail);
	}
	MemoryContextReset(scratch);
	return error == JSON_SUCCESS;
}

/* Marks an entry malformed by a fault of one of its fields. */
static void
OutboxEntryMalformed(Entry *e, EntryField f, int sqlerrcode, const char *message)
{
	e->status = "malformed";
	e->error_code = pstrdup(unpack_sql_state(sqlerrcode));
	e->error_message = psprintf("field \"%s\": %s", field_names[f], message);
}

/*
 * Checks an entry's fields in order, without raising: the first that
 * fails makes the entry malformed. The text of each field is kept,
 * NUL-terminated; on a server that is not UTF-8 it is converted to the
 * server's encoding at decoding (which may raise).
 */
static void
OutboxEntryCheck(Entry *e, MemoryContext scratch)
{
	FieldFault fault;

	for (int f = 0; f < FIELD_COUNT; f++)
	{
		bytea	   *raw = e->raw[f];
		int			len;

		if (raw == NULL)
		{
			if (field_optional[f])
				continue;
			OutboxEntryMalformed(e, f, ERRCODE_NULL_VALUE_NOT_ALLOWED, "the entry has no such field");
			return;
		}
		len = VARSIZE_ANY_EXHDR(raw);
		if (!OutboxCheckUtf8(VARDATA_ANY(raw), len, &fault))
		{
			OutboxEntryMalformed(e, f, fault.sqlerrcode, fault.message);
			return;
		}
		e->text[f] = text_to_cstring((text *) raw);
		e->len[f] = len;
		if (f == FIELD_EVENT_ID && !OutboxParseUuid(e->text[f], &e->id, &fault))
		{
			OutboxEntryMalformed(e, f, fault.sqlerrcode, fault.message);
			return;
		}
		if ((f == FIELD_PAYLOAD || f == FIELD_HEADERS) && GetDatabaseEncoding() == PG_UTF8 &&
			!OutboxCheckJson(e->text[f], len, scratch, &fault))
		{
			OutboxEntryMalformed(e, f, fault.sqlerrcode, fault.message);
			return;
		}
	}
	e->well_formed = true;
}

/*
 * Converts a checked entry's fields to the handler's types. May raise for
 * what only the conversion finds (see the header); e->decoding tells which
 * field was being converted. jsonb_in() builds its value in "scratch",
 * reset once the value is copied out: what it allocates on the way is
 * many times the text, and kept for every entry until the call ended it
 * took fresh memory for the whole batch, pages the kernel had to fault in
 * again for every batch (half of the call's time for 500 entries).
 */
static void
OutboxEntryDecode(Entry *e, MemoryContext scratch)
{
	Datum	   *out[FIELD_COUNT] = {NULL, &e->topic, &e->key, &e->payload, &e->headers};

	for (int f = FIELD_TOPIC; f < FIELD_COUNT; f++)
	{
		char	   *s;

		e->decoding = f;
		if (e->text[f] == NULL)
		{
			*out[f] = (Datum) 0;
			continue;
		}
		s = pg_any_to_server(e->text[f], e->len[f], PG_UTF8);
		if (f == FIELD_PAYLOAD || f == FIELD_HEADERS)
		{
			MemoryContext caller = MemoryContextSwitchTo(scratch);
			Datum		value = DirectFunctionCall1(jsonb_in, CStringGetDatum(s));

			MemoryContextSwitchTo(caller);
			*out[f] = datumCopy(value, false, -1);
			MemoryContextReset(scratch);
		}
		else
			*out[f] = PointerGetDatum(cstring_to_text(s));
	}
	e->decoding = -1;
	e->decoded = true;
}

/* A one-dimensional bytea[] argument starting at 1, deconstructed. */
static void
OutboxConsumeArray(FunctionCallInfo fcinfo, int arg, int n, Entry *entries, EntryField f)
{
	ArrayType  *a;
	Datum	   *values;
	bool	   *nulls;
	int			count;

	if (PG_ARGISNULL(arg))
		return;
	a = PG_GETARG_ARRAYTYPE_P(arg);
	deconstruct_array(a, BYTEAOID, -1, false, TYPALIGN_INT, &values, &nulls, &count);
	Assert(count == n);
	for (int i = 0; i < count; i++)
		entries[i].raw[f] = nulls[i] ? NULL : DatumGetByteaPP(values[i]);
}

/* The number of elements of an array argument, -1 when NULL. */
static int
OutboxArrayLength(FunctionCallInfo fcinfo, int arg)
{
	ArrayType  *a;

	if (PG_ARGISNULL(arg))
		return -1;
	a = PG_GETARG_ARRAYTYPE_P(arg);
	return ArrayGetNItems(ARR_NDIM(a), ARR_DIMS(a));
}

/* Whether an array argument is NULL, empty, or one-dimensional from 1. */
static bool
OutboxArrayShapeOk(FunctionCallInfo fcinfo, int arg)
{
	ArrayType  *a;

	if (PG_ARGISNULL(arg))
		return true;
	a = PG_GETARG_ARRAYTYPE_P(arg);
	if (ArrayGetNItems(ARR_NDIM(a), ARR_DIMS(a)) == 0)
		return true;
	return ARR_NDIM(a) == 1 && ARR_LBOUND(a)[0] == 1;
}

/*
 * The arguments of inbox_consume() as a batch: the arrays of fields, of
 * equal length (keys and headers may be NULL), one-dimensional from 1.
 */
static Entry *
OutboxConsumeEntries(FunctionCallInfo fcinfo, int *count)
{
	int			n = Max(OutboxArrayLength(fcinfo, 5), 0);
	int			ids = OutboxArrayLength(fcinfo, 2);
	int			topics = OutboxArrayLength(fcinfo, 3);
	int			keys = OutboxArrayLength(fcinfo, 4);
	int			headers = OutboxArrayLength(fcinfo, 6);
	Entry	   *entries;

	if (Max(ids, 0) != n || Max(topics, 0) != n || (keys >= 0 && keys != n) || (headers >= 0 && headers != n))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("the arrays of inbox_consume() must have the same length"),
				 errhint("keys and headers may also be NULL.")));
	for (int arg = 2; arg <= 6; arg++)
		if (n > 0 && !OutboxArrayShapeOk(fcinfo, arg))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("the arrays of inbox_consume() must be one-dimensional and start at 1")));
	entries = palloc0(sizeof(Entry) * Max(n, 1));
	if (n > 0)
	{
		OutboxConsumeArray(fcinfo, 2, n, entries, FIELD_EVENT_ID);
		OutboxConsumeArray(fcinfo, 3, n, entries, FIELD_TOPIC);
		OutboxConsumeArray(fcinfo, 4, n, entries, FIELD_KEY);
		OutboxConsumeArray(fcinfo, 5, n, entries, FIELD_PAYLOAD);
		OutboxConsumeArray(fcinfo, 6, n, entries, FIELD_HEADERS);
	}
	*count = n;
	return entries;
}

/* outbox.inbox_record(), found once per call site of inbox_consume(). */
static FmgrInfo *
OutboxInboxRecordFunction(FunctionCallInfo fcinfo)
{
	FmgrInfo   *record = (FmgrInfo *) fcinfo->flinfo->fn_extra;
	Oid			types[3] = {TEXTOID, UUIDARRAYOID, JSONBARRAYOID};
	Oid			target;

	if (record != NULL)
		return record;
	target = LookupFuncName(list_make2(makeString(OUTBOX_SCHEMA), makeString("inbox_record")), 3, types, false);
	record = MemoryContextAllocZero(fcinfo->flinfo->fn_mcxt, sizeof(FmgrInfo));
	fmgr_info_cxt(target, record, fcinfo->flinfo->fn_mcxt);
	fcinfo->flinfo->fn_extra = record;
	return record;
}

/*
 * Records the well-formed, decoded entries among entries[from, to) in the
 * inbox, and sets the status of each that is a duplicate or a conflict;
 * the others (status still NULL) are new: their handler is to run.
 */
static void
OutboxConsumeRecord(FunctionCallInfo fcinfo, text *consumer, Entry *entries, int from, int to)
{
	int			n = 0;
	Datum	   *ids = palloc(sizeof(Datum) * (to - from));
	Datum	   *payloads = palloc(sizeof(Datum) * (to - from));
	int		   *which = palloc(sizeof(int) * (to - from));
	ArrayType  *applied;
	Datum	   *values;
	bool	   *nulls;
	int			count;

	for (int i = from; i < to; i++)
	{
		if (!entries[i].decoded)
			continue;
		ids[n] = UUIDPGetDatum(&entries[i].id);
		payloads[n] = entries[i].payload;
		which[n++] = i;
	}
	if (n == 0)
		return;
	applied = DatumGetArrayTypeP(FunctionCall3(OutboxInboxRecordFunction(fcinfo),
											   PointerGetDatum(consumer),
											   PointerGetDatum(construct_array(ids, n, UUIDOID, UUID_LEN, false, TYPALIGN_CHAR)),
											   PointerGetDatum(construct_array(payloads, n, JSONBOID, -1, false, TYPALIGN_INT))));
	deconstruct_array(applied, JSONBOID, -1, false, TYPALIGN_INT, &values, &nulls, &count);
	if (count != n)
		elog(ERROR, "outbox.inbox_record() returned %d payloads for %d events", count, n);
	for (int k = 0; k < n; k++)
	{
		Entry	   *e = &entries[which[k]];

		if (nulls[k])
			continue;
		if (DatumGetBool(DirectFunctionCall2(jsonb_eq, values[k], e->payload)))
		{
			e->status = "duplicate";
			continue;
		}
		e->status = "conflict";
		e->error_code = pstrdup(OUTBOX_SQLSTATE_IDENTITY_CONFLICT);
		e->error_message =
			psprintf("event %s was already applied by consumer \"%s\" with another payload (Applied payload: %s. Received payload: %s.)",
					 e->text[FIELD_EVENT_ID], text_to_cstring(consumer),
					 DatumGetCString(DirectFunctionCall1(jsonb_out, values[k])),
					 DatumGetCString(DirectFunctionCall1(jsonb_out, e->payload)));
	}
}

/*
 * The handler as one statement, prepared at its first use and kept for the
 * calls that follow with the same text, so that a worker, which passes the
 * same handler with every batch, plans it once (the plan cache plans it
 * again when what it names changes, or the search_path). Privileges are
 * checked at each execution, as the role that calls.
 */
typedef struct Handler
{
	const char *sql;
	SPIPlanPtr	plan;
} Handler;

static char *handler_sql = NULL;
static SPIPlanPtr handler_plan = NULL;

/* Names the entry whose handler raised, in the error's context. */
static void
OutboxHandlerContext(void *arg)
{
	Entry	   *e = (Entry *) arg;

	errcontext("inbox_consume() handler for event %s", e->text[FIELD_EVENT_ID]);
}

/*
 * Runs the handler for a new event, as the caller: $1 topic, $2 key, $3
 * payload, $4 headers, $5 event id, $6 the headers' valid traceparent (or
 * NULL). While it runs, pg_outbox.traceparent and pg_outbox.tracestate
 * hold the event's valid trace context (empty when none), as a function's
 * SET clause would set them: the caller's values come back after it, and
 * an error undoes them with the (sub)transaction. So an event the handler
 * emits continues the trace. Nothing is set when neither the event nor
 * the caller has a trace context.
 */
static void
OutboxRunHandler(Handler *handler, Entry *e)
{
	text	   *traceparent;
	text	   *tracestate;
	Datum		values[6];
	char		nulls[6] = {' ', e->text[FIELD_KEY] ? ' ' : 'n', ' ', e->text[FIELD_HEADERS] ? ' ' : 'n', ' ', ' '};
	ErrorContextCallback context;
	int			nest = -1;
	int			rc;

	OutboxTraceOfHeaders(e->text[FIELD_HEADERS] ? DatumGetJsonbP(e->headers) : NULL, &traceparent, &tracestate);
	values[0] = e->topic;
	values[1] = e->key;
	values[2] = e->payload;
	values[3] = e->headers;
	values[4] = UUIDPGetDatum(&e->id);
	values[5] = traceparent ? PointerGetDatum(traceparent) : (Datum) 0;
	nulls[5] = traceparent ? ' ' : 'n';
	if (traceparent != NULL ||
		(pg_outbox_traceparent != NULL && pg_outbox_traceparent[0] != '\0') ||
		(pg_outbox_tracestate != NULL && pg_outbox_tracestate[0] != '\0'))
	{
		nest = NewGUCNestLevel();
		(void) set_config_option("pg_outbox.traceparent", traceparent ? text_to_cstring(traceparent) : "",
								 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
		(void) set_config_option("pg_outbox.tracestate", tracestate ? text_to_cstring(tracestate) : "",
								 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
	}

	context.callback = OutboxHandlerContext;
	context.arg = e;
	context.previous = error_context_stack;
	error_context_stack = &context;
	if (handler->plan == NULL && handler_sql != NULL && strcmp(handler_sql, handler->sql) == 0)
		handler->plan = handler_plan;
	if (handler->plan == NULL)
	{
		Oid			types[6] = {TEXTOID, TEXTOID, JSONBOID, JSONBOID, UUIDOID, TEXTOID};
		SPIPlanPtr	plan;

		if (handler_plan != NULL)
		{
			SPI_freeplan(handler_plan);
			pfree(handler_sql);
			handler_plan = NULL;
			handler_sql = NULL;
		}
		plan = SPI_prepare(handler->sql, 6, types);
		if (plan == NULL)
			elog(ERROR, "could not prepare the handler: %s", SPI_result_code_string(SPI_result));
		if (SPI_keepplan(plan) != 0)
			elog(ERROR, "could not keep the handler's plan");
		handler_sql = MemoryContextStrdup(TopMemoryContext, handler->sql);
		handler_plan = plan;
		handler->plan = plan;
	}
	rc = SPI_execute_plan(handler->plan, values, nulls, false, 0);
	if (rc == SPI_ERROR_TRANSACTION || rc == SPI_ERROR_COPY)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("the handler cannot run in inbox_consume(): %s", SPI_result_code_string(rc)),
				 errhint("The handler runs inside the transaction that records the event in the inbox.")));
	if (rc < 0)
		elog(ERROR, "the handler failed: %s", SPI_result_code_string(rc));
	SPI_freetuptable(SPI_tuptable);
	error_context_stack = context.previous;
	if (nest >= 0)
		AtEOXact_GUC(true, nest);
}

/*
 * The batch as one: no subtransaction, one transaction id. Anything that
 * raises (a handler, a conversion) aborts the call.
 */
static void
OutboxConsumeBatch(FunctionCallInfo fcinfo, text *consumer, Handler *handler, Entry *entries, int n,
				   MemoryContext scratch)
{
	for (int i = 0; i < n; i++)
	{
		OutboxEntryCheck(&entries[i], scratch);
		if (entries[i].well_formed)
			OutboxEntryDecode(&entries[i], scratch);
	}
	OutboxConsumeRecord(fcinfo, consumer, entries, 0, n);
	for (int i = 0; i < n; i++)
	{
		Entry	   *e = &entries[i];

		if (e->status != NULL)
			continue;
		OutboxRunHandler(handler, e);
		e->status = "applied";
	}
}

/*
 * Each entry in its own subtransaction (at most OUTBOX_CONSUME_ISOLATE_MAX):
 * what raises fails its entry alone, but a cancel (a statement timeout)
 * ends the call, as an exception block of PL/pgSQL lets it. An entry found
 * malformed by its check takes none.
 */
static void
OutboxConsumeIsolated(FunctionCallInfo fcinfo, text *consumer, Handler *handler, Entry *entries, int n,
					  MemoryContext scratch)
{
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;

	for (int i = 0; i < n; i++)
	{
		Entry	   *e = &entries[i];

		OutboxEntryCheck(e, scratch);
		if (!e->well_formed)
			continue;

		BeginInternalSubTransaction(NULL);
		MemoryContextSwitchTo(cxt);
		PG_TRY();
		{
			OutboxEntryDecode(e, scratch);
			OutboxConsumeRecord(fcinfo, consumer, entries, i, i + 1);
			if (e->status == NULL)
			{
				OutboxRunHandler(handler, e);
				e->status = "applied";
			}
			ReleaseCurrentSubTransaction();
			MemoryContextSwitchTo(cxt);
			CurrentResourceOwner = owner;
		}
		PG_CATCH();
		{
			ErrorData  *edata;

			MemoryContextSwitchTo(cxt);
			edata = CopyErrorData();
			FlushErrorState();
			RollbackAndReleaseCurrentSubTransaction();
			MemoryContextSwitchTo(cxt);
			CurrentResourceOwner = owner;
			/* A cancel (statement_timeout too) ends the call, as in PL/pgSQL. */
			if (edata->sqlerrcode == ERRCODE_QUERY_CANCELED)
				ReThrowError(edata);

			if (!e->decoded)
				OutboxEntryMalformed(e, e->decoding, edata->sqlerrcode,
									 OutboxErrorText(edata->message, edata->detail));
			else
			{
				e->status = edata->sqlerrcode == ERRCODE_OUTBOX_IDENTITY_CONFLICT ? "conflict" : "failed";
				e->error_code = pstrdup(unpack_sql_state(edata->sqlerrcode));
				e->error_message = OutboxErrorText(edata->message, edata->detail);
			}
			FreeErrorData(edata);
		}
		PG_END_TRY();
	}
}

/*
 * inbox_consume(consumer text, handler text, event_ids bytea[], topics
 * bytea[], keys bytea[], payloads bytea[], headers bytea[], isolate
 * boolean DEFAULT false): applies a batch of entries and returns a row
 * (ord, status, error_code, error_message) for each.
 */
Datum
outbox_inbox_consume(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	text	   *consumer;
	Handler		handler = {NULL, NULL};
	bool		isolate;
	Entry	   *entries;
	int			n;
	MemoryContext caller;
	MemoryContext scratch;

	OutboxCheckConsumer(fcinfo, 0);
	consumer = PG_GETARG_TEXT_PP(0);
	if (PG_ARGISNULL(1) || VARSIZE_ANY_EXHDR(PG_GETARG_TEXT_PP(1)) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("handler must not be empty")));
	handler.sql = text_to_cstring(PG_GETARG_TEXT_PP(1));
	if (PG_ARGISNULL(7))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("isolate must not be null")));
	isolate = PG_GETARG_BOOL(7);
	entries = OutboxConsumeEntries(fcinfo, &n);
	if (isolate && n > OUTBOX_CONSUME_ISOLATE_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("inbox_consume() applies at most %d entries with isolate => true", OUTBOX_CONSUME_ISOLATE_MAX),
				 errdetail("The batch has %d entries. Each applies in a subtransaction, and a transaction with more than %d overflows its backend's subtransaction cache, which slows every snapshot of the cluster.",
						   n, OUTBOX_CONSUME_ISOLATE_MAX),
				 errhint("Pass the entries in parts of at most %d, each in a transaction of its own.", OUTBOX_CONSUME_ISOLATE_MAX)));

	InitMaterializedSRF(fcinfo, 0);
	caller = CurrentMemoryContext;
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	/* What the entries hold outlives SPI's own context. */
	MemoryContextSwitchTo(caller);
	scratch = AllocSetContextCreate(caller, "inbox_consume checks", ALLOCSET_DEFAULT_SIZES);
	if (isolate)
		OutboxConsumeIsolated(fcinfo, consumer, &handler, entries, n, scratch);
	else
		OutboxConsumeBatch(fcinfo, consumer, &handler, entries, n, scratch);
	MemoryContextDelete(scratch);
	SPI_finish();

	for (int i = 0; i < n; i++)
	{
		Datum		values[4];
		bool		nulls[4] = {false, false, entries[i].error_code == NULL, entries[i].error_message == NULL};

		values[0] = Int32GetDatum(i + 1);
		values[1] = CStringGetTextDatum(entries[i].status);
		values[2] = nulls[2] ? (Datum) 0 : CStringGetTextDatum(entries[i].error_code);
		values[3] = nulls[3] ? (Datum) 0 : CStringGetTextDatum(entries[i].error_message);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/* The canonical text of a uuid, as uuid_out() writes it, into buf[37]. */
static void
OutboxUuidText(const pg_uuid_t *uuid, char *buf)
{
	static const char hex[] = "0123456789abcdef";
	char	   *p = buf;

	for (int i = 0; i < UUID_LEN; i++)
	{
		if (i == 4 || i == 6 || i == 8 || i == 10)
			*p++ = '-';
		*p++ = hex[uuid->data[i] >> 4];
		*p++ = hex[uuid->data[i] & 0xF];
	}
	*p = '\0';
}

/* Orders inbox lock keys. */
static int
OutboxCompareKeys(const void *a, const void *b)
{
	uint64		x = *(const uint64 *) a;
	uint64		y = *(const uint64 *) b;

	return x < y ? -1 : x > y ? 1 : 0;
}

/* Orders event ids (the indexes of a batch's events by their id). */
static const pg_uuid_t *sort_ids;

static int
OutboxCompareIds(const void *a, const void *b)
{
	int			x = *(const int *) a;
	int			y = *(const int *) b;
	int			c = memcmp(sort_ids[x].data, sort_ids[y].data, UUID_LEN);

	return c != 0 ? c : x - y;
}

/* The position in order[] (sorted by id) of the first event with an id. */
static int
OutboxFindId(const pg_uuid_t *ids, const int *order, int n, const pg_uuid_t *id)
{
	int			lo = 0,
				hi = n;

	while (lo < hi)
	{
		int			mid = (lo + hi) / 2;

		if (memcmp(ids[order[mid]].data, id->data, UUID_LEN) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < n && memcmp(ids[order[lo]].data, id->data, UUID_LEN) == 0 ? lo : -1;
}

/* Which partitions of outbox.inbox a lookup reads. */
typedef enum InboxPartitions
{
	INBOX_OTHER_PARTITIONS,		/* all but the one rows go to now */
	INBOX_TARGET_PARTITION,		/* that one */
} InboxPartitions;

/*
 * Where a batch's lookups read: the partition of outbox.inbox rows go to
 * now (applied_at defaults to now(), the start of the transaction), found
 * as the executor routes a row, holds [lo, hi) (either bound infinite when
 * the partition has none; both +infinity when rows go to the default
 * partition, which holds no range: then no partition is the insert's
 * alone). The other partitions that hold any row lie within [span_lo,
 * span_hi), and "others" tells whether there is any: partitions premade
 * for the days ahead hold none, and a lookup need not probe their indexes
 * for every event. A partition without a block holds no row, committed or
 * not; one that gets the row of an event of this batch meanwhile must wait
 * for the event's inbox lock, held already.
 */
typedef struct InboxRanges
{
	TimestampTz lo,
				hi;
	TimestampTz span_lo,
				span_hi;
	bool		others;
} InboxRanges;

static void
OutboxInboxRanges(InboxRanges *r)
{
	Relation	rel = table_open(OutboxRelid("inbox"), AccessShareLock);
	PartitionKey key = RelationGetPartitionKey(rel);
	PartitionDesc desc = RelationGetPartitionDesc(rel, true);
	PartitionBoundInfo bounds = desc->boundinfo;
	bool		ranged = bounds != NULL && key->strategy == PARTITION_STRATEGY_RANGE && key->partnatts == 1;
	TimestampTz *lower = palloc(sizeof(TimestampTz) * Max(desc->nparts, 1));
	TimestampTz *upper = palloc(sizeof(TimestampTz) * Max(desc->nparts, 1));
	int			target = -1;

	TIMESTAMP_NOEND(r->lo);
	TIMESTAMP_NOEND(r->hi);
	TIMESTAMP_NOEND(r->span_lo);
	TIMESTAMP_NOBEGIN(r->span_hi);
	r->others = false;

	/* Each partition's range: infinite for the default one. */
	for (int i = 0; i < desc->nparts; i++)
	{
		TIMESTAMP_NOBEGIN(lower[i]);
		TIMESTAMP_NOEND(upper[i]);
	}
	for (int at = 0; ranged && at < bounds->ndatums; at++)
	{
		int			part = bounds->indexes[at + 1];

		if (part < 0)
			continue;
		if (bounds->kind[at][0] == PARTITION_RANGE_DATUM_VALUE)
			lower[part] = DatumGetTimestampTz(bounds->datums[at][0]);
		if (at + 1 < bounds->ndatums && bounds->kind[at + 1][0] == PARTITION_RANGE_DATUM_VALUE)
			upper[part] = DatumGetTimestampTz(bounds->datums[at + 1][0]);
	}

	if (ranged && bounds->ndatums > 0)
	{
		Datum		now = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
		bool		equal;

		/* The greatest bound at or below now; the partition is above it. */
		target = bounds->indexes[partition_range_datum_bsearch(key->partsupfunc, key->partcollation, bounds, 1,
															   &now, &equal) + 1];
		if (target >= 0)
		{
			r->lo = lower[target];
			r->hi = upper[target];
		}
	}

	for (int i = 0; i < desc->nparts; i++)
	{
		Relation	part;
		bool		empty;

		if (i == target)
			continue;
		part = table_open(desc->oids[i], AccessShareLock);
		empty = part->rd_rel->relkind == RELKIND_RELATION && RelationGetNumberOfBlocks(part) == 0;
		table_close(part, NoLock);
		if (empty)
			continue;
		r->others = true;
		r->span_lo = Min(r->span_lo, lower[i]);
		r->span_hi = Max(r->span_hi, upper[i]);
	}
	table_close(rel, NoLock);
}

/*
 * Looks up which events of a batch the consumer applied before, with a
 * snapshot (InvalidSnapshot: the statement's), in some partitions: the one
 * rows go to now, or the others that hold rows (with "all", every other
 * one); sets found[k] and applied[k] of each event found (every occurrence
 * of its id), but for those skip[k] names (NULL: none). Returns how many
 * events it found.
 */
static int
OutboxInboxLookup(InboxPartitions which, Datum consumer, Datum idarray, const InboxRanges *ranges, bool all,
				  const pg_uuid_t *ids, const int *order, int n, Snapshot snapshot, const bool *skip, bool *found,
				  Datum *applied)
{
	static SPIPlanPtr plans[2] = {NULL, NULL};
	TimestampTz span_lo = ranges->span_lo,
				span_hi = ranges->span_hi;
	Datum		args[6];
	int			rc;
	int			hits = 0;

	if (all)
	{
		TIMESTAMP_NOBEGIN(span_lo);
		TIMESTAMP_NOEND(span_hi);
	}
	args[0] = consumer;
	args[1] = idarray;
	args[2] = TimestampTzGetDatum(ranges->lo);
	args[3] = TimestampTzGetDatum(ranges->hi);
	args[4] = TimestampTzGetDatum(span_lo);
	args[5] = TimestampTzGetDatum(span_hi);
	if (plans[which] == NULL)
	{
		Oid			types[6] = {TEXTOID, UUIDARRAYOID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID,
		TIMESTAMPTZOID};
		SPIPlanPtr	p = SPI_prepare_cursor(which == INBOX_TARGET_PARTITION ?
									"SELECT i.event_id, i.payload FROM " OUTBOX_SCHEMA ".inbox i"
									" WHERE i.consumer OPERATOR(pg_catalog.=) $1"
									" AND i.event_id OPERATOR(pg_catalog.=) ANY ($2)"
									" AND i.applied_at OPERATOR(pg_catalog.>=) $3"
									" AND i.applied_at OPERATOR(pg_catalog.<) $4" :
									"SELECT i.event_id, i.payload FROM " OUTBOX_SCHEMA ".inbox i"
									" WHERE i.consumer OPERATOR(pg_catalog.=) $1"
									" AND i.event_id OPERATOR(pg_catalog.=) ANY ($2)"
									" AND (i.applied_at OPERATOR(pg_catalog.<) $3"
									" OR i.applied_at OPERATOR(pg_catalog.>=) $4)"
									" AND i.applied_at OPERATOR(pg_catalog.>=) $5"
									" AND i.applied_at OPERATOR(pg_catalog.<) $6",
									which == INBOX_TARGET_PARTITION ? 4 : 6, types, CURSOR_OPT_GENERIC_PLAN);

		if (p == NULL || SPI_keepplan(p) != 0)
			elog(ERROR, "could not prepare the inbox lookup: %s", SPI_result_code_string(SPI_result));
		plans[which] = p;
	}
	if (snapshot == InvalidSnapshot)
		rc = SPI_execute_plan(plans[which], args, NULL, false, 0);
	else
		rc = SPI_execute_snapshot(plans[which], args, NULL, snapshot, InvalidSnapshot, false, false, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "inbox lookup failed: %s", SPI_result_code_string(rc));
	for (uint64 r = 0; r < SPI_processed; r++)
	{
		bool		isnull;
		Datum		id = SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 1, &isnull);
		Datum		payload = SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 2, &isnull);
		int			at = OutboxFindId(ids, order, n, DatumGetUUIDP(id));

		for (; at >= 0 && at < n && memcmp(ids[order[at]].data, DatumGetUUIDP(id)->data, UUID_LEN) == 0; at++)
		{
			int			k = order[at];

			if (!found[k] && (skip == NULL || !skip[k]))
			{
				found[k] = true;
				applied[k] = isnull ? (Datum) 0 : SPI_datumTransfer(payload, false, -1);
				hits++;
			}
		}
	}
	SPI_freetuptable(SPI_tuptable);
	return hits;
}

/*
 * Adds the first occurrence of each new event to the inbox; returns, in
 * inserted[k], which went in. One that did not is in the inbox already, in
 * the partition rows go to now: added by a transaction
 * that committed meanwhile (the inbox lock waited for it) or, at
 * REPEATABLE READ and SERIALIZABLE, a serialization failure raised by
 * ON CONFLICT itself when this snapshot cannot see that row.
 */
static void
OutboxInboxInsert(Datum consumer, Datum *idvals, Datum *payloads, const pg_uuid_t *ids, const int *order, int n,
				  const int *fresh, int nfresh, bool *inserted)
{
	static SPIPlanPtr plan = NULL;
	Datum	   *fresh_ids = palloc(sizeof(Datum) * nfresh);
	Datum	   *fresh_payloads = palloc(sizeof(Datum) * nfresh);
	Datum		args[3];
	int			rc;

	if (plan == NULL)
	{
		Oid			types[3] = {TEXTOID, UUIDARRAYOID, JSONBARRAYOID};
		SPIPlanPtr	p = SPI_prepare_cursor("INSERT INTO " OUTBOX_SCHEMA ".inbox AS i (consumer, event_id, payload)"
									" SELECT $1, u.event_id, u.payload"
									" FROM ROWS FROM (pg_catalog.unnest($2), pg_catalog.unnest($3)) AS u (event_id, payload)"
									" ON CONFLICT DO NOTHING RETURNING i.event_id",
									3, types, CURSOR_OPT_GENERIC_PLAN);

		if (p == NULL || SPI_keepplan(p) != 0)
			elog(ERROR, "could not prepare the inbox insert: %s", SPI_result_code_string(SPI_result));
		plan = p;
	}
	for (int k = 0; k < nfresh; k++)
	{
		fresh_ids[k] = idvals[fresh[k]];
		fresh_payloads[k] = payloads[fresh[k]];
	}
	args[0] = consumer;
	args[1] = PointerGetDatum(construct_array(fresh_ids, nfresh, UUIDOID, UUID_LEN, false, TYPALIGN_CHAR));
	args[2] = PointerGetDatum(construct_array(fresh_payloads, nfresh, JSONBOID, -1, false, TYPALIGN_INT));
	rc = SPI_execute_plan(plan, args, NULL, false, 0);
	if (rc != SPI_OK_INSERT_RETURNING)
		elog(ERROR, "inbox insert failed: %s", SPI_result_code_string(rc));
	for (uint64 r = 0; r < SPI_processed; r++)
	{
		bool		isnull;
		Datum		id = SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 1, &isnull);
		int			at = OutboxFindId(ids, order, n, DatumGetUUIDP(id));

		/* The first occurrence is the one inserted. */
		if (at >= 0)
			inserted[order[at]] = true;
	}
	SPI_freetuptable(SPI_tuptable);
}

/*
 * outbox.inbox_record(consumer text, event_ids uuid[], payloads jsonb[])
 * returns jsonb[]: records in the inbox the events a consumer applies now,
 * once. For each event, the payload applied before under its id (by an
 * earlier transaction, or by an earlier event of the same batch), or NULL
 * when it is new and recorded now. SECURITY DEFINER, granted to nobody:
 * inbox_apply() and inbox_consume() call it after their consumer check.
 */
Datum
outbox_inbox_record(PG_FUNCTION_ARGS)
{
	Datum		consumer;
	ArrayType  *idarray;
	ArrayType  *payarray;
	Datum	   *idvals;
	Datum	   *payloads;
	bool	   *idnulls;
	bool	   *paynulls;
	int			n,
				npay;
	pg_uuid_t  *ids;
	int		   *order;
	uint64	   *keys;
	bool	   *found;
	Datum	   *applied;
	bool	   *isnull;
	bool	   *inserted;
	int		   *fresh;
	int			nfresh = 0;
	InboxRanges ranges;
	char	   *name;
	char	   *key_text;
	int			name_len;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("consumer, event_ids and payloads must not be null")));
	consumer = PG_GETARG_DATUM(0);
	idarray = PG_GETARG_ARRAYTYPE_P(1);
	payarray = PG_GETARG_ARRAYTYPE_P(2);
	deconstruct_array(idarray, UUIDOID, UUID_LEN, false, TYPALIGN_CHAR, &idvals, &idnulls, &n);
	deconstruct_array(payarray, JSONBOID, -1, false, TYPALIGN_INT, &payloads, &paynulls, &npay);
	if (n != npay)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("event_ids and payloads must have the same length")));
	for (int i = 0; i < n; i++)
		if (idnulls[i] || paynulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s must not be null", idnulls[i] ? "event_id" : "payload")));

	ids = palloc(sizeof(pg_uuid_t) * Max(n, 1));
	order = palloc(sizeof(int) * Max(n, 1));
	keys = palloc(sizeof(uint64) * Max(n, 1));
	found = palloc0(sizeof(bool) * Max(n, 1));
	applied = palloc0(sizeof(Datum) * Max(n, 1));
	isnull = palloc(sizeof(bool) * Max(n, 1));
	inserted = palloc0(sizeof(bool) * Max(n, 1));
	fresh = palloc(sizeof(int) * Max(n, 1));

	/*
	 * The inbox lock of each event, in the order of the keys: a hash of
	 * "<consumer>/<event id>", as version 0.1.0's inbox_apply() took it.
	 */
	name = text_to_cstring(DatumGetTextPP(consumer));
	name_len = strlen(name);
	key_text = palloc(name_len + 1 + 37);
	memcpy(key_text, name, name_len);
	key_text[name_len] = '/';
	for (int i = 0; i < n; i++)
	{
		ids[i] = *DatumGetUUIDP(idvals[i]);
		order[i] = i;
		OutboxUuidText(&ids[i], key_text + name_len + 1);
		keys[i] = DatumGetUInt64(hash_any_extended((unsigned char *) key_text, name_len + 1 + 36, 0));
	}
	qsort(keys, n, sizeof(uint64), OutboxCompareKeys);
	for (int i = 0; i < n; i++)
		if (i == 0 || keys[i] != keys[i - 1])
			OutboxInboxLock(keys[i]);
	sort_ids = ids;
	qsort(order, n, sizeof(int), OutboxCompareIds);
	sort_ids = NULL;

	OutboxInboxRanges(&ranges);

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");

	/*
	 * The other partitions that hold rows first: what the transaction sees
	 * (at READ COMMITTED, a new snapshot), then at REPEATABLE READ and
	 * SERIALIZABLE what is committed now in any partition, which this
	 * snapshot must see too.
	 */
	if (n > 0 &&
		(ranges.others ?
		 OutboxInboxLookup(INBOX_OTHER_PARTITIONS, consumer, PointerGetDatum(idarray), &ranges, false, ids, order, n,
						   InvalidSnapshot, NULL, found, applied) : 0) < n &&
		IsolationUsesXactSnapshot())
	{
		bool	   *latest = palloc0(sizeof(bool) * n);
		Datum	   *unused = palloc0(sizeof(Datum) * n);
		Snapshot	snapshot = GetLatestSnapshot();

		OutboxInboxLookup(INBOX_OTHER_PARTITIONS, consumer, PointerGetDatum(idarray), &ranges, true, ids, order, n,
						  snapshot, NULL, latest, unused);
		OutboxInboxLookup(INBOX_TARGET_PARTITION, consumer, PointerGetDatum(idarray), &ranges, true, ids, order, n,
						  snapshot, NULL, latest, unused);

		/*
		 * A row this snapshot sees in the partition rows go to now was
		 * applied before the transaction began: a redelivery, not a
		 * concurrent apply.
		 */
		OutboxInboxLookup(INBOX_TARGET_PARTITION, consumer, PointerGetDatum(idarray), &ranges, false, ids, order, n,
						  InvalidSnapshot, NULL, found, applied);
		for (int i = 0; i < n; i++)
			if (latest[i] && !found[i])
				ereport(ERROR,
						(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
						 errmsg("could not serialize access to event %s of consumer \"%s\" due to a concurrent apply",
								DatumGetCString(DirectFunctionCall1(uuid_out, idvals[i])), name),
						 errdetail("A transaction that committed after this one took its snapshot applied the event."),
						 errhint("Retry the transaction: it will find the event applied.")));
	}

	/*
	 * The partition rows go to now is looked at by the insert itself: the
	 * first occurrence of each event not found goes in unless that
	 * partition has it, and only then is its payload read. order[] is by
	 * id, then by position, so the first of a run of equal ids came first
	 * in the batch.
	 */
	for (int at = 0; at < n; at++)
	{
		int			i = order[at];

		if (!found[i] && (at == 0 || memcmp(ids[order[at - 1]].data, ids[i].data, UUID_LEN) != 0))
			fresh[nfresh++] = i;
	}
	if (nfresh > 0)
	{
		Datum	   *missing = palloc(sizeof(Datum) * nfresh);
		int			nmissing = 0;

		OutboxInboxInsert(consumer, idvals, payloads, ids, order, n, fresh, nfresh, inserted);
		for (int k = 0; k < nfresh; k++)
			if (!inserted[fresh[k]])
				missing[nmissing++] = idvals[fresh[k]];
		/* The rows inserted now are not what was applied before. */
		if (nmissing > 0)
			OutboxInboxLookup(INBOX_TARGET_PARTITION, consumer,
							  PointerGetDatum(construct_array(missing, nmissing, UUIDOID, UUID_LEN, false, TYPALIGN_CHAR)),
							  &ranges, false, ids, order, n, InvalidSnapshot,
							  inserted, found, applied);
	}

	/*
	 * What each event had applied before: its row's payload; nothing for
	 * the first occurrence of one inserted now, whose repeats get its
	 * payload.
	 */
	for (int at = 0, first = -1; at < n; at++)
	{
		int			i = order[at];

		if (at == 0 || memcmp(ids[order[at - 1]].data, ids[i].data, UUID_LEN) != 0)
			first = i;
		isnull[i] = false;
		if (found[i])
			continue;
		if (inserted[first] && i != first)
			applied[i] = payloads[first];
		else if (inserted[i])
			isnull[i] = true;
		else
			elog(ERROR, "event %s of consumer \"%s\" is neither in the inbox nor added to it",
				 DatumGetCString(DirectFunctionCall1(uuid_out, idvals[i])), name);
	}
	SPI_finish();

	{
		int			dims[1] = {n};
		int			lbs[1] = {1};

		PG_RETURN_ARRAYTYPE_P(construct_md_array(applied, isnull, 1, dims, lbs, JSONBOID, -1, false, TYPALIGN_INT));
	}
}
