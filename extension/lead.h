/*-------------------------------------------------------------------------
 *
 * lead.h
 *	  Group leadership: the lease setting and its init function.
 *
 * lead.c calls no other part of pg_outbox (locks.h names its 0.1.0 lock);
 * fetch.c reads pg_outbox.lease to wake in time to renew a lease;
 * group.c notes and forgets the leadership of the groups this session
 * leads and asks whether a leader's session runs; _PG_init calls
 * OutboxLeadInit.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_LEAD_H
#define OUTBOX_LEAD_H

#include "utils/timestamp.h"

extern int	pg_outbox_lease_ms;
extern void OutboxLeadInit(void);

/*
 * Notes the generation of a group this session leads; returns the one
 * noted before (the given one the first time after taking the lead).
 */
extern int64 OutboxNoteGeneration(int32 group_id, int64 generation);

/* Forgets the leadership noted for the group; true when this session had taken it. */
extern bool OutboxForgetLeadership(int32 group_id);

/* True while the backend with this pid that started then runs. */
extern bool OutboxSessionAlive(int32 pid, TimestampTz started);

#endif							/* OUTBOX_LEAD_H */
