/*-------------------------------------------------------------------------
 *
 * keyed.c
 *	  inbox_consume_keyed(): the relay's consume call, with parked keys
 *	  honoured, and its fast path when no key of the batch's streams is
 *	  parked.
 *
 * A consumer that parks keys (consume --on-failure park-key) stores the
 * later entries of a failing key instead of applying them. What a batch
 * does with its entries of parked keys is written once, in PL/pgSQL, for
 * both engines: outbox.inbox_consume_keyed_body() (sql/install/45_park.sql).
 * But nearly every batch has no entry of a parked key, and for those the
 * body's checks, its probe of outbox.parked_keys through a checked entry
 * point and the copy of its result cost as much as a tenth of the batch.
 * So on this engine the entry point looks first, in C:
 *
 *	1. The batch is well formed (the arrays' lengths and shape, no NULL
 *	   stream or entry id, the flags given) and not applied entry by entry
 *	   while parking. Anything else goes to the body, which raises the
 *	   same errors on both engines, or handles the isolated case.
 *	2. No row of outbox.parked_keys has the consumer and one of the
 *	   batch's streams: a probe of its primary key per distinct stream,
 *	   read as the body's probe reads it, with the statement's snapshot
 *	   and no lock (a key parked by another worker after the probe is a
 *	   race the body has too; the park itself is serialized on the key's
 *	   row).
 *
 * Then the batch is inbox_consume(), called directly (it checks the
 * consumer). Otherwise the body is called through fmgr with the same
 * arguments and result, as inbox.c calls the checked bodies.
 *
 * Layering: keyed.c calls consume.c (inbox_consume()) and tables.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/table.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "nodes/value.h"
#include "parser/parse_func.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"

#include "consume.h"
#include "tables.h"

/* Arguments of inbox_consume_keyed(). */
enum
{
	KEYED_CONSUMER,
	KEYED_HANDLER,
	KEYED_STREAMS,
	KEYED_ENTRY_IDS,
	KEYED_EVENT_IDS,
	KEYED_TOPICS,
	KEYED_KEYS,
	KEYED_PAYLOADS,
	KEYED_HEADERS,
	KEYED_ISOLATE,
	KEYED_PARK,
	KEYED_NARGS
};

/* Columns of outbox.parked_keys' primary key (consumer, stream, key_hash). */
#define PARKED_KEYS_CONSUMER 1
#define PARKED_KEYS_STREAM	2

/* What a call site keeps: the body, and inbox_consume()'s own call info. */
typedef struct KeyedCall
{
	FmgrInfo	body;
	FmgrInfo	consume;
} KeyedCall;

PG_FUNCTION_INFO_V1(outbox_inbox_consume_keyed);

static KeyedCall *
OutboxKeyedCall(FunctionCallInfo fcinfo)
{
	KeyedCall  *call = (KeyedCall *) fcinfo->flinfo->fn_extra;
	Oid			types[KEYED_NARGS] = {TEXTOID, TEXTOID, TEXTARRAYOID, TEXTARRAYOID, BYTEAARRAYOID,
									  BYTEAARRAYOID, BYTEAARRAYOID, BYTEAARRAYOID, BYTEAARRAYOID,
									  BOOLOID, BOOLOID};
	Oid			body;

	if (call != NULL)
		return call;
	body = LookupFuncName(list_make2(makeString(OUTBOX_SCHEMA), makeString("inbox_consume_keyed_body")),
						  KEYED_NARGS, types, false);
	call = MemoryContextAllocZero(fcinfo->flinfo->fn_mcxt, sizeof(KeyedCall));
	fmgr_info_cxt(body, &call->body, fcinfo->flinfo->fn_mcxt);
	/*
	 * inbox_consume() keeps its own things in fn_extra: it gets a call info
	 * of its own, with this function's result type (the same columns).
	 */
	call->consume = *fcinfo->flinfo;
	call->consume.fn_extra = NULL;
	fcinfo->flinfo->fn_extra = call;
	return call;
}

/*
 * The elements of a one-dimensional array starting at 1, or -1 when it is
 * not such an array; 0 for an empty one. nulls: whether an element is NULL.
 */
static int
OutboxArrayLength(ArrayType *a, bool *nulls)
{
	int			n;

	*nulls = false;
	if (ARR_NDIM(a) == 0)
		return 0;
	if (ARR_NDIM(a) != 1 || ARR_LBOUND(a)[0] != 1)
		return -1;
	n = ARR_DIMS(a)[0];
	if (ARR_HASNULL(a))
	{
		bits8	   *bitmap = ARR_NULLBITMAP(a);

		for (int i = 0; i < n && !*nulls; i++)
			*nulls = (bitmap[i / 8] & (1 << (i % 8))) == 0;
	}
	return n;
}

/*
 * Whether the batch takes the fast path: well formed, not isolated while
 * parking, and (the streams it reads, once each) listed in streams_out.
 */
