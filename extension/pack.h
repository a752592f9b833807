/*-------------------------------------------------------------------------
 *
 * pack.h
 *	  The packed format of a batch, for the relay (pack.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_PACK_H
#define OUTBOX_PACK_H

#include "lib/stringinfo.h"
#include "utils/jsonb.h"

/* The first bytes of a packed batch: the format's name and version. */
#define OUTBOX_PACK_MAGIC		"OBP1"
#define OUTBOX_PACK_MAGIC_LEN	4

/* Bytes of the header: magic, event count, age of the first event. */
#define OUTBOX_PACK_HEADER_LEN	(OUTBOX_PACK_MAGIC_LEN + 4 + 8)

/*
 * The most an event's payload and headers may print as, together, in
 * bytes of JSON text: the largest pg_outbox.max_payload_size. A fetch
 * refuses an event above it (SQLSTATE OB004), which outbox_emit() never
 * writes.
 */
#define OUTBOX_MAX_EVENT_TEXT	(256 * 1024 * 1024)

/*
 * The size of a jsonb value as JSON text, as the packed format and jsonb's
 * output function write it, without writing it. "exact" false: an upper
 * bound that reads no string's bytes (a string's character may print as
 * six bytes); numbers, keywords and punctuation are exact either way.
 */
extern uint64 OutboxJsonTextSize(const Jsonb *jb, bool exact);

/*
 * The size of an event's payload and headers (NULL: none) as JSON text,
 * measured against "limit": exact when above it; at or below it, a bound
 * of the exact size that is at or below it too. A check against "limit"
 * then reads strings' bytes only when the bound cannot decide.
 */
extern uint64 OutboxEventTextSize(const Jsonb *payload, const Jsonb *headers, uint64 limit);

/*
 * The bytes OutboxPackEvent() appends for an event besides the text of its
 * payload and headers, at most (values and nulls as OutboxPackEvent's).
 */
extern uint64 OutboxPackEventOverhead(const char *position, const Datum *values, const bool *nulls);

/*
 * Starts a packed batch at the end of "buf": its header, to be finished.
 * Returns where the batch starts.
 */
extern int	OutboxPackBegin(StringInfo buf);

/*
 * Appends one event: its position (a C string) and its columns as the
 * event table's (values and nulls indexed by the EVENT_ column numbers).
 */
extern void OutboxPackEvent(StringInfo buf, const char *position, const Datum *values, const bool *nulls);

/*
 * Writes the count and the first event's age (µs, -1: none) in the header
 * of the batch starting at "start".
 */
extern void OutboxPackEnd(StringInfo buf, int start, int64 count, int64 first_age_us);

#endif							/* OUTBOX_PACK_H */
