/*-------------------------------------------------------------------------
 *
 * wakeup.h
 *	  Waking relays: the notify decision and the sleepers of outbox_fetch().
 *
 * Called by xact.c (notify, wake at commit), fetch.c (sleep), worker.c
 * (wake after a maintenance run) and _PG_init. wakeup.c calls no other
 * part of pg_outbox.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_WAKEUP_H
#define OUTBOX_WAKEUP_H

/* Channel that relays LISTEN on. */
#define OUTBOX_NOTIFY_CHANNEL	"pg_outbox"

extern void OutboxWakeupInit(void);
extern bool OutboxShouldNotify(void);
extern bool OutboxSleepBegin(void);
extern void OutboxSleepEnd(void);
extern void OutboxWakeSleepers(void);

#endif							/* OUTBOX_WAKEUP_H */
