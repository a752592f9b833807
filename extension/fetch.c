/*-------------------------------------------------------------------------
 *
 * fetch.c
 *	  outbox_fetch(): the next batch of a group's feed.
 *
 * One call decides where the batch lies, reads it (feed.c) and, when it is
 * empty, waits for a commit that emitted (wakeup.c). The decision is made
 * here, in C, from the group's row:
 *
 * - the arguments: batch_size between 1 and 100000; "after", a position
 *   (position.c) of the group's order, from which the batch starts instead
 *   of the cursor when it is ahead (a relay fetches the next batch while
 *   the broker still writes the previous one);
 * - the group, read by its name's index (group.c);
 * - the leadership: the leader whose lease is fresh goes on; anyone else,
 *   and the leader whose lease is due, asks OutboxLead() (group.c), which
 *   takes, keeps or refuses the group; nothing is read for a session that
 *   does not lead;
 * - the generation the leader noted: a cursor moved by outbox_rewind()
 *   refuses the call once (OB002, group.c's check, which outbox_advance()
 *   passes too);
 * - the horizons, read before the snapshot that reads the batch: the xid8
 *   horizon (every transaction below it has ended), or the commit horizon
 *   (every ticket up to it is final) and a transaction id above every
 *   transaction with a ticket up to it; a cursor ahead of this server's
 *   transaction ids or tickets (a restore elsewhere, a failover to an
 *   older history) is refused (55000).
 *
 * This used to be a PL/pgSQL function called through SPI for every batch;
 * it took a third of the relay backend's time when the relay kept up. Its
 * semantics are unchanged: outbox.backlog() and outbox.commit_backlog()
 * remain the SQL specification of a batch, which the tests compare every
 * batch with. A database whose SQL objects are still those of 0.1.0 (the
 * library updated, ALTER EXTENSION UPDATE not yet run) has no lease in its
 * groups: its batches are placed by its outbox.fetch_args() as before
 * (fetch_010.c).
 *
 * The rows are handed to the caller in a tuplestore, and a batch of some
 * hundreds of kilobytes kept in the calling query's memory would go back to
 * the operating system when the query ends, to be faulted in again by the
 * next batch. The tuplestore lives in a memory context of the backend that
 * keeps the memory its rows are freed into, for the next batch. That
 * context is emptied when no batch is in use and it holds more than
 * OUTBOX_FETCH_KEEP_BYTES: a batch whose query failed leaves its rows
 * behind (nothing ends its tuplestore), and a large batch should not stay
 * allocated for the life of the session. A batch is in use from the call
 * until the calling query's memory goes away, which a callback on that
 * memory tells.
 *
 * Layering: calls group.c, feed.c, position.c, lead.c, commit.c, wakeup.c,
 * fetch_010.c and tables.c; nothing calls into it.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/transam.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/tuptable.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/latch.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
#include "utils/xid8.h"

#include "commit.h"
#include "feed.h"
#include "fetch.h"
#include "group.h"
#include "lead.h"
#include "pack.h"
#include "position.h"
#include "tables.h"
#include "wakeup.h"

/*
 * The longest wait for events, in microseconds. While it waits, the calling
 * statement's snapshot holds this backend's xmin, and with it the horizon
 * of VACUUM for the whole cluster: a function cannot let go of the snapshot
 * of the query that called it. A client that waits longer calls again.
 */
#define OUTBOX_FETCH_MAX_WAIT		(10 * USECS_PER_SEC)

/* Memory kept between batches, at most. */
#define OUTBOX_FETCH_KEEP_BYTES		(8 * 1024 * 1024)

/* Largest batch_size. */
#define OUTBOX_FETCH_MAX_BATCH		100000

PG_FUNCTION_INFO_V1(outbox_fetch);
PG_FUNCTION_INFO_V1(outbox_fetch_packed);

/* Where batches' rows are kept, and how many batches are in use. */
static MemoryContext FetchContext = NULL;
static int	FetchesInUse = 0;

