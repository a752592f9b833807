/*-------------------------------------------------------------------------
 *
 * commit.c
 *	  Commit tickets: the order in which emitting transactions commit.
 *
 * Transaction ids are handed out when a transaction first writes, not when
 * it commits. The xid8 feed orders by them, so a transaction that took its
 * id early and committed late is published before transactions that
 * committed earlier (and whose rows it may have read), and any open
 * transaction holds every xid8 group back. Commit-ordered groups read a
 * second order instead: the order of commit tickets.
 *
 * When pg_outbox is preloaded, a transaction that emitted takes a ticket at
 * pre-commit: the next value of a counter per database in shared memory.
 * The ticket stays in the backend's in-flight slot until the transaction's
 * commit (or abort) callback, which runs after the commit became visible to
 * new snapshots. Before its commit the transaction writes one marker row
 * (txid, ticket) into outbox.commit_log, so the marker is visible exactly
 * when the events are.
 *
 * The commit horizon is the lowest in-flight ticket minus one, capped at
 * the highest committed ticket. Every ticket at or below it belongs to a
 * transaction that has committed (and is visible to any snapshot taken
 * afterwards) or aborted (and has no visible marker). A reader takes the
 * horizon first and only then the snapshot it reads markers with; the
 * markers up to the horizon are then final. Tickets of transactions that
 * abort after pre-commit leave gaps, which readers pass.
 *
 * Tickets must never be reissued once a reader may have passed them. The
 * counter starts, at the first use after the server starts, above the
 * highest ticket the database remembers (markers, group cursors, retired
 * partitions) plus an epoch: commits lost by a failover to an asynchronous
 * standby cannot have used more than that many tickets. Emitting
 * transactions commit synchronously, so a crash never loses a commit a
 * reader saw. The counter's first value is read outside the lock: no
 * query runs while an LWLock is held.
 *
 * PREPARE TRANSACTION cannot take a ticket (COMMIT PREPARED runs no
 * callbacks of the prepared transaction), so an emitting transaction cannot
 * be prepared while a commit-ordered group exists, and creating such a
 * group waits for prepared emitting transactions to finish: both take the
 * database's commit order lock (OUTBOX_LOCK_COMMIT_ORDER in locks.h).
 *
 * Without preloading there is no shared memory and no ticket: groups use
 * the xid8 order only.
 *
 * Layering: xact.c calls this file at the end of a transaction that
 * emitted, in its order of commit steps; this file writes the marker
 * through writer.c and finds the schema through tables.c, and calls
 * nothing that calls it.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/twophase.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_namespace.h"
#include "commands/dbcommands.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/xid8.h"

#include "commit.h"
#include "locks.h"
#include "tables.h"
#include "writer.h"

/* Databases that can use commit order at once. */
#define OUTBOX_COMMIT_DBS		256

/*
 * How far the counter jumps above what the database remembers when it
 * starts: more tickets than a failover to an asynchronous standby can lose.
 */
#define OUTBOX_TICKET_EPOCH		((uint64) 1 << 20)

typedef struct OutboxCommitDb
{
	Oid			dbid;			/* InvalidOid while free */
	bool		started;		/* next and committed are set */
	uint64		next;			/* the next ticket to issue */
	uint64		committed;		/* the highest ticket that committed */
} OutboxCommitDb;

typedef struct OutboxCommitSlot
{
	int			db;				/* index into dbs */
	uint64		ticket;			/* in flight; 0 when none */
} OutboxCommitSlot;

typedef struct OutboxCommitShared
{
	LWLock	   *lock;			/* protects everything below */
	int			nslots;
	OutboxCommitDb dbs[OUTBOX_COMMIT_DBS];
	OutboxCommitSlot slots[FLEXIBLE_ARRAY_MEMBER];	/* one per PGPROC */
} OutboxCommitShared;

static OutboxCommitShared *Shared = NULL;

/* This backend's database's index in Shared->dbs, or -1. */
static int	MyDb = -1;

/* The ticket of the current transaction, 0 when it has none. */
static uint64 MyTicket = 0;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

PG_FUNCTION_INFO_V1(outbox_commit_horizon);
PG_FUNCTION_INFO_V1(outbox_commit_order_available);
PG_FUNCTION_INFO_V1(outbox_commit_order_lock);

