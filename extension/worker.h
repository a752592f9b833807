/*-------------------------------------------------------------------------
 *
 * worker.h
 *	  The maintenance launcher and workers.
 *
 * Only _PG_init calls into worker.c (the postmaster starts its entry
 * points by name). worker.c calls wakeup.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_WORKER_H
#define OUTBOX_WORKER_H

extern void OutboxWorkerInit(void);

#endif							/* OUTBOX_WORKER_H */
