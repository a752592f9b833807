/*-------------------------------------------------------------------------
 *
 * inbox.h
 *	  The inbox: who may act for a consumer, and the day it takes as today.
 *
 * _PG_init and consume.c (the consumer check) call into inbox.c; the SQL
 * functions are called through fmgr. inbox.c calls tables.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_INBOX_H
#define OUTBOX_INBOX_H

#include "fmgr.h"

extern void OutboxInboxInit(void);
extern void OutboxCheckConsumer(FunctionCallInfo fcinfo, int arg);

#endif							/* OUTBOX_INBOX_H */
