/*-------------------------------------------------------------------------
 *
 * feed.c
 *	  Reading a batch of a group's feed by index: the scanner behind
 *	  outbox_fetch().
 *
 * fetch.c decides where a batch lies (a FeedRange); this file reads it
 * with the index access method, the way the writer writes events: no query
 * is parsed or planned per batch.
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
 * Layering: calls tables.c (where the tables are), writer.c (the partition
 * of a transaction) and position.c (the text of a position).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/attmap.h"
#include "access/detoast.h"
#include "access/genam.h"
#include "access/htup_details.h"
#include "access/relscan.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/index.h"
#include "catalog/namespace.h"
#include "catalog/partition.h"
#include "catalog/pg_am.h"
#include "catalog/pg_index.h"
#include "catalog/pg_type.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "partitioning/partbounds.h"
#include "partitioning/partdesc.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/tuplestore.h"
#include "utils/xid8.h"

#include "feed.h"
#include "pack.h"
#include "position.h"
#include "sqlstates.h"
#include "tables.h"
#include "writer.h"

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
 * The index of groups with "shards" shards on outbox.event, (shard, txid,
 * seq): see outbox.ensure_shard_index().
 */
static Oid
OutboxShardIndex(int shards)
{
	char		name[NAMEDATALEN];
	Oid			relid;

	snprintf(name, sizeof(name), "event_shards_%d_idx", shards);
	relid = get_relname_relid(name, get_namespace_oid(OUTBOX_SCHEMA, false));
	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the index that reads the shards of groups with %d shards is missing", shards),
				 errdetail("Index \"%s.%s\" does not exist; a restore makes the extension's tables without it.",
						   OUTBOX_SCHEMA, name),
				 errhint("Run outbox_maintain(), which makes it.")));
	return relid;
}

/*
 * Opens the copy, in the scan's partition, of index "parent_index" of the
 * partitioned table.
 */
static Relation
OutboxOpenChildIndex(const PartScan *ps, Oid parent_index)
{
	Oid			child = index_get_partition(ps->heap, parent_index);

	if (!OidIsValid(child))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("partition \"%s.%s\" has lost an index of pg_outbox",
						OUTBOX_SCHEMA, RelationGetRelationName(ps->heap)),
				 errhint("Create index \"%s\" of the partitioned table again.", get_rel_name(parent_index))));
	return index_open(child, AccessShareLock);
}

/*
 * Opens a scan of partition "relid" of "parent" in the order of its index
 * on "columns", or of its copy of "parent_index" when that is valid, with
 * "nkeys" scan keys given at index_rescan().
 */
