/*-------------------------------------------------------------------------
 *
 * locks.c
 *	  Transaction-level advisory locks of pg_outbox taken from SQL, and the
 *	  inbox lock.
 *
 * Their tags come from the table in locks.h, which every user of a
 * pg_outbox lock includes; this file includes no other part of pg_outbox.
 *
 * The inbox lock serializes applies of one event by one consumer. An apply
 * must see an event applied by a concurrent transaction, whichever
 * partition of outbox.inbox holds it. It takes a transaction-level
 * advisory lock keyed by a hash of (consumer, event id) before looking
 * (OutboxInboxLock(), which outbox.inbox_record() calls for the events of
 * a batch): a second apply of the same event waits until the first
 * commits (and then finds it) or rolls back (and then applies it). A hash
 * collision only makes two applies wait for each other. Version 0.1.0's
 * inbox_apply() takes it through outbox.inbox_lock(), until the update.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "storage/lock.h"

#include "locks.h"

PG_FUNCTION_INFO_V1(outbox_inbox_lock);
PG_FUNCTION_INFO_V1(outbox_try_maintenance_lock);

/* Waits for the inbox lock of a (consumer, event id) key. */
void
OutboxInboxLock(uint64 key)
{
	LOCKTAG		tag;

	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, (uint32) (key >> 32), (uint32) key,
						 OUTBOX_LOCK_INBOX);
	(void) LockAcquire(&tag, ExclusiveLock, false, false);
}

/*
 * outbox.inbox_lock(key bigint), of version 0.1.0 (its inbox_apply() calls
 * it until ALTER EXTENSION UPDATE): waits for the event's apply lock.
 */
Datum
outbox_inbox_lock(PG_FUNCTION_ARGS)
{
	OutboxInboxLock((uint64) PG_GETARG_INT64(0));
	PG_RETURN_VOID();
}

/*
 * outbox.try_maintenance_lock(): takes the database's maintenance lock for
 * this transaction if it is free; false when another run holds it, so that
 * concurrent maintenance runs return at once instead of queueing.
 */
Datum
outbox_try_maintenance_lock(PG_FUNCTION_ARGS)
{
	LOCKTAG		tag;

	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, 0, 0, OUTBOX_LOCK_MAINTENANCE);
	PG_RETURN_BOOL(LockAcquire(&tag, ExclusiveLock, false, true) != LOCKACQUIRE_NOT_AVAIL);
}
