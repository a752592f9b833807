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
 * The row is inserted through a saved SPI plan, as the owner of the event
 * table: callers need EXECUTE on the function, not INSERT on the table, so
 * that nobody can write a row with a forged position.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "commands/async.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "tcop/utility.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"
#include "utils/xid8.h"

#include "pg_outbox.h"

PG_FUNCTION_INFO_V1(outbox_emit);
PG_FUNCTION_INFO_V1(outbox_emit_many);

/* Owner of outbox.event; InvalidOid until looked up or after invalidation. */
static Oid	EventRelid = InvalidOid;
static Oid	EventOwner = InvalidOid;

/* Saved plans of the two inserts. */
static SPIPlanPtr EmitOnePlan = NULL;
static SPIPlanPtr EmitManyPlan = NULL;

/* Sequence numbers within the current top-level transaction. */
static FullTransactionId SeqFxid = {0};
static int64 SeqLast = 0;

/* Whether the current top-level transaction emitted; see OutboxXactCallback. */
static bool EmittedInXact = false;

#define EMIT_ONE_SQL \
	"INSERT INTO outbox.event (txid, seq, event_id, topic, key, payload, headers, created_at) " \
	"VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"

#define EMIT_MANY_SQL \
	"INSERT INTO outbox.event (txid, seq, event_id, topic, key, payload, headers, created_at) " \
	"SELECT $1, $2 + u.ord, u.id, $3, u.k, u.p, u.h, $4 " \
	"  FROM ROWS FROM (pg_catalog.unnest($5::pg_catalog.uuid[]), " \
	"                  pg_catalog.unnest($6::pg_catalog.text[]), " \
	"                  pg_catalog.unnest($7::pg_catalog.jsonb[]), " \
	"                  pg_catalog.unnest($8::pg_catalog.jsonb[])) " \
	"       WITH ORDINALITY AS u(id, k, p, h, ord)"

/* Forgets the cached event table owner when its relcache entry is invalidated. */
static void
OutboxRelcacheCallback(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == EventRelid)
	{
		EventRelid = InvalidOid;
		EventOwner = InvalidOid;
	}
}

/*
 * Wakes relays once per committing transaction that emitted.
 *
 * The notification is queued at pre-commit rather than by outbox_emit()
 * itself: a transaction that queued a NOTIFY cannot be prepared, and
 * emitting transactions must support two-phase commit. Prepared
 * transactions therefore wake nobody when they commit; relays find their
 * events by polling. A savepoint that emitted and rolled back still counts:
 * one spurious wake-up costs a relay one empty fetch.
 */
static void
OutboxXactCallback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			if (EmittedInXact && pg_outbox_notify)
				Async_Notify(OUTBOX_NOTIFY_CHANNEL, NULL);
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PREPARE:
			EmittedInXact = false;
			break;
		default:
			break;
	}
}

/* Registers the callbacks; called once from _PG_init. */
void
OutboxEmitInit(void)
{
	CacheRegisterRelcacheCallback(OutboxRelcacheCallback, (Datum) 0);
	RegisterXactCallback(OutboxXactCallback, NULL);
}

/* Returns the owner of outbox.event, looking it up only after invalidation. */
static Oid
OutboxEventOwner(void)
{
	if (!OidIsValid(EventOwner))
	{
		Oid			nspid = get_namespace_oid(OUTBOX_SCHEMA, true);
		Oid			relid = OidIsValid(nspid) ? get_relname_relid("event", nspid) : InvalidOid;
		HeapTuple	tuple;

		if (!OidIsValid(relid))
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("pg_outbox is not installed in this database"),
					 errhint("Run CREATE EXTENSION pg_outbox.")));

		tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
		if (!HeapTupleIsValid(tuple))
			elog(ERROR, "cache lookup failed for relation %u", relid);
		EventOwner = ((Form_pg_class) GETSTRUCT(tuple))->relowner;
		ReleaseSysCache(tuple);
		EventRelid = relid;
	}
	return EventOwner;
}

/*
 * Executes one of the saved inserts as the owner of the event table,
 * preparing and saving the plan on first use. The plan cache re-plans it
 * when partitions come and go.
 */