static int
OutboxCommitSlots(void)
{
	return MaxBackends + NUM_AUXILIARY_PROCS + max_prepared_xacts;
}

static Size
OutboxCommitShmemSize(void)
{
	return add_size(offsetof(OutboxCommitShared, slots),
					mul_size(OutboxCommitSlots(), sizeof(OutboxCommitSlot)));
}

static void
OutboxCommitShmemRequest(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(OutboxCommitShmemSize());
	RequestNamedLWLockTranche("pg_outbox commit order", 1);
}

static void
OutboxCommitShmemStartup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	Shared = ShmemInitStruct("pg_outbox commit order", OutboxCommitShmemSize(), &found);
	if (!found)
	{
		memset(Shared, 0, OutboxCommitShmemSize());
		Shared->lock = &(GetNamedLWLockTranche("pg_outbox commit order"))->lock;
		Shared->nslots = OutboxCommitSlots();
	}
	LWLockRelease(AddinShmemInitLock);
}

/* pg_outbox.commit_order */
static bool CommitOrderEnabled = true;

/*
 * When preloading: defines pg_outbox.commit_order and, with it on, installs
 * the shared memory hooks; called from _PG_init.
 */
void
OutboxCommitInit(void)
{
	/* A PGC_POSTMASTER setting can only be defined while preloading. */
	if (!process_shared_preload_libraries_in_progress)
		return;
	DefineCustomBoolVariable("pg_outbox.commit_order",
							 "Gives each committing transaction that emitted a commit ticket, for commit-ordered groups.",
							 "Needs pg_outbox in shared_preload_libraries. Off, groups can use the xid8 order only.",
							 &CommitOrderEnabled,
							 true,
							 PGC_POSTMASTER,
							 0,
							 NULL, NULL, NULL);
	if (!CommitOrderEnabled)
		return;
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = OutboxCommitShmemRequest;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = OutboxCommitShmemStartup;
}

/* Whether commit tickets exist in this server (pg_outbox is preloaded). */
bool
OutboxCommitOrderAvailable(void)
{
	return Shared != NULL;
}

/* Raises the error for a server without tickets, or a standby. */
static void
OutboxCommitCheckAvailable(void)
{
	if (Shared == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("commit order needs pg_outbox in shared_preload_libraries and pg_outbox.commit_order on"),
				 errhint("Add pg_outbox to shared_preload_libraries and restart the server, or use the xid8 order.")));
	if (RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the commit-ordered feed is read on the primary only"),
				 errdetail("Commit tickets are taken by committing transactions, which only run on the primary.")));
}

/*
 * Claims an entry for this database under the lock: its own, else a free
 * one, else the entry of "dropped" (a database that no longer exists).
 */
static void
OutboxCommitClaim(Oid dropped)
{
	int			i;
	int			free_index = -1;

	LWLockAcquire(Shared->lock, LW_EXCLUSIVE);
	for (i = 0; i < OUTBOX_COMMIT_DBS; i++)
	{
		if (Shared->dbs[i].dbid == MyDatabaseId)
		{
			MyDb = i;
			break;
		}
		if (free_index < 0 &&
			(!OidIsValid(Shared->dbs[i].dbid) ||
			 (OidIsValid(dropped) && Shared->dbs[i].dbid == dropped)))
			free_index = i;
	}
	if (MyDb < 0 && free_index >= 0)
	{
		Shared->dbs[free_index].dbid = MyDatabaseId;
		Shared->dbs[free_index].started = false;
		MyDb = free_index;
	}
	LWLockRelease(Shared->lock);
}

/* This backend's database entry, claiming one the first time. */
static int
OutboxCommitDbIndex(void)
{
	int			i;

	if (MyDb >= 0)
		return MyDb;
	OutboxCommitClaim(InvalidOid);
	/* Every entry is taken: take over one of a dropped database. */
	for (i = 0; i < OUTBOX_COMMIT_DBS && MyDb < 0; i++)
	{
		Oid			dbid;

		LWLockAcquire(Shared->lock, LW_SHARED);
		dbid = Shared->dbs[i].dbid;
		LWLockRelease(Shared->lock);
		if (OidIsValid(dbid) && !SearchSysCacheExists1(DATABASEOID, ObjectIdGetDatum(dbid)))
			OutboxCommitClaim(dbid);
	}
	if (MyDb < 0)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("more than %d databases use pg_outbox's commit order", OUTBOX_COMMIT_DBS)));
	return MyDb;
}

