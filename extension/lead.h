/*-------------------------------------------------------------------------
 *
 * lead.h
 *	  Group leadership: the lease setting and its init function.
 *
 * lead.c calls no other part of pg_outbox (locks.h names its 0.1.0 lock);
 * fetch.c reads pg_outbox.lease to wake in time to renew a lease and
 * notes the generation of the group it leads; _PG_init calls
 * OutboxLeadInit.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_LEAD_H
#define OUTBOX_LEAD_H

extern int	pg_outbox_lease_ms;
extern void OutboxLeadInit(void);

/*
 * Notes the generation of a group this session leads; returns the one
 * noted before (the given one the first time after taking the lead).
 */
extern int64 OutboxNoteGeneration(int32 group_id, int64 generation);

#endif							/* OUTBOX_LEAD_H */
