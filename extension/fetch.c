/*-------------------------------------------------------------------------
 *
 * fetch.c
 *	  outbox_fetch(): the next batch of a group's feed.
 *
 * outbox.fetch_args() (SQL) checks the arguments, takes the group's
 * leadership and says where the batch starts: after which position, below
 * which transaction id and, in commit order, up to which commit ticket.
 * This file reads the batch from there with the index access method, the
 * way emit.c writes events: no query is parsed or planned per batch.
 *
 * A relay that keeps up with a trickle of commits asks for a batch many
 * hundreds of times a second, and each batch then holds a few events.
 * Planning a batch query for each (a custom plan with the cursor as
 * constants, across the partitions) cost the server several times what
 * reading those events costs, and the relay's backend was the busiest
 * process of the machine. Reading by index is also O(batch) by
 * construction (I-10): no plan, generic or custom, can turn a batch into a
 * scan of the backlog.
 *
 * What a batch holds is defined in SQL by outbox.backlog() and
 * outbox.commit_backlog(), which the statistics read too; the feed and
 * commit_order regression tests check that a batch is the head of that
 * backlog, in its order, in each case the scans below tell apart.
 *
 * xid8 order: the events after the cursor (txid, seq) and below the
 * horizon, read from the primary key index of each partition that may hold
 * them and merged in (txid, seq) order. Range partitions do not overlap;
 * the default partition (normally empty) may hold any transaction id.
 *
 * Commit order: the markers of outbox.commit_log after the cursor's ticket
 * and up to the commit horizon, read from the ticket index of each marker
 * partition and merged in ticket order; for each marker, the events of its
 * transaction in seq order, from the partition that holds that transaction.
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
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/attmap.h"
#include "access/genam.h"
#include "access/htup_details.h"
#include "access/relscan.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "catalog/pg_am.h"
#include "catalog/pg_index.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/latch.h"
#include "partitioning/partbounds.h"
#include "partitioning/partdesc.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/fmgroids.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
#include "utils/xid8.h"

#include "pg_outbox.h"

/*
 * The longest wait for events, in microseconds. While it waits, the calling
 * statement's snapshot holds this backend's xmin, and with it the horizon
 * of VACUUM for the whole cluster: a function cannot let go of the snapshot
 * of the query that called it. A client that waits longer calls again.
 */
#define OUTBOX_FETCH_MAX_WAIT		(10 * USECS_PER_SEC)

/* Memory kept between batches, at most. */
#define OUTBOX_FETCH_KEEP_BYTES		(8 * 1024 * 1024)

/* Columns of outbox_fetch()'s result: the position, then the event's. */
#define FETCH_POS			0
#define FETCH_NATTS			(1 + EVENT_NATTS)

PG_FUNCTION_INFO_V1(outbox_fetch);

/* Where batches' rows are kept, and how many batches are in use. */
static MemoryContext FetchContext = NULL;
static int	FetchesInUse = 0;

/* The call of outbox.fetch_args(), prepared once per session. */
static SPIPlanPtr FetchArgsPlan = NULL;

/* Where a batch starts and ends: a row of outbox.fetch_args(). */
typedef struct FetchArgs
{
	bool		commit;			/* commit order, else xid8 order */
	uint64		cursor_txid;	/* xid8 order: after (cursor_txid, cursor_seq) */
	int64		cursor_ticket;	/* commit order: after (cursor_ticket, cursor_seq) */
	int64		cursor_seq;
	int64		horizon;		/* commit order: tickets up to this one */
	uint64		below;			/* transaction ids below this one */
	int64		limit;			/* rows at most */
	uint64		epoch;			/* added to the order part of positions */
	int			ntopics;		/* -1: every topic */
	text	  **topics;
} FetchArgs;

/* Rows of the batch, as they are read. */
typedef struct FetchOut
{
	Tuplestorestate *store;
	TupleDesc	desc;
	int64		count;
} FetchOut;

/* A scan of one partition in the order of one of its btree indexes. */
typedef struct PartScan
{
	Oid			relid;
	Relation	heap;
	Relation	index;
	IndexScanDesc scan;
	TupleTableSlot *slot;
	AttrMap    *map;			/* the parent's columns in the partition; NULL: same */
	bool		valid;			/* the slot holds the scan's current row */
} PartScan;

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

/* Reads a transaction id bound of a partition. */
static inline uint64
OutboxBound(Datum bound)
{
	return U64FromFullTransactionId(DatumGetFullTransactionId(bound));
}