static void
OutboxExecuteInsert(SPIPlanPtr *plan, const char *sql, int nargs, Oid *argtypes,
					Datum *values, const char *nulls)
{
	Oid			save_userid;
	int			save_sec_context;
	int			rc;

	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SetUserIdAndSecContext(OutboxEventOwner(),
						   save_sec_context | SECURITY_LOCAL_USERID_CHANGE);

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");

	if (*plan == NULL)
	{
		SPIPlanPtr	p = SPI_prepare(sql, nargs, argtypes);

		if (p == NULL)
			elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
		if (SPI_keepplan(p) != 0)
			elog(ERROR, "SPI_keepplan failed");
		*plan = p;
	}

	rc = SPI_execute_plan(*plan, values, nulls, false, 0);
	if (rc != SPI_OK_INSERT)
		elog(ERROR, "inserting into outbox.event failed: %s", SPI_result_code_string(rc));

	SPI_finish();
	SetUserIdAndSecContext(save_userid, save_sec_context);
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

/*
 * A time-ordered (version 7) UUID: 48 bits of Unix milliseconds, then random
 * bits. Time-ordered ids keep the inbox's (consumer, event_id) index
 * appending at its right edge instead of writing all over it.
 */
static void
OutboxNewEventId(pg_uuid_t *uuid, TimestampTz now)
{
	uint64		unix_ms;
	int			i;

	unix_ms = (uint64) (now / 1000) +
		(uint64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY * 1000;

	if (!pg_strong_random(uuid->data, UUID_LEN))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not generate random values")));

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

/* Checks a payload's stored size against pg_outbox.max_payload_size. */
static void
OutboxCheckPayload(Jsonb *payload, int element)
{
	Size		size = VARSIZE(payload);

	if (size > (Size) pg_outbox_max_payload_size)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 element ? errmsg("payload %d is too large", element) : errmsg("payload is too large"),
				 errdetail("The payload is %zu bytes as jsonb; pg_outbox.max_payload_size is %d bytes.",
						   size, pg_outbox_max_payload_size),
				 errhint("Store large content elsewhere and emit a reference to it, or raise pg_outbox.max_payload_size.")));
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
	static Oid	argtypes[8] = {XID8OID, INT8OID, UUIDOID, TEXTOID, TEXTOID,
	JSONBOID, JSONBOID, TIMESTAMPTZOID};
	Datum		values[8];
	char		nulls[8] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
	text	   *topic;
	Jsonb	   *payload;
	pg_uuid_t  *event_id;
	FullTransactionId fxid;
	TimestampTz now;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("topic must not be null")));
	topic = PG_GETARG_TEXT_PP(0);
	OutboxCheckTopic(topic);

	if (PG_ARGISNULL(1))
		nulls[4] = 'n';
	else
		OutboxCheckKey(PG_GETARG_TEXT_PP(1), 0);

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("payload must not be null"),
				 errhint("Use '{}' or 'null'::jsonb for an event without a payload.")));
	payload = PG_GETARG_JSONB_P(2);
	OutboxCheckPayload(payload, 0);

	if (PG_ARGISNULL(3))
		nulls[6] = 'n';
	else
		OutboxCheckHeaders(PG_GETARG_JSONB_P(3), 0);

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

	values[0] = FullTransactionIdGetDatum(fxid);
	values[1] = Int64GetDatum(OutboxReserveSeq(fxid, 1) + 1);
	values[2] = UUIDPGetDatum(event_id);
	values[3] = PointerGetDatum(topic);
	values[4] = PG_ARGISNULL(1) ? (Datum) 0 : PG_GETARG_DATUM(1);
	values[5] = PointerGetDatum(payload);
	values[6] = PG_ARGISNULL(3) ? (Datum) 0 : PG_GETARG_DATUM(3);
	values[7] = TimestampTzGetDatum(now);

	OutboxExecuteInsert(&EmitOnePlan, EMIT_ONE_SQL, 8, argtypes, values, nulls);
	EmittedInXact = true;

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
 * Writes one event per element of payloads, all in one insert, and returns
 * their event ids in order. keys, headers and event_ids may be NULL (all
 * NULL) or arrays as long as payloads; a NULL event id is generated.
 */
