/*-------------------------------------------------------------------------
 *
 * feed.h
 *	  The index-merge scanner of a group's feed (feed.c): where a batch
 *	  lies, and the rows it reads.
 *
 * Includes no other header of pg_outbox; tables.h gives the column numbers
 * of the rows.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_FEED_H
#define OUTBOX_FEED_H

#include "utils/snapshot.h"
#include "utils/tuplestore.h"

/* Columns of outbox_fetch()'s result: the position, then the event's. */
#define FEED_POS			0
#define FEED_NATTS			(1 + EVENT_NATTS)

/* Where a batch starts and ends. */
typedef struct FeedRange
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
	int			shard;			/* the shard of "shards" read (shard.c) */
	int			shards;			/* 1: the group is not sharded */
} FeedRange;

/* Rows of the batch, as they are read. */
typedef struct FeedBatch
{
	Tuplestorestate *store;
	TupleDesc	desc;
	int64		count;
} FeedBatch;

/* xid8 order: the batch's rows, read with "snapshot", into "out". */
extern void OutboxReadFeed(const FeedRange *a, FeedBatch *out, Snapshot snapshot);

/* Commit order: the same, read through the commit markers. */
extern void OutboxReadCommitFeed(const FeedRange *a, FeedBatch *out, Snapshot snapshot);

#endif							/* OUTBOX_FEED_H */
