/*-------------------------------------------------------------------------
 *
 * lead.h
 *	  Group leadership: the lease setting and its init function.
 *
 * lead.c calls no other part of pg_outbox; fetch.c reads pg_outbox.lease
 * to wake in time to renew a lease, and _PG_init calls OutboxLeadInit.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_LEAD_H
#define OUTBOX_LEAD_H

extern int	pg_outbox_lease_ms;
extern void OutboxLeadInit(void);

#endif							/* OUTBOX_LEAD_H */
