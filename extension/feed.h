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
	const char *name;			/* the group's name as the caller gave it, for errors */
} FeedRange;

/*
 * A packed batch (outbox_fetch_packed()) holds at most this many bytes: it
 * stops before an event that would take it past them, and the next batch
 * starts with that event. An event larger than this alone makes a batch of
 * its own: its payload and headers print as at most OUTBOX_MAX_EVENT_TEXT
 * (pack.h), and a batch is then far below the 1 GB a value can hold. It
 * bounds the relay's memory, whatever the payloads.
 */
#define FEED_PACKED_MAX_BYTES	(64 * 1024 * 1024)

/* The events of the batch, as they are read: rows, or packed. */
typedef struct FeedBatch
{
	Tuplestorestate *store;		/* rows, in outbox_fetch()'s columns; or */
	TupleDesc	desc;
	StringInfo	packed;			/* events in the packed format (pack.c) */
	MemoryContext scratch;		/* emptied after each event */
	TimestampTz first_created_at;	/* packed: the first event's */
	int64		count;
	bool		stopped;		/* stopped before an event that did not fit */
} FeedBatch;

/* Whether the batch takes no more events. */
static inline bool
FeedBatchFull(const FeedBatch *out, const FeedRange *a)
{
	return out->count >= a->limit || out->stopped;
}

/* xid8 order: the batch's rows, read with "snapshot", into "out". */
extern void OutboxReadFeed(const FeedRange *a, FeedBatch *out, Snapshot snapshot);

/* Commit order: the same, read through the commit markers. */
extern void OutboxReadCommitFeed(const FeedRange *a, FeedBatch *out, Snapshot snapshot);

#endif							/* OUTBOX_FEED_H */