Datum
outbox_emit_many(PG_FUNCTION_ARGS)
{
	static Oid	argtypes[8] = {XID8OID, INT8OID, TEXTOID, TIMESTAMPTZOID,
		UUIDARRAYOID, TEXTARRAYOID, JSONBARRAYOID, JSONBARRAYOID};
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Datum		values[8];
	char		nulls[8] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
	text	   *topic;
	Datum	   *payloads;
	bool	   *payload_nulls;
	Datum	   *ids;
	int			n;
	int			i;
	FullTransactionId fxid;
	TimestampTz now;

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
	for (i = 0; i < n; i++)
	{
		if (payload_nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("payload %d must not be null", i + 1),
					 errhint("Use '{}' or 'null'::jsonb for an event without a payload.")));
		OutboxCheckPayload(DatumGetJsonbP(payloads[i]), i + 1);
	}

	if (PG_ARGISNULL(1))
		nulls[5] = 'n';
	else
	{
		Datum	   *keys;
		bool	   *key_nulls;
		int			nkeys = OutboxDeconstruct(PG_GETARG_ARRAYTYPE_P(1), "keys", TEXTOID,
											  &keys, &key_nulls);

		OutboxCheckLength("keys", nkeys, n);
		for (i = 0; i < n; i++)
			if (!key_nulls[i])
				OutboxCheckKey(DatumGetTextPP(keys[i]), i + 1);
	}

	if (PG_ARGISNULL(3))
		nulls[7] = 'n';
	else
	{
		Datum	   *headers;
		bool	   *header_nulls;
		int			nheaders = OutboxDeconstruct(PG_GETARG_ARRAYTYPE_P(3), "headers", JSONBOID,
												 &headers, &header_nulls);

		OutboxCheckLength("headers", nheaders, n);
		for (i = 0; i < n; i++)
			if (!header_nulls[i])
				OutboxCheckHeaders(DatumGetJsonbP(headers[i]), i + 1);
	}

	now = GetCurrentTimestamp();
	ids = palloc(sizeof(Datum) * Max(n, 1));
	if (PG_ARGISNULL(4))
	{
		for (i = 0; i < n; i++)
		{
			pg_uuid_t  *id = palloc(sizeof(pg_uuid_t));

			OutboxNewEventId(id, now);
			ids[i] = UUIDPGetDatum(id);
		}
	}
	else
	{
		Datum	   *given;
		bool	   *given_nulls;
		int			ngiven = OutboxDeconstruct(PG_GETARG_ARRAYTYPE_P(4), "event_ids", UUIDOID,
											   &given, &given_nulls);

		OutboxCheckLength("event_ids", ngiven, n);
		for (i = 0; i < n; i++)
		{
			if (given_nulls[i])
			{
				pg_uuid_t  *id = palloc(sizeof(pg_uuid_t));

				OutboxNewEventId(id, now);
				ids[i] = UUIDPGetDatum(id);
			}
			else
				ids[i] = given[i];
		}
	}

	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	if (n == 0)
		return (Datum) 0;

	OutboxCheckWritable();
	fxid = GetTopFullTransactionId();

	values[0] = FullTransactionIdGetDatum(fxid);
	values[1] = Int64GetDatum(OutboxReserveSeq(fxid, n));
	values[2] = PointerGetDatum(topic);
	values[3] = TimestampTzGetDatum(now);
	values[4] = PointerGetDatum(construct_array(ids, n, UUIDOID, UUID_LEN, false, TYPALIGN_CHAR));
	values[5] = PG_ARGISNULL(1) ? (Datum) 0 : PG_GETARG_DATUM(1);
	values[6] = PG_GETARG_DATUM(2);
	values[7] = PG_ARGISNULL(3) ? (Datum) 0 : PG_GETARG_DATUM(3);

	OutboxExecuteInsert(&EmitManyPlan, EMIT_MANY_SQL, 8, argtypes, values, nulls);
	EmittedInXact = true;

	for (i = 0; i < n; i++)
	{
		bool		isnull = false;

		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, &ids[i], &isnull);
	}
	return (Datum) 0;
}