/*
 * The partitions of "parent" (partitioned by range of transaction id) that
 * may hold transaction ids in [low, high): the range partitions in the
 * order of their bounds, then the default partition.
 */
static List *
OutboxPartitionsBetween(Relation parent, uint64 low, uint64 high)
{
	PartitionDesc desc = RelationGetPartitionDesc(parent, true);
	PartitionBoundInfo b = desc->boundinfo;
	List	   *oids = NIL;
	int			i;

	if (b == NULL)
		return NIL;
	if (b->strategy != PARTITION_STRATEGY_RANGE)
		elog(ERROR, "\"%s.%s\" is not partitioned by range", OUTBOX_SCHEMA, RelationGetRelationName(parent));

	/* Partition indexes[i] holds [datums[i - 1], datums[i]). */
	for (i = 0; i <= b->ndatums; i++)
	{
		int			part = b->indexes[i];

		if (part < 0)
			continue;
		if (i < b->ndatums && b->kind[i][0] == PARTITION_RANGE_DATUM_VALUE &&
			OutboxBound(b->datums[i][0]) <= low)
			continue;
		if (i > 0 && b->kind[i - 1][0] == PARTITION_RANGE_DATUM_VALUE &&
			OutboxBound(b->datums[i - 1][0]) >= high)
			continue;
		oids = lappend_oid(oids, desc->oids[part]);
	}
	if (b->default_index >= 0)
		oids = lappend_oid(oids, desc->oids[b->default_index]);
	return oids;
}

/* The partition's attribute number of a column of the parent (0-based). */
static inline AttrNumber
OutboxAttno(const PartScan *ps, int column)
{
	return ps->map != NULL ? ps->map->attnums[column] : column + 1;
}

/*
 * Opens the btree index of a partition whose leading key columns are the
 * parent's "columns" (0-based), in ascending order: the partition's copy of
 * the parent's index.
 */
static Relation
OutboxOpenIndex(const PartScan *ps, const int *columns, int ncolumns)
{
	List	   *indexes = RelationGetIndexList(ps->heap);
	ListCell   *lc;

	foreach(lc, indexes)
	{
		Relation	index = index_open(lfirst_oid(lc), AccessShareLock);
		Form_pg_index form = index->rd_index;
		bool		match;
		int			k;

		match = index->rd_rel->relam == BTREE_AM_OID && form->indisvalid &&
			form->indnkeyatts >= ncolumns &&
			heap_attisnull(index->rd_indextuple, Anum_pg_index_indpred, NULL);
		for (k = 0; match && k < ncolumns; k++)
			match = form->indkey.values[k] == OutboxAttno(ps, columns[k]) &&
				(index->rd_indoption[k] & INDOPTION_DESC) == 0;
		if (match)
		{
			list_free(indexes);
			return index;
		}
		index_close(index, AccessShareLock);
	}
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("partition \"%s.%s\" has lost an index of pg_outbox",
					OUTBOX_SCHEMA, RelationGetRelationName(ps->heap)),
			 errhint("Reinstall the extension, or create the index of the partitioned table again.")));
	pg_unreachable();
}

/*
 * Opens a scan of partition "relid" of "parent" in the order of its index
 * on "columns", with "nkeys" scan keys given at index_rescan().
 */
static void
OutboxPartScanOpen(PartScan *ps, Relation parent, Oid relid, const int *columns, int ncolumns,
				   int nkeys, Snapshot snapshot)
{
	ps->relid = relid;
	ps->heap = table_open(relid, AccessShareLock);
	ps->map = build_attrmap_by_name_if_req(RelationGetDescr(ps->heap), RelationGetDescr(parent));
	ps->index = OutboxOpenIndex(ps, columns, ncolumns);
	ps->slot = table_slot_create(ps->heap, NULL);
	ps->scan = index_beginscan(ps->heap, ps->index, snapshot, nkeys, 0);
	ps->valid = false;
}

/* Moves to the scan's next row. */
static inline bool
OutboxPartScanNext(PartScan *ps)
{
	CHECK_FOR_INTERRUPTS();
	ps->valid = index_getnext_slot(ps->scan, ForwardScanDirection, ps->slot);
	return ps->valid;
}

static void
OutboxPartScanClose(PartScan *ps)
{
	index_endscan(ps->scan);
	ExecDropSingleTupleTableSlot(ps->slot);
	index_close(ps->index, NoLock);
	table_close(ps->heap, NoLock);
	if (ps->map != NULL)
		free_attrmap(ps->map);
}

