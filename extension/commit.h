/*-------------------------------------------------------------------------
 *
 * commit.h
 *	  Commit tickets: the order in which emitting transactions commit.
 *
 * Called by xact.c at the end of a transaction that emitted, and by
 * _PG_init. commit.c calls writer.c (for its marker) and tables.c, and
 * includes no header of a part that calls it.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_COMMIT_H
#define OUTBOX_COMMIT_H

#include "access/transam.h"

extern void OutboxCommitInit(void);
extern bool OutboxCommitOrderAvailable(void);
/* Every ticket at or below it is final; 55000 when commit order is unavailable. */
extern int64 OutboxCommitHorizon(void);
extern void OutboxCommitPreCommit(FullTransactionId fxid);
extern void OutboxCommitEnd(bool committed);
extern void OutboxCommitPrePrepare(void);

#endif							/* OUTBOX_COMMIT_H */