/*
 * The buffer of packed batches, kept between batches like the rows' memory
 * (a batch's buffer allocated anew grows by doubling and is faulted in page
 * by page each time). A batch's value is the buffer itself, in use until
 * the memory of the calling query goes away; a call meanwhile (another in
 * the same query) packs into a buffer of its own. It lives in
 * TopMemoryContext, not in FetchContext, which the end of a query of rows
 * may empty while the buffer is kept or in use.
 */
static StringInfoData PackBuffer;
static bool PackBufferInUse = false;

/*
 * Called when the memory of a query that called outbox_fetch() goes away:
 * its batch is no longer in use.
 */
static void
OutboxFetchDone(void *arg)
{
	Assert(FetchesInUse > 0);
	FetchesInUse--;
	if (FetchesInUse == 0 &&
		MemoryContextMemAllocated(FetchContext, true) > OUTBOX_FETCH_KEEP_BYTES)
		MemoryContextReset(FetchContext);
}


/* The group's topics (a text[]) into the range; NULL: every topic. */
void
OutboxRangeTopics(FeedRange *a, ArrayType *topics)
{
	Datum	   *elems;
	bool	   *elem_nulls;
	int			i;

	a->ntopics = -1;
	if (topics == NULL)
		return;
	deconstruct_array(topics, TEXTOID, -1, false, TYPALIGN_INT, &elems, &elem_nulls, &a->ntopics);
	a->topics = palloc(sizeof(text *) * Max(a->ntopics, 1));
	for (i = 0; i < a->ntopics; i++)
		a->topics[i] = elem_nulls[i] ? NULL : DatumGetTextPP(elems[i]);
}

/* The name of this transaction's isolation level, as SHOW says it, in capitals. */
static const char *
OutboxIsolationName(void)
{
	switch (XactIsoLevel)
	{
		case XACT_READ_UNCOMMITTED:
			return "READ UNCOMMITTED";
		case XACT_REPEATABLE_READ:
			return "REPEATABLE READ";
		case XACT_SERIALIZABLE:
			return "SERIALIZABLE";
		default:
			return "READ COMMITTED";
	}
}

/*
 * Where the group's next batch lies, into "a": false when another session
 * leads the group (the batch is then empty). *current is false when the
 * SQL objects are those of 0.1.0: nothing was decided.
 */