/*
 * Opens a scan of each partition of "parent" in "parts", in the order of
 * its index on "columns", positioned on its first row after "keys".
 */
static PartScan *
OutboxPartScansOpen(Relation parent, List *parts, const int *columns, int ncolumns,
					ScanKey keys, int nkeys, Snapshot snapshot)
{
	PartScan   *scans = palloc0(sizeof(PartScan) * Max(list_length(parts), 1));
	int			i;

	for (i = 0; i < list_length(parts); i++)
	{
		OutboxPartScanOpen(&scans[i], parent, list_nth_oid(parts, i), columns, ncolumns, nkeys, snapshot);
		index_rescan(scans[i].scan, keys, nkeys, NULL, 0);
		OutboxPartScanNext(&scans[i]);
	}
	return scans;
}

static void
OutboxPartScansClose(PartScan *scans, int nscans)
{
	int			i;

	for (i = 0; i < nscans; i++)
		OutboxPartScanClose(&scans[i]);
}

/* A column of the parent (0-based) in the scan's current row. */
static inline Datum
OutboxColumn(PartScan *ps, int column, bool *isnull)
{
	return slot_getattr(ps->slot, OutboxAttno(ps, column), isnull);
}

static inline uint64
OutboxTxid(PartScan *ps, int column)
{
	bool		isnull;

	return U64FromFullTransactionId(DatumGetFullTransactionId(OutboxColumn(ps, column, &isnull)));
}

static inline int64
OutboxInt8(PartScan *ps, int column)
{
	bool		isnull;

	return DatumGetInt64(OutboxColumn(ps, column, &isnull));
}

/* Whether the batch takes events of this topic. */
static bool
OutboxTopicWanted(const FetchArgs *a, Datum topic)
{
	text	   *t;
	int			len;
	int			i;

	if (a->ntopics < 0)
		return true;
	t = DatumGetTextPP(topic);
	len = VARSIZE_ANY_EXHDR(t);
	for (i = 0; i < a->ntopics; i++)
		if (a->topics[i] != NULL && VARSIZE_ANY_EXHDR(a->topics[i]) == len &&
			memcmp(VARDATA_ANY(a->topics[i]), VARDATA_ANY(t), len) == 0)
			return true;
	return false;
}

/*
 * Adds the event in the scan's current row to the batch, at position
 * "<order>-<seq>" (order: the transaction id, or the commit ticket), if the
 * batch takes its topic.
 */
static void
OutboxPutEvent(FetchOut *out, const FetchArgs *a, PartScan *ps, uint64 order)
{
	Datum		values[FETCH_NATTS];
	bool		nulls[FETCH_NATTS];
	char		pos[64];
	int			i;

	values[1 + EVENT_TOPIC] = OutboxColumn(ps, EVENT_TOPIC, &nulls[1 + EVENT_TOPIC]);
	if (!OutboxTopicWanted(a, values[1 + EVENT_TOPIC]))
		return;
	for (i = 0; i < EVENT_NATTS; i++)
		if (i != EVENT_TOPIC)
			values[1 + i] = OutboxColumn(ps, i, &nulls[1 + i]);
	if (order > PG_UINT64_MAX - a->epoch)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("position of event beyond the range of stream ids"),
				 errdetail("Transaction id or ticket " UINT64_FORMAT " plus the group's epoch " UINT64_FORMAT " is above 2^64 - 1.",
						   order, a->epoch)));
	snprintf(pos, sizeof(pos), UINT64_FORMAT "-" INT64_FORMAT, order + a->epoch,
			 DatumGetInt64(values[1 + EVENT_SEQ]));
	values[FETCH_POS] = CStringGetTextDatum(pos);
	nulls[FETCH_POS] = false;
	tuplestore_putvalues(out->store, out->desc, values, nulls);
	pfree(DatumGetPointer(values[FETCH_POS]));
	out->count++;
}

/*
 * xid8 order: events after (cursor_txid, cursor_seq) below "below", in
 * (txid, seq) order, merged across the partitions that may hold them.
 */
