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

#include "lib/stringinfo.h"
#include "utils/snapshot.h"
#include "utils/timestamp.h"
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

/*
 * A packed batch (outbox_fetch_packed()) stops taking events once it holds
 * this many bytes: the next batch starts where it stopped. It bounds the
 * value (1 GB at most) and the relay's memory, whatever the payloads.
 */
#define FEED_PACKED_MAX_BYTES	(64 * 1024 * 1024)

/* The events of the batch, as they are read: rows, or packed. */
typedef struct FeedBatch
{
	Tuplestorestate *store;		/* rows, in outbox_fetch()'s columns; or */
	TupleDesc	desc;
	StringInfo	packed;			/* events in the packed format (pack.c) */
	MemoryContext scratch;		/* packed: emptied after each event */
	TimestampTz first_created_at;	/* packed: the first event's */
	int64		count;
} FeedBatch;

/* Whether the batch takes no more events. */
static inline bool
FeedBatchFull(const FeedBatch *out, const FeedRange *a)
{
	return out->count >= a->limit ||
		(out->packed != NULL && out->packed->len >= FEED_PACKED_MAX_BYTES);
}

/* xid8 order: the batch's rows, read with "snapshot", into "out". */
extern void OutboxReadFeed(const FeedRange *a, FeedBatch *out, Snapshot snapshot);

/* Commit order: the same, read through the commit markers. */
extern void OutboxReadCommitFeed(const FeedRange *a, FeedBatch *out, Snapshot snapshot);

#endif							/* OUTBOX_FEED_H */