static bool
OutboxPlaceBatch(Datum *args, char *nulls, FeedRange *a, bool *current)
{
	text	   *name;
	const char *after = NULL;
	int32		batch_size;
	GroupRow	g;
	uint64		order;
	int64		seq;
	Snapshot	snapshot;

	if (nulls[1] == 'n')
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("batch_size must not be null")));
	batch_size = DatumGetInt32(args[1]);
	if (batch_size < 1 || batch_size > OUTBOX_FETCH_MAX_BATCH)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch_size %d is out of range", batch_size),
				 errdetail("batch_size must be between 1 and %d.", OUTBOX_FETCH_MAX_BATCH)));
	if (nulls[0] == 'n')
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("group name must not be null")));
	name = DatumGetTextPP(args[0]);
	*current = OutboxGetGroup(name, false, &g);
	if (!*current)
		return false;

	/* The leader goes on while its lease is fresh; anyone else asks. */
	if (!OutboxLeadsFreshly(&g))
	{
		if (!OutboxLead(DatumGetInt32(g.values[GROUP_ID])))
			return false;
		if (!OutboxGetGroup(name, false, &g))
			elog(ERROR, "pg_outbox: group \"%s\" went away while this session took the lead", text_to_cstring(name));
	}
	OutboxCheckGeneration(&g, text_to_cstring(name));

	memset(a, 0, sizeof(*a));
	a->name = text_to_cstring(name);
	a->limit = batch_size;
	a->epoch = (uint64) DatumGetInt64(g.values[GROUP_EPOCH]);
	a->cursor_seq = DatumGetInt64(g.values[GROUP_CURSOR_SEQ]);
	a->commit = strcmp(TextDatumGetCString(g.values[GROUP_ORDERING]), "commit") == 0;
	a->shard = DatumGetInt32(g.values[GROUP_SHARD]);
	a->shards = DatumGetInt32(g.values[GROUP_SHARDS]);
	OutboxRangeTopics(a, g.nulls[GROUP_TOPICS] ? NULL : DatumGetArrayTypeP(g.values[GROUP_TOPICS]));
	if (nulls[2] != 'n')
		after = OutboxUnshiftPosition(TextDatumGetCString(args[2]), a->epoch);

	if (a->commit)
	{
		if (XactIsoLevel != XACT_READ_COMMITTED)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_TRANSACTION_STATE),
					 errmsg("a commit-ordered group is read at READ COMMITTED only"),
					 errdetail("This transaction is %s: its snapshot may predate the commit horizon, and events would be skipped.",
							   OutboxIsolationName())));
		a->cursor_ticket = DatumGetInt64(g.values[GROUP_CURSOR_TICKET]);
		a->horizon = OutboxCommitHorizon();
		/*
		 * No ticket above the horizon's next one has been issued yet: a
		 * cursor there was not reached by publishing. Reading on would skip
		 * every ticket up to it, issued later, for good.
		 */
		if (a->cursor_ticket > a->horizon + 1)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("cursor of group \"%s\" is ahead of this server's commit tickets", text_to_cstring(name)),
					 errdetail("The cursor is at ticket " INT64_FORMAT ", the commit horizon is at " INT64_FORMAT ".",
							   a->cursor_ticket, a->horizon),
					 errhint("After a restore into another cluster or a failover, re-anchor the group with outbox_reanchor(%s).",
							 quote_literal_cstr(text_to_cstring(name)))));
		/*
		 * Every transaction with a ticket up to the horizon has ended, so its
		 * id is below the next one, read after the horizon.
		 */
		snapshot = GetTransactionSnapshot();
		a->below = OutboxFullXid(snapshot->xmax);
		if (after != NULL)
		{
			OutboxParsePosition(after, true, &order, &seq);
			if ((int64) order > a->cursor_ticket || ((int64) order == a->cursor_ticket && seq > a->cursor_seq))
			{
				a->cursor_ticket = (int64) order;
				a->cursor_seq = seq;
			}
		}
	}
	else
	{
		uint64		next_xid;

		a->cursor_txid = U64FromFullTransactionId(DatumGetFullTransactionId(g.values[GROUP_CURSOR_TXID]));
		snapshot = GetTransactionSnapshot();
		a->below = OutboxFullXid(snapshot->xmin);
		next_xid = OutboxFullXid(snapshot->xmax);
		if (a->cursor_txid > next_xid)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("cursor of group \"%s\" is ahead of this server's transaction ids", text_to_cstring(name)),
					 errdetail("The cursor is at transaction " UINT64_FORMAT ", the next transaction id is " UINT64_FORMAT ". This happens after a dump and restore into another cluster, or a failover to a server with an older history.",
							   a->cursor_txid, next_xid),
					 errhint("Re-anchor the group with outbox_reanchor(%s): it goes on from this server's horizon, with stream ids above those it published.",
							 quote_literal_cstr(text_to_cstring(name)))));
		/*
		 * A relay that fetches the next batch while the broker still writes
		 * the previous one reads after that batch, not after the cursor.
		 */
		if (after != NULL)
		{
			OutboxParsePosition(after, false, &order, &seq);
			if (order > a->cursor_txid || (order == a->cursor_txid && seq > a->cursor_seq))
			{
				a->cursor_txid = order;
				a->cursor_seq = seq;
			}
		}
	}
	return true;
}

/*
 * Reads the group's next batch into "out" (outbox_fetch()'s arguments:
 * group name, batch size, after). False when another session leads.
 */
