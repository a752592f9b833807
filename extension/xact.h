/*-------------------------------------------------------------------------
 *
 * xact.h
 *	  The end of a transaction that emitted.
 *
 * The top of the commit path: xact.c calls writer.c, commit.c and
 * wakeup.c, none of which includes this header. emit.c includes it to
 * note that the transaction emitted.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_XACT_H
#define OUTBOX_XACT_H

extern void OutboxXactInit(void);
extern void OutboxXactEmitted(void);

#endif							/* OUTBOX_XACT_H */
