/*-------------------------------------------------------------------------
 *
 * inbox.h
 *	  The inbox: who may act for a consumer, and the day it takes as today.
 *
 * Only _PG_init calls into inbox.c (the SQL functions are called through
 * fmgr). inbox.c calls tables.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_INBOX_H
#define OUTBOX_INBOX_H

extern void OutboxInboxInit(void);

#endif							/* OUTBOX_INBOX_H */