/*
 * Runs a query returning one bigint (or NULL, as 0) as the owner of the
 * extension's schema, under a fresh snapshot.
 */
static uint64
OutboxQueryOwned(const char *sql)
{
	Oid			nspid = get_namespace_oid(OUTBOX_SCHEMA, false);
	HeapTuple	tuple;
	Oid			owner;
	Oid			save_userid;
	int			save_sec_context;
	int			save_nestlevel;
	uint64		result = 0;

	tuple = SearchSysCache1(NAMESPACEOID, ObjectIdGetDatum(nspid));
	if (!HeapTupleIsValid(tuple))
		elog(ERROR, "cache lookup failed for schema %u", nspid);
	owner = ((Form_pg_namespace) GETSTRUCT(tuple))->nspowner;
	ReleaseSysCache(tuple);

	/* As the owner, with a search_path the caller cannot plant objects in. */
	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SetUserIdAndSecContext(owner, save_sec_context | SECURITY_LOCAL_USERID_CHANGE);
	save_nestlevel = NewGUCNestLevel();
	(void) set_config_option("search_path", "pg_catalog, pg_temp", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	PushActiveSnapshot(GetTransactionSnapshot());
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (SPI_execute(sql, true, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "pg_outbox: query failed: %s", sql);
	{
		bool		isnull;
		Datum		d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);

		if (!isnull)
			result = (uint64) DatumGetInt64(d);
	}
	SPI_finish();
	PopActiveSnapshot();
	AtEOXact_GUC(true, save_nestlevel);
	SetUserIdAndSecContext(save_userid, save_sec_context);
	return result;
}

/*
 * Starts the database's counter after the server started: above every
 * ticket the database remembers, plus the epoch.
 */
static void
OutboxCommitStart(int db)
{
	uint64		floor;

	if (Shared->dbs[db].started)	/* set once, read without the lock */
		return;
	floor = OutboxQueryOwned("SELECT greatest((SELECT max(ticket) FROM outbox.commit_log),"
							 "                (SELECT max(cursor_ticket) FROM outbox.groups),"
							 "                (SELECT retired_ticket FROM outbox.maintenance))");
	/* Tickets are stored as bigint: the counter must start well below its end. */
	if (floor > (uint64) PG_INT64_MAX - 2 * OUTBOX_TICKET_EPOCH)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("commit tickets of database \"%s\" cannot start above ticket " UINT64_FORMAT,
						get_database_name(MyDatabaseId), floor),
				 errdetail("A commit-ordered group's cursor, a commit marker or a retired partition holds a ticket that close to the end of the bigint range."),
				 errhint("Find the group with a cursor that high in outbox.group_stats and re-anchor it with outbox_rewind(group, 'beginning').")));
	LWLockAcquire(Shared->lock, LW_EXCLUSIVE);
	if (!Shared->dbs[db].started)
	{
		Shared->dbs[db].committed = floor + OUTBOX_TICKET_EPOCH;
		Shared->dbs[db].next = Shared->dbs[db].committed + 1;
		Shared->dbs[db].started = true;
	}
	LWLockRelease(Shared->lock);
}

/* Writes the marker (txid, ticket) into the partition of outbox.commit_log holding txid. */
static void
OutboxWriteMarker(FullTransactionId fxid, uint64 ticket)
{
	Datum		values[MARKER_NATTS];
	bool		nulls[MARKER_NATTS] = {false, false};

	values[MARKER_TXID] = FullTransactionIdGetDatum(fxid);
	values[MARKER_TICKET] = Int64GetDatum((int64) ticket);
	OutboxWriteRow(OutboxRelid("commit_log"), MARKER_NATTS, fxid, values, nulls);
}

/*
 * At pre-commit of a transaction that emitted: takes the next ticket, puts
 * it in flight and writes the marker. Errors from here on abort the
 * transaction, whose abort callback takes the ticket out of flight: a gap.
 */