static bool
OutboxKeyedWellFormed(FunctionCallInfo fcinfo, Datum **streams_out, int *nstreams)
{
	int			n = -1;
	bool		nulls;

	for (int arg = 0; arg < KEYED_NARGS; arg++)
		if (PG_ARGISNULL(arg) && arg != KEYED_EVENT_IDS && arg != KEYED_TOPICS && arg != KEYED_KEYS &&
			arg != KEYED_PAYLOADS && arg != KEYED_HEADERS)
			return false;
	if (VARSIZE_ANY_EXHDR(PG_GETARG_TEXT_PP(KEYED_HANDLER)) == 0)
		return false;
	/* The body takes payloads as the batch's length, and an absent array as empty. */
	if (!PG_ARGISNULL(KEYED_PAYLOADS))
	{
		n = OutboxArrayLength(PG_GETARG_ARRAYTYPE_P(KEYED_PAYLOADS), &nulls);
		if (n < 0)
			return false;
	}
	else
		n = 0;
	for (int arg = KEYED_STREAMS; arg <= KEYED_HEADERS; arg++)
	{
		int			len;

		if (arg == KEYED_PAYLOADS)
			continue;
		if (PG_ARGISNULL(arg))
		{
			/* keys and headers may be absent; event_ids and topics count as empty */
			if ((arg == KEYED_EVENT_IDS || arg == KEYED_TOPICS) && n != 0)
				return false;
			continue;
		}
		len = OutboxArrayLength(PG_GETARG_ARRAYTYPE_P(arg), &nulls);
		if (len != n || (nulls && (arg == KEYED_STREAMS || arg == KEYED_ENTRY_IDS)))
			return false;
	}
	if (PG_GETARG_BOOL(KEYED_ISOLATE) && (PG_GETARG_BOOL(KEYED_PARK) || n > OUTBOX_CONSUME_ISOLATE_MAX))
		return false;

	*streams_out = NULL;
	*nstreams = 0;
	if (n > 0)
	{
		Datum	   *all;
		int			count;

		deconstruct_array(PG_GETARG_ARRAYTYPE_P(KEYED_STREAMS), TEXTOID, -1, false, TYPALIGN_INT,
						  &all, NULL, &count);
		/* Distinct streams (a batch reads a few, usually one). */
		for (int i = 0; i < count; i++)
		{
			bool		seen = false;

			for (int j = 0; j < *nstreams && !seen; j++)
				seen = DatumGetBool(DirectFunctionCall2Coll(texteq, C_COLLATION_OID, all[j], all[i]));
			if (!seen)
				all[(*nstreams)++] = all[i];
		}
		*streams_out = all;
	}
	return true;
}

/* Whether a key of the consumer is parked in one of the streams. */
static bool
OutboxKeyedAnyParked(text *consumer, Datum *streams, int nstreams)
{
	Relation	rel;
	bool		found = false;

	if (nstreams == 0)
		return false;
	rel = table_open(OutboxRelid("parked_keys"), AccessShareLock);
	for (int i = 0; i < nstreams && !found; i++)
	{
		ScanKeyData keys[2];
		SysScanDesc scan;

		ScanKeyInit(&keys[0], PARKED_KEYS_CONSUMER, BTEqualStrategyNumber, F_TEXTEQ, PointerGetDatum(consumer));
		keys[0].sk_collation = C_COLLATION_OID;
		ScanKeyInit(&keys[1], PARKED_KEYS_STREAM, BTEqualStrategyNumber, F_TEXTEQ, streams[i]);
		keys[1].sk_collation = C_COLLATION_OID;
		scan = systable_beginscan(rel, OutboxRelid("parked_keys_pkey"), true, GetActiveSnapshot(), 2, keys);
		found = HeapTupleIsValid(systable_getnext(scan));
		systable_endscan(scan);
	}
	table_close(rel, AccessShareLock);
	return found;
}

/*
 * inbox_consume_keyed(consumer, handler, streams, entry_ids, event_ids,
 * topics, keys, payloads, headers, isolate, park): see the header.
 */
Datum
outbox_inbox_consume_keyed(PG_FUNCTION_ARGS)
{
	KeyedCall  *call = OutboxKeyedCall(fcinfo);
	LOCAL_FCINFO(inner, FUNC_MAX_ARGS);
	Datum	   *streams;
	int			nstreams;
	Datum		result;

	if (OutboxKeyedWellFormed(fcinfo, &streams, &nstreams) &&
		!OutboxKeyedAnyParked(PG_GETARG_TEXT_PP(KEYED_CONSUMER), streams, nstreams))
	{
		/* inbox_consume(consumer, handler, event_ids, topics, keys, payloads, headers, isolate) */
		static const int from[] = {KEYED_CONSUMER, KEYED_HANDLER, KEYED_EVENT_IDS, KEYED_TOPICS, KEYED_KEYS,
								   KEYED_PAYLOADS, KEYED_HEADERS, KEYED_ISOLATE};

		InitFunctionCallInfoData(*inner, &call->consume, lengthof(from), PG_GET_COLLATION(), fcinfo->context,
								 fcinfo->resultinfo);
		for (int i = 0; i < lengthof(from); i++)
			inner->args[i] = fcinfo->args[from[i]];
		result = outbox_inbox_consume(inner);
	}
	else
	{
		InitFunctionCallInfoData(*inner, &call->body, PG_NARGS(), PG_GET_COLLATION(), fcinfo->context,
								 fcinfo->resultinfo);
		for (int i = 0; i < PG_NARGS(); i++)
			inner->args[i] = fcinfo->args[i];
		result = FunctionCallInvoke(inner);
	}
	fcinfo->isnull = inner->isnull;
	return result;
}