static bool
OutboxReadBatch(Datum *args, char *nulls, FeedBatch *out)
{
	FeedRange	a;
	bool		current;

	if (!OutboxPlaceBatch(args, nulls, &a, &current))
	{
		if (current || !OutboxPlaceBatchByArgs(args, nulls, &a))
			return false;
	}

	/*
	 * A snapshot taken after the horizons were read: at READ COMMITTED (the
	 * only level commit order allows) every transaction below them has
	 * ended and is visible in it if it committed.
	 */
	PushActiveSnapshot(GetTransactionSnapshot());
	if (a.commit)
		OutboxReadCommitFeed(&a, out, GetActiveSnapshot());
	else
		OutboxReadFeed(&a, out, GetActiveSnapshot());
	PopActiveSnapshot();
	return true;
}

/*
 * Reads the group's next batch into "out", with outbox_fetch()'s arguments
 * (group name, batch size, after, wait): none while another session leads
 * the group. An empty batch waits up to "wait" for events.
 */
static void
OutboxFetch(FunctionCallInfo fcinfo, FeedBatch *out)
{
	Datum		args[3];
	char		nulls[3];
	long		wait_ms = 0;
	int			i;

	for (i = 0; i < 3; i++)
	{
		args[i] = PG_GETARG_DATUM(i);
		nulls[i] = PG_ARGISNULL(i) ? 'n' : ' ';
	}
	if (!PG_ARGISNULL(3))
	{
		Interval   *wait = PG_GETARG_INTERVAL_P(3);

		if (wait->month != 0 || wait->day != 0 || wait->time < 0 || wait->time > OUTBOX_FETCH_MAX_WAIT)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("wait must be between 0 and 10 seconds"),
					 errdetail("While it waits, the statement's snapshot holds back the cleanup horizon of VACUUM."),
					 errhint("Call outbox_fetch() again to wait longer.")));
		wait_ms = wait->time / 1000;
		/*
		 * A leader renews its lease when it fetches: it wakes in time to do
		 * so, at most a third of the lease after the last renewal.
		 */
		wait_ms = Min(wait_ms, pg_outbox_lease_ms / 3);
	}

	/*
	 * An empty batch waits for a commit that emitted, up to "wait": among
	 * the sleepers (wakeup.c), then a read, then the latch, until a read
	 * finds events. At REPEATABLE READ and above every read would see the
	 * same snapshot, and without preloading there are no sleepers: no wait.
	 */
	if (wait_ms > 0 && !IsolationUsesXactSnapshot())
	{
		TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), wait_ms);

		PG_TRY();
		{
			bool		sleeping = false;

			/*
			 * A read that wrote (took the lead, or renewed the lease) has a
			 * transaction id, which would hold back the very horizon the
			 * wait is for: it returns, and the next call waits.
			 */
			while (OutboxReadBatch(args, nulls, out) && out->count == 0 &&
				   !FullTransactionIdIsValid(GetTopFullTransactionIdIfAny()))
			{
				long		left;

				if (!sleeping)
				{
					if (!OutboxSleepBegin())
						break;
					sleeping = true;
					ResetLatch(MyLatch);
					continue;	/* read again, among the sleepers */
				}
				left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);
				if (left <= 0)
					break;
				(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, left,
								 PG_WAIT_EXTENSION);
				ResetLatch(MyLatch);
				CHECK_FOR_INTERRUPTS();
			}
		}
		PG_FINALLY();
		{
			OutboxSleepEnd();
		}
		PG_END_TRY();
	}
	else
		(void) OutboxReadBatch(args, nulls, out);
}

/* Calls "func" when the calling query's memory goes away. */
static void
OutboxAtQueryEnd(MemoryContext query_memory, MemoryContextCallbackFunction func)
{
	MemoryContextCallback *done = MemoryContextAlloc(query_memory, sizeof(MemoryContextCallback));

	done->func = func;
	done->arg = NULL;
	MemoryContextRegisterResetCallback(query_memory, done);
}

/*
 * The batch is in use until the calling query's memory goes away (fetch
 * memory is emptied only between batches).
 */
