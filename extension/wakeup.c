/*-------------------------------------------------------------------------
 *
 * wakeup.c
 *	  Waking relays: one NOTIFY when a relay waits, not one per commit.
 *
 * PostgreSQL serializes the commits of transactions that queued a NOTIFY:
 * the notifying transaction holds a cluster-wide lock from its pre-commit
 * until after its commit record is flushed. With a notification per
 * committing transaction, concurrent emitters then commit one at a time
 * and lose group commit, which more than doubles the cost of a
 * single-event transaction.
 *
 * When pg_outbox is preloaded, shared memory holds a flag per database: a
 * relay about to wait for events arms it (outbox_relay_waiting()), and the
 * first transaction that emitted and commits after that disarms it and
 * sends the one notification. While relays are busy nobody notifies. A
 * commit that disarms nothing still becomes visible to the relay's next
 * fetch; the relay re-checks after arming, so a commit can only be missed
 * in the instant between its pre-commit and the relay's check, and then
 * the next commit's notification or the relay's poll interval picks it up.
 *
 * Without preloading there is no shared memory: every committing
 * transaction that emitted notifies.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"

#include "pg_outbox.h"

/* Databases with a flag of their own; more share "always notify". */
#define OUTBOX_WAKEUP_SLOTS 64

typedef struct OutboxWakeupSlot
{
	pg_atomic_uint32 dbid;		/* InvalidOid while free */
	pg_atomic_uint32 armed;		/* a relay waits for a notification */
} OutboxWakeupSlot;

static OutboxWakeupSlot *WakeupSlots = NULL;
static pg_atomic_uint32 *MyArmed = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

PG_FUNCTION_INFO_V1(outbox_relay_waiting);

/* Asks for the slots' shared memory. */
static void
OutboxWakeupShmemRequest(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(sizeof(OutboxWakeupSlot) * OUTBOX_WAKEUP_SLOTS);
}

/* Attaches to (and first initialises) the slots. */
static void
OutboxWakeupShmemStartup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	WakeupSlots = ShmemInitStruct("pg_outbox wakeup",
								  sizeof(OutboxWakeupSlot) * OUTBOX_WAKEUP_SLOTS, &found);
	if (!found)
	{
		int			i;

		for (i = 0; i < OUTBOX_WAKEUP_SLOTS; i++)
		{
			pg_atomic_init_u32(&WakeupSlots[i].dbid, InvalidOid);
			/* Armed: the first commit of a database notifies. */
			pg_atomic_init_u32(&WakeupSlots[i].armed, 1);
		}
	}
	LWLockRelease(AddinShmemInitLock);
}

/* Installs the shared memory hooks; called from _PG_init when preloading. */
void
OutboxWakeupInit(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = OutboxWakeupShmemRequest;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = OutboxWakeupShmemStartup;
}

/*
 * The flag of this backend's database, claiming a free slot the first
 * time; NULL without shared memory or when every slot is taken.
 */
static pg_atomic_uint32 *
OutboxArmedFlag(void)
{
	int			i;

	if (MyArmed != NULL || WakeupSlots == NULL || !OidIsValid(MyDatabaseId))
		return MyArmed;
	for (i = 0; i < OUTBOX_WAKEUP_SLOTS; i++)
	{
		uint32		db = pg_atomic_read_u32(&WakeupSlots[i].dbid);

		if (db == InvalidOid)
		{
			db = InvalidOid;
			if (pg_atomic_compare_exchange_u32(&WakeupSlots[i].dbid, &db, MyDatabaseId))
				db = MyDatabaseId;
		}
		if (db == MyDatabaseId)
		{
			MyArmed = &WakeupSlots[i].armed;
			break;
		}
	}
	return MyArmed;
}

/* Whether a transaction that emitted and commits now should notify. */
bool
OutboxShouldNotify(void)
{
	pg_atomic_uint32 *armed = OutboxArmedFlag();

	return armed == NULL || pg_atomic_exchange_u32(armed, 0) != 0;
}

/*
 * outbox_relay_waiting(): a relay is about to wait for a notification.
 * Returns true when notifications are sent on demand (pg_outbox is
 * preloaded), false when every committing emitter notifies anyway.
 */
Datum
outbox_relay_waiting(PG_FUNCTION_ARGS)
{
	pg_atomic_uint32 *armed = OutboxArmedFlag();

	if (armed == NULL)
		PG_RETURN_BOOL(false);
	pg_atomic_write_u32(armed, 1);
	pg_atomic_fetch_add_u32(armed, 0);	/* a full barrier before the relay's re-check */
	PG_RETURN_BOOL(true);
}