static void
OutboxReadFeed(const FetchArgs *a, FetchOut *out, Snapshot snapshot)
{
	static const int key_columns[] = {EVENT_TXID, EVENT_SEQ};
	Relation	parent = table_open(OutboxRelid("event"), AccessShareLock);
	List	   *parts = OutboxPartitionsBetween(parent, a->cursor_txid, a->below);
	int			nparts = list_length(parts);
	PartScan   *scans;
	ScanKeyData keys[2];
	ScanKeyData row[2];
	int			i;

	/* (txid, seq) > (cursor_txid, cursor_seq) AND txid < below */
	ScanKeyEntryInitialize(&row[0], SK_ROW_MEMBER, 1, BTGreaterStrategyNumber, XID8OID, InvalidOid,
						   F_XID8CMP, FullTransactionIdGetDatum(FullTransactionIdFromU64(a->cursor_txid)));
	ScanKeyEntryInitialize(&row[1], SK_ROW_MEMBER | SK_ROW_END, 2, BTGreaterStrategyNumber, INT8OID,
						   InvalidOid, F_BTINT8CMP, Int64GetDatum(a->cursor_seq));
	ScanKeyEntryInitialize(&keys[0], SK_ROW_HEADER, 1, BTGreaterStrategyNumber, InvalidOid, InvalidOid,
						   InvalidOid, PointerGetDatum(row));
	ScanKeyInit(&keys[1], 1, BTLessStrategyNumber, F_XID8LT,
				FullTransactionIdGetDatum(FullTransactionIdFromU64(a->below)));
	scans = OutboxPartScansOpen(parent, parts, key_columns, 2, keys, 2, snapshot);

	while (out->count < a->limit)
	{
		PartScan   *next = NULL;
		uint64		next_txid = 0;
		int64		next_seq = 0;

		for (i = 0; i < nparts; i++)
		{
			uint64		txid;
			int64		seq;

			if (!scans[i].valid)
				continue;
			txid = OutboxTxid(&scans[i], EVENT_TXID);
			seq = OutboxInt8(&scans[i], EVENT_SEQ);
			if (next == NULL || txid < next_txid || (txid == next_txid && seq < next_seq))
			{
				next = &scans[i];
				next_txid = txid;
				next_seq = seq;
			}
		}
		if (next == NULL)
			break;
		OutboxPutEvent(out, a, next, next_txid);
		OutboxPartScanNext(next);
	}

	OutboxPartScansClose(scans, nparts);
	table_close(parent, NoLock);
}

/*
 * Commit order: the events of the transactions whose tickets are after
 * cursor_ticket and at most the horizon, in (ticket, seq) order, after
 * cursor_seq in the cursor's own transaction.
 */
static void
OutboxReadCommitFeed(const FetchArgs *a, FetchOut *out, Snapshot snapshot)
{
	static const int ticket_column[] = {MARKER_TICKET};
	static const int key_columns[] = {EVENT_TXID, EVENT_SEQ};
	Relation	markers = table_open(OutboxRelid("commit_log"), AccessShareLock);
	Relation	events = table_open(OutboxRelid("event"), AccessShareLock);
	List	   *parts = OutboxPartitionsBetween(markers, 0, a->below);
	int			nparts = list_length(parts);
	PartScan   *scans;
	List	   *event_scans = NIL;	/* of PartScan *, opened as needed */
	ScanKeyData keys[2];
	ListCell   *lc;
	int			i;

	/* ticket >= cursor_ticket AND ticket <= horizon */
	ScanKeyInit(&keys[0], 1, BTGreaterEqualStrategyNumber, F_INT8GE, Int64GetDatum(a->cursor_ticket));
	ScanKeyInit(&keys[1], 1, BTLessEqualStrategyNumber, F_INT8LE, Int64GetDatum(a->horizon));
	scans = OutboxPartScansOpen(markers, parts, ticket_column, 1, keys, 2, snapshot);

	while (out->count < a->limit)
	{
		PartScan   *marker = NULL;
		PartScan   *ev = NULL;
		int64		ticket = 0;
		uint64		txid;
		Oid			relid;

		for (i = 0; i < nparts; i++)
		{
			int64		t;

			if (!scans[i].valid)
				continue;
			t = OutboxInt8(&scans[i], MARKER_TICKET);
			if (marker == NULL || t < ticket)
			{
				marker = &scans[i];
				ticket = t;
			}
		}
		if (marker == NULL)
			break;
		txid = OutboxTxid(marker, MARKER_TXID);
		OutboxPartScanNext(marker);
		if (txid >= a->below)
			continue;

		/* txid = the marker's AND seq > the cursor's in its own transaction */
		relid = OutboxPartitionOf(events, FullTransactionIdGetDatum(FullTransactionIdFromU64(txid)));
		foreach(lc, event_scans)
		{
			if (((PartScan *) lfirst(lc))->relid == relid)
				ev = lfirst(lc);
		}
		if (ev == NULL)
		{
			ev = palloc0(sizeof(PartScan));
			OutboxPartScanOpen(ev, events, relid, key_columns, 2, 2, snapshot);
			event_scans = lappend(event_scans, ev);
		}
		ScanKeyInit(&keys[0], 1, BTEqualStrategyNumber, F_XID8EQ,
					FullTransactionIdGetDatum(FullTransactionIdFromU64(txid)));
		ScanKeyInit(&keys[1], 2, BTGreaterStrategyNumber, F_INT8GT,
					Int64GetDatum(ticket == a->cursor_ticket ? a->cursor_seq : 0));
		index_rescan(ev->scan, keys, 2, NULL, 0);
		while (out->count < a->limit && OutboxPartScanNext(ev))
			OutboxPutEvent(out, a, ev, (uint64) ticket);
	}

	foreach(lc, event_scans)
		OutboxPartScanClose(lfirst(lc));
	OutboxPartScansClose(scans, nparts);
	table_close(events, NoLock);
	table_close(markers, NoLock);
}

