/*-------------------------------------------------------------------------
 *
 * writer.c
 *	  The one path that writes rows into pg_outbox's tables partitioned by
 *	  transaction id: outbox.event (events) and outbox.commit_log (commit
 *	  markers).
 *
 * Rows go straight into the partition that holds the transaction id, with
 * the heap and index access methods, the way COPY writes them: no query is
 * parsed, planned or executed per row, so emitting costs about what the
 * row itself costs. Rows written this way fire no triggers; pg_outbox puts
 * none on its tables. The partition is found the way tuple routing finds
 * it (OutboxPartitionOf), which fetch.c also uses to read a transaction's
 * rows.
 *
 * Events are written many per transaction: the writer of outbox.event
 * stays open from the first emit of a transaction to its pre-commit or
 * pre-prepare, when xact.c ends it (see OutboxWriter). A commit marker is
 * one row per transaction, written with the same writer opened and closed
 * around it.
 *
 * Layering: this file calls only tables.c. The parts that write (emit.c,
 * commit.c) and the transaction callback (xact.c) call it; it calls none
 * of them.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/table.h"
#include "access/tableam.h"
#include "access/tupconvert.h"
#include "access/xact.h"
#include "catalog/pg_class.h"
#include "executor/executor.h"
#include "partitioning/partbounds.h"
#include "partitioning/partdesc.h"
#include "utils/inval.h"
#include "utils/memutils.h"
#include "utils/partcache.h"
#include "utils/rel.h"
#include "utils/resowner.h"
#include "utils/xid8.h"

#include "tables.h"
#include "writer.h"

/* Rows handed to the table access method at once by outbox_emit_many(). */
#define OUTBOX_MULTI_INSERT_ROWS	1000

/* outbox.event; InvalidOid until looked up or after invalidation. */
static Oid	EventRelid = InvalidOid;

/*
 * What inserting into one transaction's partition needs: the parent and
 * the partition (locked until the transaction ends anyway), the
 * partition's indexes, slots and an executor state. Setting these up costs
 * about as much as writing a row, so a transaction that emits many events
 * sets them up once: the event writer is kept from the first emit of a
 * transaction to its end. It is opened under the top-level transaction's
 * resource owner and closed at pre-commit or pre-prepare; an abort
 * releases it with the resource owner and the transaction's memory.
 */
typedef struct OutboxWriter
{
	FullTransactionId fxid;		/* whose partition; invalid when none */
	Relation	parent;
	Relation	part;
	TupleConversionMap *map;	/* parent row to partition row, if they differ */
	EState	   *estate;
	ResultRelInfo *rri;
	TupleTableSlot *slots[OUTBOX_MULTI_INSERT_ROWS];
	int			nslots;			/* slots made so far */
} OutboxWriter;

static OutboxWriter EventWriter;

/* Forgets the cached event table when its relcache entry is invalidated. */
static void
OutboxRelcacheCallback(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == EventRelid)
		EventRelid = InvalidOid;
}

/* Registers the relcache callback; called once from _PG_init. */
void
OutboxWriterInit(void)
{
	CacheRegisterRelcacheCallback(OutboxRelcacheCallback, (Datum) 0);
}

/* Returns outbox.event's OID, looking it up only after invalidation. */
static Oid
OutboxEventRelid(void)
{
	if (!OidIsValid(EventRelid))
		EventRelid = OutboxRelid("event");
	return EventRelid;
}

/*
 * The partition of a table of pg_outbox partitioned by transaction id
 * (outbox.event, outbox.commit_log) that holds transaction "txid", the way
 * tuple routing finds it: the range partition whose bounds contain it, else
 * the default partition.
 */
Oid
OutboxPartitionOf(Relation parent, Datum txid)
{
	PartitionKey key = RelationGetPartitionKey(parent);
	PartitionDesc desc = RelationGetPartitionDesc(parent, true);
	PartitionBoundInfo bounds = desc->boundinfo;
	int			index = -1;

	if (bounds != NULL)
	{
		bool		equal;
		int			offset;

		offset = partition_range_datum_bsearch(key->partsupfunc, key->partcollation,
											   bounds, 1, &txid, &equal);
		index = bounds->indexes[offset + 1];
		if (index < 0)
			index = bounds->default_index;
	}
	if (index < 0)
		ereport(ERROR,
				(errcode(ERRCODE_CHECK_VIOLATION),
				 errmsg("no partition of \"outbox.%s\" holds transaction %llu",
						RelationGetRelationName(parent), (unsigned long long) DatumGetUInt64(txid)),
				 errhint("Create the default partition again: CREATE TABLE outbox.%s_default PARTITION OF outbox.%s DEFAULT.",
						 RelationGetRelationName(parent), RelationGetRelationName(parent))));
	return desc->oids[index];
}

/* Opens the partition that holds "txid" (see OutboxPartitionOf) to write into it. */
Relation
OutboxOpenPartition(Relation parent, Datum txid)
{
	Relation	part = table_open(OutboxPartitionOf(parent, txid), RowExclusiveLock);

	if (part->rd_rel->relkind != RELKIND_RELATION)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("partition \"%s\" of \"outbox.%s\" is not a plain table",
						RelationGetRelationName(part), RelationGetRelationName(parent))));
	return part;
}

/*
 * Opens "w" to insert rows of transaction "fxid" into table "relid" of
 * "natts" columns, under the top-level transaction's resource owner and
 * memory.
 */