static void
OutboxPartScanOpen(PartScan *ps, Relation parent, Oid relid, const int *columns, int ncolumns,
				   Oid parent_index, int nkeys, Snapshot snapshot)
{
	ps->relid = relid;
	ps->heap = table_open(relid, AccessShareLock);
	ps->map = build_attrmap_by_name_if_req(RelationGetDescr(ps->heap), RelationGetDescr(parent));
	ps->index = OidIsValid(parent_index) ? OutboxOpenChildIndex(ps, parent_index) :
		OutboxOpenIndex(ps, columns, ncolumns);
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
OutboxPartScansOpen(Relation parent, List *parts, const int *columns, int ncolumns, Oid parent_index,
					ScanKey keys, int nkeys, Snapshot snapshot)
{
	PartScan   *scans = palloc0(sizeof(PartScan) * Max(list_length(parts), 1));
	int			i;

	for (i = 0; i < list_length(parts); i++)
	{
		OutboxPartScanOpen(&scans[i], parent, list_nth_oid(parts, i), columns, ncolumns, parent_index,
						   nkeys, snapshot);
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
OutboxTopicWanted(const FeedRange *a, Datum topic)
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
 * Whether the batch takes the event at "pos" (values and nulls: its
 * columns, the payload and headers detoasted), checked before anything of
 * it is written, from the size of its JSON text computed without printing
 * it (pack.c). An event whose payload and headers print as more than
 * OUTBOX_MAX_EVENT_TEXT can never be published: met first in a batch, it
 * is refused (OB004) with what it takes to pass it; met later, the batch
 * stops before it, so that the events before it are published and the
 * next batch meets it first. A packed batch also stops before an event
 * that would take it past FEED_PACKED_MAX_BYTES, unless the event comes
 * first. Before these checks, a fetch printed such an event whole, up to
 * the gigabyte a value can hold, and failed every time it was called.
 */
static bool
OutboxEventFits(FeedBatch *out, const FeedRange *a, const char *pos, const Datum *values, const bool *nulls)
{
	const Jsonb *payload = nulls[EVENT_PAYLOAD] ? NULL : DatumGetJsonbP(values[EVENT_PAYLOAD]);
	const Jsonb *headers = nulls[EVENT_HEADERS] ? NULL : DatumGetJsonbP(values[EVENT_HEADERS]);
	uint64		limit = OUTBOX_MAX_EVENT_TEXT;
	uint64		overhead = 0;
	uint64		size;

	if (payload == NULL)
		return true;			/* never written by outbox_emit() */
	if (out->packed != NULL && out->count > 0)
	{
		overhead = OutboxPackEventOverhead(pos, values, nulls);
		limit = Min(limit, (uint64) Max((int64) FEED_PACKED_MAX_BYTES - out->packed->len - (int64) overhead, 0));
	}
	size = OutboxEventTextSize(payload, headers, limit);
	if (size <= limit)
		return true;
	if (out->count > 0)
	{
		out->stopped = true;
		return false;
	}
	ereport(ERROR,
			(errcode(ERRCODE_OUTBOX_EVENT_TOO_LARGE),
			 errmsg("event at position %s of group \"%s\" is too large to publish", pos, a->name),
			 errdetail("Its payload and headers print as " UINT64_FORMAT " bytes of JSON text, more than the %d bytes any event may print as (the largest pg_outbox.max_payload_size): it was written before outbox_emit() checked the size of JSON text, or not by outbox_emit().",
					   size, OUTBOX_MAX_EVENT_TEXT),
			 errhint("Pass it with SELECT outbox_skip(%s, %s, '<reason>'): the group goes on after it, and outbox.skipped_events records it.",
					 quote_literal_cstr(a->name), quote_literal_cstr(pos))));
	pg_unreachable();
}

/*
 * Adds the event in the scan's current row to the batch, at position
 * "<order>-<seq>" (order: the transaction id, or the commit ticket), if the
 * batch takes its topic and the event fits (OutboxEventFits; when it does
 * not, the batch stops before it).
 */
static void
OutboxPutEvent(FeedBatch *out, const FeedRange *a, PartScan *ps, uint64 order)
{
	Datum		values[FEED_NATTS];
	bool		nulls[FEED_NATTS];
	char		pos[OUTBOX_POSITION_LEN];
	int			i;

	values[1 + EVENT_TOPIC] = OutboxColumn(ps, EVENT_TOPIC, &nulls[1 + EVENT_TOPIC]);
	if (!OutboxTopicWanted(a, values[1 + EVENT_TOPIC]))
		return;
	for (i = 0; i < EVENT_NATTS; i++)
		if (i != EVENT_TOPIC)
			values[1 + i] = OutboxColumn(ps, i, &nulls[1 + i]);
	OutboxFormatPosition(pos, order, a->epoch, DatumGetInt64(values[1 + EVENT_SEQ]));
	if (out->packed != NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(out->scratch);
		bool		fits;

		/* Detoasted once, for the check and the packing. */
		if (!nulls[1 + EVENT_PAYLOAD])
			values[1 + EVENT_PAYLOAD] = PointerGetDatum(PG_DETOAST_DATUM(values[1 + EVENT_PAYLOAD]));
		if (!nulls[1 + EVENT_HEADERS])
			values[1 + EVENT_HEADERS] = PointerGetDatum(PG_DETOAST_DATUM(values[1 + EVENT_HEADERS]));
		fits = OutboxEventFits(out, a, pos, values + 1, nulls + 1);
		if (fits)
		{
			if (out->count == 0)
				out->first_created_at = DatumGetTimestampTz(values[1 + EVENT_CREATED_AT]);
			OutboxPackEvent(out->packed, pos, values + 1, nulls + 1);
		}
		MemoryContextSwitchTo(old);
		MemoryContextReset(out->scratch);
		if (fits)
			out->count++;
		return;
	}
	/*
	 * Rows keep their values as stored (the client prints them); the check
	 * reads detoasted copies, in a context emptied after each event.
	 */
	{
		MemoryContext old = MemoryContextSwitchTo(out->scratch);
		Datum		detoasted[EVENT_NATTS];
		bool		fits;

		memcpy(detoasted, values + 1, sizeof(detoasted));
		if (!nulls[1 + EVENT_PAYLOAD])
			detoasted[EVENT_PAYLOAD] = PointerGetDatum(PG_DETOAST_DATUM(values[1 + EVENT_PAYLOAD]));
		if (!nulls[1 + EVENT_HEADERS])
			detoasted[EVENT_HEADERS] = PointerGetDatum(PG_DETOAST_DATUM(values[1 + EVENT_HEADERS]));
		fits = OutboxEventFits(out, a, pos, detoasted, nulls + 1);
		MemoryContextSwitchTo(old);
		MemoryContextReset(out->scratch);
		if (!fits)
			return;
	}
	values[FEED_POS] = CStringGetTextDatum(pos);
	nulls[FEED_POS] = false;
	tuplestore_putvalues(out->store, out->desc, values, nulls);
	pfree(DatumGetPointer(values[FEED_POS]));
	out->count++;
}

/*
 * xid8 order: events after (cursor_txid, cursor_seq) below "below", in
 * (txid, seq) order, merged across the partitions that may hold them. A
 * shard of a sharded group reads its index on (shard, txid, seq) instead
 * of the primary key: the rows of its own shard only.
 */
void
OutboxReadFeed(const FeedRange *a, FeedBatch *out, Snapshot snapshot)
{
	static const int key_columns[] = {EVENT_TXID, EVENT_SEQ};
	Relation	parent = table_open(OutboxRelid("event"), AccessShareLock);
	List	   *parts = OutboxPartitionsBetween(parent, a->cursor_txid, a->below);
	int			nparts = list_length(parts);
	bool		sharded = a->shards > 1;
	AttrNumber	txid_attno = sharded ? 2 : 1;
	PartScan   *scans;
	ScanKeyData keys[3];
	ScanKeyData row[2];
	int			nkeys = 0;
	int			i;

	/* [shard = a->shard AND] (txid, seq) > (cursor_txid, cursor_seq) AND txid < below */
	if (sharded)
		ScanKeyInit(&keys[nkeys++], 1, BTEqualStrategyNumber, F_INT4EQ, Int32GetDatum(a->shard));
	ScanKeyEntryInitialize(&row[0], SK_ROW_MEMBER, txid_attno, BTGreaterStrategyNumber, XID8OID, InvalidOid,
						   F_XID8CMP, FullTransactionIdGetDatum(FullTransactionIdFromU64(a->cursor_txid)));
	ScanKeyEntryInitialize(&row[1], SK_ROW_MEMBER | SK_ROW_END, txid_attno + 1, BTGreaterStrategyNumber, INT8OID,
						   InvalidOid, F_BTINT8CMP, Int64GetDatum(a->cursor_seq));
	ScanKeyEntryInitialize(&keys[nkeys++], SK_ROW_HEADER, txid_attno, BTGreaterStrategyNumber, InvalidOid,
						   InvalidOid, InvalidOid, PointerGetDatum(row));
	ScanKeyInit(&keys[nkeys++], txid_attno, BTLessStrategyNumber, F_XID8LT,
				FullTransactionIdGetDatum(FullTransactionIdFromU64(a->below)));
	scans = OutboxPartScansOpen(parent, parts, key_columns, 2,
								sharded ? OutboxShardIndex(a->shards) : InvalidOid, keys, nkeys, snapshot);

	while (!FeedBatchFull(out, a))
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
 * cursor_seq in the cursor's own transaction. A shard of a sharded group
 * reads each transaction's events of its own shard, by its index on
 * (shard, txid, seq); it reads every marker in the range.
 */
void
OutboxReadCommitFeed(const FeedRange *a, FeedBatch *out, Snapshot snapshot)
{
	static const int ticket_column[] = {MARKER_TICKET};
	static const int key_columns[] = {EVENT_TXID, EVENT_SEQ};
	Relation	markers = table_open(OutboxRelid("commit_log"), AccessShareLock);
	Relation	events = table_open(OutboxRelid("event"), AccessShareLock);
	List	   *parts = OutboxPartitionsBetween(markers, 0, a->below);
	int			nparts = list_length(parts);
	PartScan   *scans;
	List	   *event_scans = NIL;	/* of PartScan *, opened as needed */
	bool		sharded = a->shards > 1;
	Oid			shard_index = sharded ? OutboxShardIndex(a->shards) : InvalidOid;
	int			k = sharded ? 1 : 0;	/* where (txid, seq) start in the event index */
	ScanKeyData keys[3];
	ListCell   *lc;
	int			i;

	/* ticket >= cursor_ticket AND ticket <= horizon */
	ScanKeyInit(&keys[0], 1, BTGreaterEqualStrategyNumber, F_INT8GE, Int64GetDatum(a->cursor_ticket));
	ScanKeyInit(&keys[1], 1, BTLessEqualStrategyNumber, F_INT8LE, Int64GetDatum(a->horizon));
	scans = OutboxPartScansOpen(markers, parts, ticket_column, 1, InvalidOid, keys, 2, snapshot);

	while (!FeedBatchFull(out, a))
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
			OutboxPartScanOpen(ev, events, relid, key_columns, 2, shard_index, 2 + k, snapshot);
			event_scans = lappend(event_scans, ev);
		}
		/* [shard = a->shard AND] txid = the marker's AND seq > ... */
		if (sharded)
			ScanKeyInit(&keys[0], 1, BTEqualStrategyNumber, F_INT4EQ, Int32GetDatum(a->shard));
		ScanKeyInit(&keys[k], k + 1, BTEqualStrategyNumber, F_XID8EQ,
					FullTransactionIdGetDatum(FullTransactionIdFromU64(txid)));
		ScanKeyInit(&keys[k + 1], k + 2, BTGreaterStrategyNumber, F_INT8GT,
					Int64GetDatum(ticket == a->cursor_ticket ? a->cursor_seq : 0));
		index_rescan(ev->scan, keys, 2 + k, NULL, 0);
		while (!FeedBatchFull(out, a) && OutboxPartScanNext(ev))
			OutboxPutEvent(out, a, ev, (uint64) ticket);
	}

	foreach(lc, event_scans)
		OutboxPartScanClose(lfirst(lc));
	OutboxPartScansClose(scans, nparts);
	table_close(events, NoLock);
	table_close(markers, NoLock);
}
