/*-------------------------------------------------------------------------
 *
 * consume.h
 *	  inbox_consume(), for the entry point that applies a batch through it
 *	  directly (keyed.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_CONSUME_H
#define OUTBOX_CONSUME_H

#include "fmgr.h"

/*
 * The most entries inbox_consume() applies with isolate => true: each takes
 * a subtransaction, and PostgreSQL keeps 64 subtransaction ids per backend
 * in shared memory (PGPROC_MAX_CACHED_SUBXIDS) before it overflows.
 */
#define OUTBOX_CONSUME_ISOLATE_MAX 64

extern Datum outbox_inbox_consume(PG_FUNCTION_ARGS);

#endif							/* OUTBOX_CONSUME_H */
