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
 * - the group, read by its name's index;
 * - the leadership: the leader whose lease is fresh goes on; anyone else,
 *   and the leader whose lease is due, asks outbox.lead() (SQL, see
 *   lead.c), which takes, keeps or refuses the group; nothing is read for
 *   a session that does not lead;
 * - the generation the leader noted: a cursor moved by outbox_rewind()
 *   refuses the call once (OB002);
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
 * groups: its batches are placed by its outbox.fetch_args() as before.
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
 * Layering: calls feed.c, position.c, lead.c, commit.c, wakeup.c and
 * tables.c; nothing calls into it.
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
#include "executor/spi.h"
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

/* SQLSTATE of a leader's call after outbox_rewind() moved its cursor. */
#define ERRCODE_OUTBOX_REWOUND		MAKE_SQLSTATE('O', 'B', '0', '0', '2')

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

/* The calls of outbox.lead() and (0.1.0) outbox.fetch_args(), prepared once per session. */
static SPIPlanPtr LeadPlan = NULL;
static SPIPlanPtr FetchArgsPlan = NULL;

/* The columns of outbox.groups that a fetch reads. */
typedef enum GroupColumn
{
	GROUP_ID,
	GROUP_NAME,
	GROUP_TOPICS,
	GROUP_ORDERING,
	GROUP_CURSOR_TXID,
	GROUP_CURSOR_TICKET,
	GROUP_CURSOR_SEQ,
	GROUP_EPOCH,
	GROUP_CURSOR,
	GROUP_GENERATION,
	GROUP_LEADER_PID,
	GROUP_LEADER_STARTED,
	GROUP_LEASE_RENEWED,
	GROUP_SHARD,
	GROUP_SHARDS,
	GROUP_NCOLUMNS
} GroupColumn;

static const char *const GroupColumnNames[GROUP_NCOLUMNS] = {
	"id", "name", "topics", "ordering", "cursor_txid", "cursor_ticket", "cursor_seq",
	"epoch", "cursor", "generation", "leader_pid", "leader_started", "lease_renewed",
	"shard", "shards"
};

/* A group's row, as a fetch reads it. */
typedef struct GroupRow
{
	Datum		values[GROUP_NCOLUMNS];
	bool		nulls[GROUP_NCOLUMNS];
} GroupRow;

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


/*
 * The attribute numbers of the columns a fetch reads, in the table's
 * descriptor (the order of columns differs between a fresh install and an
 * updated one). False when the table has no lease columns: SQL objects of
 * 0.1.0.
 */
static bool
OutboxGroupColumns(TupleDesc desc, AttrNumber *attnos)
{
	int			c;
	int			i;

	for (c = 0; c < GROUP_NCOLUMNS; c++)
	{
		attnos[c] = InvalidAttrNumber;
		for (i = 0; i < desc->natts; i++)
		{
			Form_pg_attribute att = TupleDescAttr(desc, i);

			if (!att->attisdropped && strcmp(NameStr(att->attname), GroupColumnNames[c]) == 0)
			{
				attnos[c] = att->attnum;
				break;
			}
		}
		if (attnos[c] == InvalidAttrNumber)
			return false;
	}
	return true;
}

/*
 * Splits a group name, "<group>" or "<group>/<shard>" (outbox.split_group_name()),
 * into the group's name and the shard, -1 when none is named.
 */
static text *
OutboxSplitGroupName(text *name, int32 *shard)
{
	const char *s = VARDATA_ANY(name);
	int			len = VARSIZE_ANY_EXHDR(name);
	const char *slash = memchr(s, '/', len);
	int			digits;
	int			i;

	*shard = -1;
	if (slash == NULL)
		return name;
	digits = len - (slash - s) - 1;
	if (digits < 1 || digits > 3 || (digits > 1 && slash[1] == '0'))
		digits = 0;
	for (i = 0; i < digits; i++)
		if (slash[1 + i] < '0' || slash[1 + i] > '9')
			digits = 0;
	if (digits == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid shard name \"%s\"", text_to_cstring(name)),
				 errdetail("A shard is named by its group's name, \"/\" and its number, from 0: \"orders/0\".")));
	*shard = 0;
	for (i = 0; i < digits; i++)
		*shard = *shard * 10 + (slash[1 + i] - '0');
	return cstring_to_text_with_len(s, slash - s);
}

