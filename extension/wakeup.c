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
 * A relay can also wait inside outbox_fetch() (its "wait" argument) rather
 * than for a notification: the backend puts its process number among its
 * database's sleepers and sleeps on its latch, and every transaction that
 * emitted sets the sleepers' latches once it has committed and is visible.
 * The wait ends in the backend that then reads the batch, one hop instead
 * of a notification to the relay and a new fetch from it, and the emitter
 * pays a latch instead of a NOTIFY. A sleeper registers before it reads
 * the feed once more: either that read sees a commit, or the commit sees
 * the sleeper.
 *
 * Layering: this file calls no other part of pg_outbox. xact.c asks it
 * whether to notify and has it wake the sleepers, fetch.c sleeps through
 * it, and worker.c wakes the sleepers after a maintenance run.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "utils/guc.h"

#include "wakeup.h"

/* Databases with a flag of their own; more share "always notify". */
#define OUTBOX_WAKEUP_SLOTS 64

/* Backends of a database that can sleep in outbox_fetch() at once. */
#define OUTBOX_WAKEUP_SLEEPERS 8

typedef struct OutboxWakeupSlot
{
	pg_atomic_uint32 dbid;		/* InvalidOid while free */
	pg_atomic_uint32 armed;		/* a relay waits for a notification */
	/* process number + 1 of each backend sleeping in outbox_fetch(); 0: free */
	pg_atomic_uint32 sleepers[OUTBOX_WAKEUP_SLEEPERS];
} OutboxWakeupSlot;

/* pg_outbox.notify: off, no transaction notifies */
static bool pg_outbox_notify = true;

static OutboxWakeupSlot *WakeupSlots = NULL;
static OutboxWakeupSlot *MySlot = NULL;

/* This backend's entry among its database's sleepers; -1 when none. */
static int	MySleeper = -1;
static bool SleepExitRegistered = false;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

PG_FUNCTION_INFO_V1(outbox_relay_waiting);

static void OutboxSleepExit(int code, Datum arg);

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
			int			j;

			pg_atomic_init_u32(&WakeupSlots[i].dbid, InvalidOid);
			/* Armed: the first commit of a database notifies. */
			pg_atomic_init_u32(&WakeupSlots[i].armed, 1);
			for (j = 0; j < OUTBOX_WAKEUP_SLEEPERS; j++)
				pg_atomic_init_u32(&WakeupSlots[i].sleepers[j], 0);
		}
	}
	LWLockRelease(AddinShmemInitLock);
}

/*
 * Defines pg_outbox.notify and, when preloading, installs the shared memory
 * hooks; called from _PG_init.
 */
void
OutboxWakeupInit(void)
{
	DefineCustomBoolVariable("pg_outbox.notify",
							 "Wakes relays with NOTIFY when a transaction that emitted commits.",
							 "One notification on channel \"" OUTBOX_NOTIFY_CHANNEL "\" per committing transaction. Relays fall back to polling without it.",
							 &pg_outbox_notify,
							 true,
							 PGC_USERSET,
							 0,
							 NULL, NULL, NULL);

	if (!process_shared_preload_libraries_in_progress)
		return;
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = OutboxWakeupShmemRequest;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = OutboxWakeupShmemStartup;
}

/*
 * The slot of this backend's database, claimed the first time; NULL
 * without shared memory or when every slot is taken.
 */
static OutboxWakeupSlot *
OutboxMySlot(void)
{
	int			i;

	if (MySlot != NULL || WakeupSlots == NULL || !OidIsValid(MyDatabaseId))
		return MySlot;
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
			MySlot = &WakeupSlots[i];
			break;
		}
	}
	return MySlot;
}

/*
 * Whether a transaction that emitted and commits now should notify: never
 * with pg_outbox.notify off (and then the flag stays armed), else when the
 * flag was armed or there is none.
 */
bool
OutboxShouldNotify(void)
{
	OutboxWakeupSlot *slot;

	if (!pg_outbox_notify)
		return false;
	slot = OutboxMySlot();
	return slot == NULL || pg_atomic_exchange_u32(&slot->armed, 0) != 0;
}

/*
 * Puts this backend among its database's sleepers, for a wait in
 * outbox_fetch(): commits that emitted set its latch from now on. False
 * without shared memory or when the database has OUTBOX_WAKEUP_SLEEPERS
 * already. The caller reads the feed again before it sleeps.
 */
bool
OutboxSleepBegin(void)
{
	OutboxWakeupSlot *slot = OutboxMySlot();
	int			i;

	Assert(MySleeper < 0);
	if (slot == NULL)
		return false;
	/* A backend that exits while it sleeps (FATAL, postmaster death) leaves. */
	if (!SleepExitRegistered)
	{
		before_shmem_exit(OutboxSleepExit, (Datum) 0);
		SleepExitRegistered = true;
	}
	for (i = 0; i < OUTBOX_WAKEUP_SLEEPERS; i++)
	{
		uint32		free = 0;

		/* A full barrier: the feed is read again after this. */
		if (pg_atomic_compare_exchange_u32(&slot->sleepers[i], &free, (uint32) MyProc->pgprocno + 1))
		{
			MySleeper = i;
			return true;
		}
	}
	return false;
}

/* Takes this backend out of the sleepers, if it is among them. */
void
OutboxSleepEnd(void)
{
	if (MySleeper < 0)
		return;
	pg_atomic_write_u32(&MySlot->sleepers[MySleeper], 0);
	MySleeper = -1;
}

static void
OutboxSleepExit(int code, Datum arg)
{
	OutboxSleepEnd();
}

/*
 * Wakes the backends sleeping in outbox_fetch() in this database; called
 * by a transaction that emitted, once its commit is visible.
 */
void
OutboxWakeSleepers(void)
{
	OutboxWakeupSlot *slot = OutboxMySlot();
	int			i;

	if (slot == NULL)
		return;
	/* The commit became visible before the sleepers are read. */
	pg_memory_barrier();
	for (i = 0; i < OUTBOX_WAKEUP_SLEEPERS; i++)
	{
		uint32		sleeper = pg_atomic_read_u32(&slot->sleepers[i]);

		if (sleeper != 0)
			SetLatch(&ProcGlobal->allProcs[sleeper - 1].procLatch);
	}
}

/*
 * outbox_relay_waiting(): a relay is about to wait for a notification.
 * Returns true when notifications are sent on demand (pg_outbox is
 * preloaded), false when every committing emitter notifies anyway.
 */
Datum
outbox_relay_waiting(PG_FUNCTION_ARGS)
{
	OutboxWakeupSlot *slot = OutboxMySlot();

	if (slot == NULL)
		PG_RETURN_BOOL(false);
	pg_atomic_write_u32(&slot->armed, 1);
	pg_atomic_fetch_add_u32(&slot->armed, 0);	/* a full barrier before the relay's re-check */
	PG_RETURN_BOOL(true);
}
