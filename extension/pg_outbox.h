/*-------------------------------------------------------------------------
 *
 * pg_outbox.h
 *	  Shared declarations of the pg_outbox extension.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PG_OUTBOX_H
#define PG_OUTBOX_H

#include "access/transam.h"
#include "utils/relcache.h"

#include "tables.h"
#include "wakeup.h"
#include "writer.h"

/* Limits of an event's identity fields, in bytes. */
#define OUTBOX_MAX_TOPIC_LEN	255
#define OUTBOX_MAX_KEY_LEN		1024

/* pg_outbox.max_payload_size, in bytes */
#define OUTBOX_DEFAULT_MAX_PAYLOAD_SIZE (1024 * 1024)
#define OUTBOX_MIN_MAX_PAYLOAD_SIZE		1024
#define OUTBOX_MAX_MAX_PAYLOAD_SIZE		(256 * 1024 * 1024)

/* pg_outbox.maintenance_interval, in milliseconds */
#define OUTBOX_DEFAULT_MAINTENANCE_INTERVAL	(60 * 1000)
#define OUTBOX_MIN_MAINTENANCE_INTERVAL		100
#define OUTBOX_MAX_MAINTENANCE_INTERVAL		(24 * 60 * 60 * 1000)

/* GUCs */
extern int	pg_outbox_max_payload_size;
extern int	pg_outbox_maintenance_interval;

/* worker.c */
extern void OutboxWorkerInit(void);

#endif							/* PG_OUTBOX_H */