/*
 * Reads the row of a group, or of one shard of it, by the name's index
 * (the group's name and the shard, 0 when "shard" is negative), with a new
 * snapshot (each read sees what committed, and this transaction's own
 * changes, before it). False when there is no such row; also false, with
 * *current set to false, when the SQL objects are those of 0.1.0. The
 * values are copied into the current memory context.
 */
static bool
OutboxReadGroupRow(text *name, int32 shard, GroupRow *row, bool *current)
{
	Relation	groups = table_open(OutboxRelid("groups"), AccessShareLock);
	Relation	index = index_open(OutboxRelid("groups_name_key"), AccessShareLock);
	AttrNumber	attnos[GROUP_NCOLUMNS];
	TupleTableSlot *slot;
	IndexScanDesc scan;
	ScanKeyData keys[2];
	Snapshot	snapshot;
	bool		found = false;
	int			c;

	*current = OutboxGroupColumns(RelationGetDescr(groups), attnos);
	if (*current)
	{
		snapshot = RegisterSnapshot(GetTransactionSnapshot());
		slot = table_slot_create(groups, NULL);
		ScanKeyEntryInitialize(&keys[0], 0, 1, BTEqualStrategyNumber, InvalidOid,
							   index->rd_indcollation[0], F_TEXTEQ, PointerGetDatum(name));
		ScanKeyInit(&keys[1], 2, BTEqualStrategyNumber, F_INT4EQ, Int32GetDatum(Max(shard, 0)));
		scan = index_beginscan(groups, index, snapshot, 2, 0);
		index_rescan(scan, keys, 2, NULL, 0);
		if (index_getnext_slot(scan, ForwardScanDirection, slot))
		{
			found = true;
			slot_getallattrs(slot);
			for (c = 0; c < GROUP_NCOLUMNS; c++)
			{
				Form_pg_attribute att = TupleDescAttr(RelationGetDescr(groups), attnos[c] - 1);

				row->nulls[c] = slot->tts_isnull[attnos[c] - 1];
				row->values[c] = row->nulls[c] ? (Datum) 0 :
					datumCopy(slot->tts_values[attnos[c] - 1], att->attbyval, att->attlen);
			}
		}
		index_endscan(scan);
		ExecDropSingleTupleTableSlot(slot);
		UnregisterSnapshot(snapshot);
	}
	index_close(index, AccessShareLock);
	table_close(groups, AccessShareLock);
	return found;
}

/*
 * Reads the row of the group or shard named "name" (see
 * OutboxReadGroupRow): raises 42704 when there is none, 22023 for a
 * sharded group named without its shard. False, with *current false, when
 * the SQL objects are those of 0.1.0.
 */
static bool
OutboxReadGroup(text *name, GroupRow *row, bool *current)
{
	int32		shard;
	text	   *group = OutboxSplitGroupName(name, &shard);
	int32		shards;

	if (!OutboxReadGroupRow(group, shard, row, current))
	{
		if (!*current)
			return false;
		if (shard > 0 && OutboxReadGroupRow(group, 0, row, current))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("group \"%s\" has no shard %d", text_to_cstring(group), shard),
					 DatumGetInt32(row->values[GROUP_SHARDS]) > 1 ?
					 errhint("Its shards are %s/0 to %s/%d.", text_to_cstring(group), text_to_cstring(group),
							 DatumGetInt32(row->values[GROUP_SHARDS]) - 1) :
					 errhint("It has one shard: \"%s\", also named \"%s/0\".", text_to_cstring(group),
							 text_to_cstring(group))));
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("group \"%s\" does not exist", text_to_cstring(group)),
				 errhint("Create it with outbox_group_create().")));
	}
	shards = DatumGetInt32(row->values[GROUP_SHARDS]);
	if (shard < 0 && shards > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("group \"%s\" has %d shards: name one", text_to_cstring(group), shards),
				 errhint("Its shards are %s/0 to %s/%d; each has its own cursor and leader.",
						 text_to_cstring(group), text_to_cstring(group), shards - 1)));
	return true;
}

