/*-------------------------------------------------------------------------
 *
 * pg_outbox.c
 *	  Module entry point and settings of the pg_outbox extension.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "utils/guc.h"

#include "pg_outbox.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

int			pg_outbox_max_payload_size = OUTBOX_DEFAULT_MAX_PAYLOAD_SIZE;
bool		pg_outbox_notify = true;

/* Defines the settings and initialises each subsystem. */
void
_PG_init(void)
{
	DefineCustomIntVariable("pg_outbox.max_payload_size",
							"Largest event payload outbox_emit() accepts.",
							"The size of the payload as stored (jsonb), in bytes.",
							&pg_outbox_max_payload_size,
							OUTBOX_DEFAULT_MAX_PAYLOAD_SIZE,
							OUTBOX_MIN_MAX_PAYLOAD_SIZE,
							OUTBOX_MAX_MAX_PAYLOAD_SIZE,
							PGC_SUSET,
							GUC_UNIT_BYTE,
							NULL, NULL, NULL);

	DefineCustomBoolVariable("pg_outbox.notify",
							 "Wakes relays with NOTIFY when a transaction that emitted commits.",
							 "One notification on channel \"" OUTBOX_NOTIFY_CHANNEL "\" per committing transaction. Relays fall back to polling without it.",
							 &pg_outbox_notify,
							 true,
							 PGC_USERSET,
							 0,
							 NULL, NULL, NULL);

	OutboxWorkerInit();
	OutboxCommitInit();
	MarkGUCPrefixReserved("pg_outbox");

	OutboxEmitInit();
	OutboxWakeupInit();
}
