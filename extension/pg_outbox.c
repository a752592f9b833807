/*-------------------------------------------------------------------------
 *
 * pg_outbox.c
 *	  Module entry point of the pg_outbox extension.
 *
 * _PG_init only calls each part's init function; each part defines the
 * settings it reads and installs its own hooks and callbacks.
 *
 * Layering: the top of the extension. This file includes the header of
 * every part that has an init function, and nothing calls into it. Below
 * it, the parts call each other without a cycle (a -> b: a calls b):
 *
 *	 emit.c   -> xact.c, writer.c, tables.c
 *	 xact.c   -> commit.c, wakeup.c, writer.c
 *	 commit.c -> writer.c, tables.c, locks.h
 *	 fetch.c  -> group.c, feed.c, fetch_010.c, position.c, lead.c, commit.c,
 *				 wakeup.c, tables.c
 *	 fetch_010.c -> feed.c
 *	 advance.c -> group.c, position.c, commit.c
 *	 group.c  -> lead.c, tables.c
 *	 feed.c   -> writer.c, position.c, tables.c
 *	 consume.c -> inbox.c, locks.c, tables.c
 *	 inbox.c  -> tables.c
 *	 worker.c -> wakeup.c
 *	 locks.c  -> locks.h
 *	 lead.c   -> locks.h
 *	 writer.c -> tables.c
 *	 wakeup.c, tables.c, position.c: no other part
 *	 sqlstates.h: included by any part that raises or reads an OB code
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "utils/guc.h"

#include "commit.h"
#include "emit.h"
#include "inbox.h"
#include "lead.h"
#include "trace.h"
#include "wakeup.h"
#include "worker.h"
#include "writer.h"
#include "xact.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

/* Initialises each part: its settings, hooks and callbacks. */
void
_PG_init(void)
{
	OutboxEmitInit();
	OutboxTraceInit();
	OutboxInboxInit();
	OutboxWorkerInit();
	OutboxCommitInit();
	OutboxWriterInit();
	OutboxXactInit();
	OutboxLeadInit();
	OutboxWakeupInit();

	/* After every part defined its settings: their placeholders are adopted. */
	MarkGUCPrefixReserved("pg_outbox");
}