/* A transaction id of a snapshot as a full one, by the next full id. */
static uint64
OutboxFullXid(TransactionId xid)
{
	FullTransactionId next = ReadNextFullTransactionId();

	/* xid is at most 2^31 behind the next id (see xid8funcs.c). */
	return U64FromFullTransactionId(next) + (int64) (int32) (xid - XidFromFullTransactionId(next));
}

/* True when this session leads the group by its row, with a fresh lease. */
static bool
OutboxLeadsFreshly(const GroupRow *g)
{
	TimestampTz due;

	if (g->nulls[GROUP_LEADER_PID] || g->nulls[GROUP_LEADER_STARTED] || g->nulls[GROUP_LEASE_RENEWED] ||
		DatumGetInt32(g->values[GROUP_LEADER_PID]) != MyProcPid ||
		DatumGetTimestampTz(g->values[GROUP_LEADER_STARTED]) != MyStartTimestamp)
		return false;
	/* Renewed at most every third of the lease (outbox.lead()). */
	due = TimestampTzPlusMilliseconds(DatumGetTimestampTz(g->values[GROUP_LEASE_RENEWED]),
									  pg_outbox_lease_ms / 3);
	return GetCurrentTimestamp() < due;
}

/* outbox.lead(group_id): takes, keeps or refuses the group (SQL). */
static bool
OutboxLead(int32 group_id)
{
	Datum		arg = Int32GetDatum(group_id);
	bool		isnull;
	bool		leads;

	if (LeadPlan == NULL)
	{
		Oid			argtype = INT4OID;
		SPIPlanPtr	plan = SPI_prepare("SELECT outbox.lead($1)", 1, &argtype);

		if (plan == NULL || SPI_keepplan(plan) != 0)
			elog(ERROR, "pg_outbox: preparing the call of outbox.lead() failed: %s",
				 SPI_result_code_string(SPI_result));
		LeadPlan = plan;
	}
	if (SPI_execute_plan(LeadPlan, &arg, NULL, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "pg_outbox: outbox.lead() failed");
	leads = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	/* What it wrote is seen by the next read of the row. */
	CommandCounterIncrement();
	return !isnull && leads;
}

/* The group's topics (a text[]) into the range; NULL: every topic. */
static void
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
	if (!OutboxReadGroup(name, &g, current))
		return false;

	/* The leader goes on while its lease is fresh; anyone else asks. */
	if (!OutboxLeadsFreshly(&g))
	{
		if (!OutboxLead(DatumGetInt32(g.values[GROUP_ID])))
			return false;
		if (!OutboxReadGroup(name, &g, current))
			elog(ERROR, "pg_outbox: group \"%s\" went away while this session took the lead", text_to_cstring(name));
	}
	if (OutboxNoteGeneration(DatumGetInt32(g.values[GROUP_ID]), DatumGetInt64(g.values[GROUP_GENERATION])) !=
		DatumGetInt64(g.values[GROUP_GENERATION]))
		ereport(ERROR,
				(errcode(ERRCODE_OUTBOX_REWOUND),
				 errmsg("cursor of group \"%s\" was moved by outbox_rewind() while this session led it", text_to_cstring(name)),
				 errdetail("The cursor is at %s now.", TextDatumGetCString(g.values[GROUP_CURSOR])),
				 errhint("Fetch again without \"after\": the next batch starts at the moved cursor.")));

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
 * SQL objects of 0.1.0: outbox.fetch_args() says where the batch lies
 * (and takes the leadership by its advisory lock).
 */
/* A column of outbox.fetch_args()'s row (0.1.0), by name. */
static Datum
OutboxArg(HeapTuple row, TupleDesc desc, const char *name, bool *isnull)
{
	int			column = SPI_fnumber(desc, name);

	if (column <= 0)
		elog(ERROR, "outbox.fetch_args() has no column \"%s\"", name);
	return SPI_getbinval(row, desc, column, isnull);
}

/* Reads outbox.fetch_args()'s row; topics are copied into the current memory. */
static void
OutboxReadArgs(HeapTuple row, TupleDesc desc, FeedRange *a)
{
	bool		isnull;
	int			column;
	Datum		topics;

	a->commit = strcmp(TextDatumGetCString(OutboxArg(row, desc, "ordering", &isnull)), "commit") == 0;
	if (a->commit)
	{
		a->cursor_ticket = DatumGetInt64(OutboxArg(row, desc, "cursor_ticket", &isnull));
		if (isnull)
			elog(ERROR, "outbox.fetch_args() returned no cursor");
		a->horizon = DatumGetInt64(OutboxArg(row, desc, "horizon", &isnull));
		if (isnull)
			elog(ERROR, "outbox.fetch_args() returned no commit horizon");
	}
	else
	{
		a->cursor_txid = U64FromFullTransactionId(
			DatumGetFullTransactionId(OutboxArg(row, desc, "cursor_txid", &isnull)));
		if (isnull)
			elog(ERROR, "outbox.fetch_args() returned no cursor");
	}
	a->cursor_seq = DatumGetInt64(OutboxArg(row, desc, "cursor_seq", &isnull));
	a->limit = DatumGetInt32(OutboxArg(row, desc, "row_limit", &isnull));
	/* No epoch before 0.2.0's SQL (a new library before ALTER EXTENSION UPDATE). */
	column = SPI_fnumber(desc, "epoch");
	a->epoch = column > 0 ? (uint64) DatumGetInt64(SPI_getbinval(row, desc, column, &isnull)) : 0;
	a->below = U64FromFullTransactionId(DatumGetFullTransactionId(OutboxArg(row, desc, "below", &isnull)));
	if (isnull)
		elog(ERROR, "outbox.fetch_args() returned no transaction id bound");

	/* Copied: the row goes with the next SPI call. */
	topics = OutboxArg(row, desc, "topics", &isnull);
	OutboxRangeTopics(a, isnull ? NULL : DatumGetArrayTypePCopy(topics));
}


/* Where the batch lies by outbox.fetch_args() (0.1.0); false when another session leads. */
static bool
OutboxPlaceBatchByArgs(Datum *args, char *nulls, FeedRange *a)
{
	if (FetchArgsPlan == NULL)
	{
		Oid			argtypes[3] = {TEXTOID, INT4OID, TEXTOID};
		SPIPlanPtr	plan = SPI_prepare("SELECT * FROM outbox.fetch_args($1, $2, $3)", 3, argtypes);

		if (plan == NULL || SPI_keepplan(plan) != 0)
			elog(ERROR, "pg_outbox: preparing the call of outbox.fetch_args() failed: %s",
				 SPI_result_code_string(SPI_result));
		FetchArgsPlan = plan;
	}
	if (SPI_execute_plan(FetchArgsPlan, args, nulls, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "pg_outbox: outbox.fetch_args() failed");
	if (SPI_processed != 1)
		return false;
	memset(a, 0, sizeof(*a));
	a->name = nulls[0] == 'n' ? "" : TextDatumGetCString(args[0]);
	OutboxReadArgs(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, a);
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

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");

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

	SPI_finish();
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
