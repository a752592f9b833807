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

extern Datum outbox_inbox_consume(PG_FUNCTION_ARGS);

#endif							/* OUTBOX_CONSUME_H */