/* A column of outbox.fetch_args()'s row, by name. */
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
OutboxReadArgs(HeapTuple row, TupleDesc desc, FetchArgs *a)
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

	topics = OutboxArg(row, desc, "topics", &isnull);
	a->ntopics = -1;
	if (!isnull)
	{
		Datum	   *elems;
		bool	   *elem_nulls;
		int			i;

		deconstruct_array(DatumGetArrayTypePCopy(topics), TEXTOID, -1, false, TYPALIGN_INT,
						  &elems, &elem_nulls, &a->ntopics);
		a->topics = palloc(sizeof(text *) * Max(a->ntopics, 1));
		for (i = 0; i < a->ntopics; i++)
			a->topics[i] = elem_nulls[i] ? NULL : DatumGetTextPP(elems[i]);
	}
}

/*
 * Reads the group's next batch into "out" (outbox.fetch_args()'s arguments:
 * group name, batch size, after). False when another session leads.
 */
static bool
OutboxReadBatch(Datum *args, char *nulls, FetchOut *out)
{
	FetchArgs	a;

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

	memset(&a, 0, sizeof(a));
	OutboxReadArgs(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, &a);

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
 * outbox_fetch(group_name, batch_size, after, wait): the rows of the
 * group's next batch, in feed order; none while another session leads the
 * group. An empty batch waits up to "wait" for events.
 */
Datum
outbox_fetch(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Datum		args[3];
	char		nulls[3];
	TupleDesc	tupdesc;
	FetchOut	out;
	MemoryContext oldcontext;
	MemoryContextCallback *done;
	long		wait_ms = 0;
	int			i;

	if (rsinfo == NULL || !IsA(rsinfo, ReturnSetInfo) ||
		(rsinfo->allowedModes & SFRM_Materialize) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("set-valued function called in context that cannot accept a set")));
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	if (tupdesc->natts != FETCH_NATTS)
		elog(ERROR, "outbox_fetch() returns %d columns, expected %d", tupdesc->natts, FETCH_NATTS);

	if (FetchContext == NULL)
		FetchContext = AllocSetContextCreate(TopMemoryContext, "pg_outbox fetch",
											 ALLOCSET_DEFAULT_SIZES);

	/* The batch is in use until the calling query's memory goes away. */
	done = MemoryContextAlloc(rsinfo->econtext->ecxt_per_query_memory, sizeof(MemoryContextCallback));
	done->func = OutboxFetchDone;
	done->arg = NULL;
	MemoryContextRegisterResetCallback(rsinfo->econtext->ecxt_per_query_memory, done);
	FetchesInUse++;

	oldcontext = MemoryContextSwitchTo(FetchContext);
	out.store = tuplestore_begin_heap((rsinfo->allowedModes & SFRM_Materialize_Random) != 0,
									  false, work_mem);
	MemoryContextSwitchTo(oldcontext);
	out.desc = CreateTupleDescCopy(tupdesc);
	out.count = 0;
	rsinfo->returnMode = SFRM_Materialize;
	rsinfo->setResult = out.store;
	rsinfo->setDesc = out.desc;

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
			while (OutboxReadBatch(args, nulls, &out) && out.count == 0 &&
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
		(void) OutboxReadBatch(args, nulls, &out);

	SPI_finish();
	return (Datum) 0;
}
