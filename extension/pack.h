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

/* The first bytes of a packed batch: the format's name and version. */
#define OUTBOX_PACK_MAGIC		"OBP1"
#define OUTBOX_PACK_MAGIC_LEN	4

/* Bytes of the header: magic, event count, age of the first event. */
#define OUTBOX_PACK_HEADER_LEN	(OUTBOX_PACK_MAGIC_LEN + 4 + 8)

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
