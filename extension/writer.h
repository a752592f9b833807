/*-------------------------------------------------------------------------
 *
 * writer.h
 *	  Writing rows into pg_outbox's tables partitioned by transaction id.
 *
 * One layer above tables.h and below the parts that write: emit.c (event
 * rows), commit.c (commit markers) and xact.c (which ends the event
 * writer's transaction-long state). fetch.c uses the partition routing.
 * It includes no header of a part that calls it.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_WRITER_H
#define OUTBOX_WRITER_H

#include "access/transam.h"
#include "utils/relcache.h"

extern void OutboxWriterInit(void);
extern Oid	OutboxPartitionOf(Relation parent, Datum txid);
extern Relation OutboxOpenPartition(Relation parent, Datum txid);
extern void OutboxWriteEvents(FullTransactionId fxid, Datum *values, bool *nulls, int nrows);
extern void OutboxEventWriterEnd(bool close);
extern void OutboxWriteRow(Oid relid, int natts, FullTransactionId fxid, Datum *values, bool *nulls);

#endif							/* OUTBOX_WRITER_H */