void
OutboxCommitPreCommit(FullTransactionId fxid)
{
	OutboxCommitSlot *slot;
	int			db;

	if (Shared == NULL || MyProc == NULL)
		return;
	db = OutboxCommitDbIndex();
	/* A commit that a reader saw must survive a crash. */
	ForceSyncCommit();
	OutboxCommitStart(db);

	slot = &Shared->slots[MyProc->pgprocno];
	LWLockAcquire(Shared->lock, LW_EXCLUSIVE);
	if (Shared->dbs[db].next > (uint64) PG_INT64_MAX)
	{
		LWLockRelease(Shared->lock);
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("commit tickets of database \"%s\" are exhausted", get_database_name(MyDatabaseId))));
	}
	MyTicket = Shared->dbs[db].next++;
	slot->db = db;
	slot->ticket = MyTicket;
	LWLockRelease(Shared->lock);

	PushActiveSnapshot(GetTransactionSnapshot());
	OutboxWriteMarker(fxid, MyTicket);
	PopActiveSnapshot();
}

/*
 * At commit (visible to new snapshots by now) or abort: takes the ticket out
 * of flight; a committed one may move the database's committed ticket.
 */
void
OutboxCommitEnd(bool committed)
{
	OutboxCommitSlot *slot;

	if (MyTicket == 0)
		return;
	slot = &Shared->slots[MyProc->pgprocno];
	LWLockAcquire(Shared->lock, LW_EXCLUSIVE);
	if (committed && MyTicket > Shared->dbs[slot->db].committed)
		Shared->dbs[slot->db].committed = MyTicket;
	slot->ticket = 0;
	LWLockRelease(Shared->lock);
	MyTicket = 0;
}

/*
 * At pre-prepare of a transaction that emitted: refuses when the database
 * has a commit-ordered group (the transaction could not get a ticket), and
 * otherwise holds the commit order lock in share mode until the prepared
 * transaction ends, so that no commit-ordered group appears meanwhile.
 */
void
OutboxCommitPrePrepare(void)
{
	LOCKTAG		tag;

	if (Shared == NULL)
		return;
	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, 0, 0, OUTBOX_LOCK_COMMIT_ORDER);
	(void) LockAcquire(&tag, ShareLock, false, false);
	if (OutboxQueryOwned("SELECT count(*) FROM outbox.groups WHERE ordering = 'commit'") > 0)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot prepare a transaction that emitted events while a commit-ordered group exists"),
				 errdetail("COMMIT PREPARED cannot take the commit ticket that orders the events."),
				 errhint("Commit without two-phase commit, or use only xid8-ordered groups in this database.")));
}

/*
 * outbox.commit_order_lock(): waits until no prepared transaction that
 * emitted is pending, and keeps them out until the end of the transaction.
 */
Datum
outbox_commit_order_lock(PG_FUNCTION_ARGS)
{
	LOCKTAG		tag;

	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, 0, 0, OUTBOX_LOCK_COMMIT_ORDER);
	(void) LockAcquire(&tag, ExclusiveLock, false, false);
	PG_RETURN_VOID();
}

/* outbox.commit_order_available(): whether commit tickets exist in this server. */
Datum
outbox_commit_order_available(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(Shared != NULL && !RecoveryInProgress());
}

/*
 * outbox.commit_horizon(): every ticket at or below it is final. Call it
 * before taking the snapshot that reads the markers, that is, in an
 * earlier statement.
 */
int64
OutboxCommitHorizon(void)
{
	uint64		horizon;
	int			db;
	int			i;

	OutboxCommitCheckAvailable();
	db = OutboxCommitDbIndex();
	OutboxCommitStart(db);

	LWLockAcquire(Shared->lock, LW_SHARED);
	horizon = Shared->dbs[db].committed;
	for (i = 0; i < Shared->nslots; i++)
	{
		OutboxCommitSlot *s = &Shared->slots[i];

		if (s->ticket != 0 && s->db == db && s->ticket <= horizon)
			horizon = s->ticket - 1;
	}
	LWLockRelease(Shared->lock);
	return (int64) horizon;
}

Datum
outbox_commit_horizon(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT64(OutboxCommitHorizon());
}
