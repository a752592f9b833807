/*-------------------------------------------------------------------------
 *
 * pg_outbox.h
 *	  What fetch.c and lead.c take from the other parts of pg_outbox.
 *
 * Each part declares what it offers in its own header (tables.h,
 * writer.h, commit.h, wakeup.h, xact.h, locks.h, ...), and each file
 * includes the headers of the parts it calls. fetch.c and lead.c still
 * include this header instead: it gathers the part headers they use
 * (fetch.c reads outbox.event and outbox.commit_log, routes to their
 * partitions and sleeps for wakeups). Once they include those headers
 * themselves, this header goes.
 *
 * It includes only part headers, none of which includes it, so it adds no
 * cycle.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PG_OUTBOX_H
#define PG_OUTBOX_H

#include "lead.h"
#include "tables.h"
#include "wakeup.h"
#include "writer.h"

#endif							/* PG_OUTBOX_H */
