/*-------------------------------------------------------------------------
 *
 * emit.h
 *	  outbox_emit() and outbox_emit_many(): the SQL API that writes events.
 *
 * Only _PG_init calls into emit.c (the SQL functions are called through
 * fmgr). emit.c calls writer.c, xact.c, pack.c and tables.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_EMIT_H
#define OUTBOX_EMIT_H

extern void OutboxEmitInit(void);

#endif							/* OUTBOX_EMIT_H */
