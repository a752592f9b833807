/*-------------------------------------------------------------------------
 *
 * fetch.h
 *	  What fetch.c and its 0.1.0 compatibility path (fetch_010.c) share.
 *
 * Includes no other header of pg_outbox; feed.h defines FeedRange.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_FETCH_H
#define OUTBOX_FETCH_H

#include "utils/array.h"

/* The group's topics (a text[]) into the range; NULL: every topic. */
extern void OutboxRangeTopics(FeedRange *a, ArrayType *topics);

/*
 * SQL objects of 0.1.0: where the batch lies by outbox.fetch_args()
 * (fetch_010.c), with outbox_fetch()'s arguments; false when another
 * session leads the group.
 */
extern bool OutboxPlaceBatchByArgs(Datum *args, char *nulls, FeedRange *a);

#endif							/* OUTBOX_FETCH_H */
