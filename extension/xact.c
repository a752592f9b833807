/*-------------------------------------------------------------------------
 *
 * xact.c
 *	  What a transaction that emitted does when it ends, in order.
 *
 * At pre-commit, a transaction that emitted, in this order:
 *
 * 1. closes the writer of its events (writer.c), so that every event row
 *	  is in before anything depends on them;
 * 2. takes its commit ticket and writes its commit marker (commit.c): the
 *	  marker is then visible exactly when the events are;
 * 3. decides whether to wake relays with a NOTIFY (wakeup.c) and queues it.
 *
 * Once its commit is visible to new snapshots, it takes its ticket out of
 * flight (commit.c) and then wakes the backends sleeping in
 * outbox_fetch() (wakeup.c), which read the feed again and find it. At
 * pre-prepare it closes the writer and takes the commit order lock
 * instead of a ticket (commit.c); an abort forgets the writer and the
 * ticket. Transactions that did not emit only have their state reset.
 *
 * The notification is queued at pre-commit rather than by outbox_emit()
 * itself: a transaction that queued a NOTIFY cannot be prepared, and
 * emitting transactions must support two-phase commit. Prepared
 * transactions therefore wake nobody when they commit; relays find their
 * events by polling. A savepoint that emitted and rolled back still
 * counts: one spurious wake-up costs a relay one empty fetch.
 *
 * Layering: the top of the commit path, and its only sequence. This file
 * calls writer.c, commit.c and wakeup.c; none of them calls it or each
 * other, except commit.c, which writes its marker through writer.c.
 * emit.c calls OutboxXactEmitted() and nothing else here.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "commands/async.h"

#include "commit.h"
#include "wakeup.h"
#include "writer.h"
#include "xact.h"

/* Whether the current top-level transaction emitted. */
static bool EmittedInXact = false;

/* Runs the end of a transaction in the order above. */
static void
OutboxXactCallback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			OutboxEventWriterEnd(true);
			if (EmittedInXact)
			{
				OutboxCommitPreCommit(GetTopFullTransactionId());
				if (OutboxShouldNotify())
					Async_Notify(OUTBOX_NOTIFY_CHANNEL, NULL);
			}
			break;
		case XACT_EVENT_PRE_PREPARE:
			OutboxEventWriterEnd(true);
			if (EmittedInXact)
				OutboxCommitPrePrepare();
			break;
		case XACT_EVENT_COMMIT:
			OutboxCommitEnd(true);
			if (EmittedInXact)
				OutboxWakeSleepers();
			EmittedInXact = false;
			break;
		case XACT_EVENT_PREPARE:
			EmittedInXact = false;
			break;
		case XACT_EVENT_ABORT:
			OutboxEventWriterEnd(false);
			OutboxCommitEnd(false);
			EmittedInXact = false;
			break;
		default:
			break;
	}
}

/* Registers the transaction callback; called once from _PG_init. */
void
OutboxXactInit(void)
{
	RegisterXactCallback(OutboxXactCallback, NULL);
}

/* Notes that the current transaction emitted; called after its rows are written. */
void
OutboxXactEmitted(void)
{
	EmittedInXact = true;
}