static void
OutboxFetchInUse(MemoryContext query_memory)
{
	if (FetchContext == NULL)
		FetchContext = AllocSetContextCreate(TopMemoryContext, "pg_outbox fetch",
											 ALLOCSET_DEFAULT_SIZES);
	OutboxAtQueryEnd(query_memory, OutboxFetchDone);
	FetchesInUse++;
}

/*
 * outbox_fetch(group_name, batch_size, after, wait): the rows of the
 * group's next batch, in feed order; none while another session leads the
 * group. An empty batch waits up to "wait" for events.
 */
Datum
outbox_fetch(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	TupleDesc	tupdesc;
	FeedBatch	out = {0};
	MemoryContext oldcontext;

	if (rsinfo == NULL || !IsA(rsinfo, ReturnSetInfo) ||
		(rsinfo->allowedModes & SFRM_Materialize) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("set-valued function called in context that cannot accept a set")));
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	if (tupdesc->natts != FEED_NATTS)
		elog(ERROR, "outbox_fetch() returns %d columns, expected %d", tupdesc->natts, FEED_NATTS);

	OutboxFetchInUse(rsinfo->econtext->ecxt_per_query_memory);
	oldcontext = MemoryContextSwitchTo(FetchContext);
	out.store = tuplestore_begin_heap((rsinfo->allowedModes & SFRM_Materialize_Random) != 0,
									  false, work_mem);
	MemoryContextSwitchTo(oldcontext);
	out.desc = CreateTupleDescCopy(tupdesc);
	rsinfo->returnMode = SFRM_Materialize;
	rsinfo->setResult = out.store;
	rsinfo->setDesc = out.desc;

	out.scratch = AllocSetContextCreate(CurrentMemoryContext, "pg_outbox fetch check", ALLOCSET_SMALL_SIZES);
	OutboxFetch(fcinfo, &out);
	MemoryContextDelete(out.scratch);
	return (Datum) 0;
}

/*
 * outbox_fetch_packed(group_name, batch_size, after, wait): the same batch
 * as outbox_fetch() in one bytea, in the format pack.c describes: what the
 * relay calls. It may hold fewer events than batch_size (at most
 * FEED_PACKED_MAX_BYTES of them, or one larger event alone); the next
 * batch starts after its last.
 */
static void
OutboxPackBufferDone(void *arg)
{
	PackBufferInUse = false;
	if (PackBuffer.maxlen > OUTBOX_FETCH_KEEP_BYTES)
	{
		pfree(PackBuffer.data);
		PackBuffer.data = NULL;
	}
}

Datum
outbox_fetch_packed(PG_FUNCTION_ARGS)
{
	FeedBatch	out = {0};
	StringInfoData local;
	StringInfo	buf = &local;
	bytea	   *result;
	int			start;

	if (!PackBufferInUse)
	{
		if (PackBuffer.data == NULL)
		{
			MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);

			initStringInfo(&PackBuffer);
			MemoryContextSwitchTo(old);
		}
		OutboxAtQueryEnd(fcinfo->flinfo->fn_mcxt, OutboxPackBufferDone);
		PackBufferInUse = true;
		buf = &PackBuffer;
		resetStringInfo(buf);
	}
	else
		initStringInfo(buf);

	/* The buffer becomes the value: room for its varlena header first. */
	appendStringInfoSpaces(buf, VARHDRSZ);
	start = OutboxPackBegin(buf);
	out.packed = buf;
	out.scratch = AllocSetContextCreate(CurrentMemoryContext, "pg_outbox packing", ALLOCSET_SMALL_SIZES);
	OutboxFetch(fcinfo, &out);
	MemoryContextDelete(out.scratch);
	OutboxPackEnd(buf, start, out.count,
				  out.count > 0 ? Max(GetCurrentTimestamp() - out.first_created_at, 0) : -1);
	result = (bytea *) buf->data;
	SET_VARSIZE(result, buf->len);
	PG_RETURN_BYTEA_P(result);
}