static void
OutboxWriterOpen(OutboxWriter *w, Oid relid, int natts, FullTransactionId fxid)
{
	ResourceOwner save_owner = CurrentResourceOwner;
	MemoryContext save_context = MemoryContextSwitchTo(TopTransactionContext);

	CurrentResourceOwner = TopTransactionResourceOwner;
	w->parent = NULL;
	w->part = NULL;
	PG_TRY();
	{
		w->parent = table_open(relid, RowExclusiveLock);
		if (RelationGetDescr(w->parent)->natts != natts)
			elog(ERROR, "outbox.%s has %d columns, expected %d",
				 RelationGetRelationName(w->parent), RelationGetDescr(w->parent)->natts, natts);
		w->part = OutboxOpenPartition(w->parent, FullTransactionIdGetDatum(fxid));
		w->map = convert_tuples_by_name(RelationGetDescr(w->parent), RelationGetDescr(w->part));
		w->estate = CreateExecutorState();
		w->rri = makeNode(ResultRelInfo);
		InitResultRelInfo(w->rri, w->part, 1, NULL, 0);
		ExecOpenIndices(w->rri, false);
		w->nslots = 0;
		w->fxid = fxid;
	}
	PG_CATCH();
	{
		/* A savepoint may catch the error: release what is open. */
		if (w->part != NULL)
			table_close(w->part, NoLock);
		if (w->parent != NULL)
			table_close(w->parent, NoLock);
		CurrentResourceOwner = save_owner;
		MemoryContextSwitchTo(save_context);
		PG_RE_THROW();
	}
	PG_END_TRY();
	CurrentResourceOwner = save_owner;
	MemoryContextSwitchTo(save_context);
}

/*
 * Closes what OutboxWriterOpen opened. After an abort ("close" false) only
 * forgets it: the resource owner released it.
 */
static void
OutboxWriterClose(OutboxWriter *w, bool close)
{
	ResourceOwner save_owner = CurrentResourceOwner;
	int			i;

	if (!FullTransactionIdIsValid(w->fxid))
		return;
	w->fxid = InvalidFullTransactionId;
	if (!close)
		return;
	CurrentResourceOwner = TopTransactionResourceOwner;
	for (i = 0; i < w->nslots; i++)
		ExecDropSingleTupleTableSlot(w->slots[i]);
	ExecCloseIndices(w->rri);
	FreeExecutorState(w->estate);
	table_close(w->part, NoLock);
	table_close(w->parent, NoLock);
	CurrentResourceOwner = save_owner;
}

/*
 * Inserts "nrows" rows through "w": into the partition, then into each of
 * its indexes (unique checks included). Row i is values[i * natts ...] and
 * nulls[i * natts ...], in the parent's columns.
 */
static void
OutboxWriterInsert(OutboxWriter *w, Datum *values, bool *nulls, int nrows)
{
	TupleDesc	parentdesc = RelationGetDescr(w->parent);
	int			natts = parentdesc->natts;
	CommandId	cid = GetCurrentCommandId(true);
	int			batch = Min(nrows, OUTBOX_MULTI_INSERT_ROWS);
	int			done;
	int			i;

	while (w->nslots < batch)
	{
		/* A slot pins its descriptor: under the transaction's owner too. */
		MemoryContext save_context = MemoryContextSwitchTo(TopTransactionContext);
		ResourceOwner save_owner = CurrentResourceOwner;

		CurrentResourceOwner = TopTransactionResourceOwner;
		w->slots[w->nslots++] = MakeSingleTupleTableSlot(RelationGetDescr(w->part), &TTSOpsHeapTuple);
		CurrentResourceOwner = save_owner;
		MemoryContextSwitchTo(save_context);
	}

	for (done = 0; done < nrows; done += batch)
	{
		int			n = Min(batch, nrows - done);

		for (i = 0; i < n; i++)
		{
			HeapTuple	tuple = heap_form_tuple(parentdesc, &values[(done + i) * natts],
												&nulls[(done + i) * natts]);

			if (w->map != NULL)
				tuple = execute_attr_map_tuple(tuple, w->map);
			ExecStoreHeapTuple(tuple, w->slots[i], true);
		}

		if (n == 1)
			table_tuple_insert(w->part, w->slots[0], cid, 0, NULL);
		else
			table_multi_insert(w->part, w->slots, n, cid, 0, NULL);

		for (i = 0; i < n; i++)
		{
			if (w->rri->ri_NumIndices > 0)
				list_free(ExecInsertIndexTuples(w->rri, w->slots[i], w->estate, false, false, NULL, NIL));
			ResetPerTupleExprContext(w->estate);
			ExecClearTuple(w->slots[i]);
		}
	}
}

/*
 * Inserts events of transaction "fxid" into outbox.event: "nrows" rows of
 * EVENT_NATTS columns. The writer stays open for the transaction's next
 * events until OutboxEventWriterEnd.
 */
void
OutboxWriteEvents(FullTransactionId fxid, Datum *values, bool *nulls, int nrows)
{
	OutboxWriter *w = &EventWriter;

	if (!FullTransactionIdIsValid(w->fxid) || !FullTransactionIdEquals(w->fxid, fxid))
		OutboxWriterOpen(w, OutboxEventRelid(), EVENT_NATTS, fxid);
	OutboxWriterInsert(w, values, nulls, nrows);
}

/*
 * Ends the event writer of the transaction: closes it at pre-commit and
 * pre-prepare ("close"), forgets it after an abort.
 */
void
OutboxEventWriterEnd(bool close)
{
	OutboxWriterClose(&EventWriter, close);
}

/*
 * Inserts one row of transaction "fxid" into table "relid" of "natts"
 * columns (a commit marker into outbox.commit_log).
 */
void
OutboxWriteRow(Oid relid, int natts, FullTransactionId fxid, Datum *values, bool *nulls)
{
	OutboxWriter w;

	OutboxWriterOpen(&w, relid, natts, fxid);
	OutboxWriterInsert(&w, values, nulls, 1);
	OutboxWriterClose(&w, true);
}
