/*-------------------------------------------------------------------------
 *
 * worker.c
 *	  Maintenance background workers: a launcher and one worker per
 *	  database that uses pg_outbox.
 *
 * When pg_outbox is in shared_preload_libraries, a launcher starts with the
 * server. It connects to no database (it reads pg_database, a shared
 * catalog) and, every pg_outbox.maintenance_interval, starts a maintenance
 * run in each database that accepts connections: a background worker that
 * connects to the database, runs outbox_maintain() if the extension is
 * installed there, and exits. Where it is not, the worker notes that in
 * shared memory, and the launcher looks at that database again only every
 * OUTBOX_LAUNCHER_RECHECK rounds. Installing the extension wakes the
 * launcher when its transaction commits, so a new database is maintained
 * at once. Nothing lists databases by hand, and a consumer-only database
 * (inbox partitions, inbox retention) is maintained like a producer's.
 *
 * A run holds a database connection only while it runs, so DROP DATABASE
 * and CREATE DATABASE ... TEMPLATE are not held up between runs; at most
 * OUTBOX_LAUNCHER_MAX_WORKERS runs go at once, so that maintenance takes
 * few of max_worker_processes' slots. When no slot is free the launcher
 * logs it once, with the fix, and tries again.
 *
 * The launcher waits on its latch (a run that ended, an install, SIGHUP
 * and postmaster death wake it), reloads its settings on SIGHUP and exits
 * cleanly on SIGTERM. An error in a run is logged and the next round runs
 * again on time.
 *
 * Layering: worker.c calls only wakeup.c (to wake sleeping fetches after a
 * run); it runs outbox_maintain() through SQL, not through other parts.
 * Nothing calls into it but the postmaster, fmgr and _PG_init.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "commands/dbcommands.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "wakeup.h"
#include "worker.h"

/* pg_outbox.maintenance_interval, in milliseconds */
#define OUTBOX_DEFAULT_MAINTENANCE_INTERVAL	(60 * 1000)
#define OUTBOX_MIN_MAINTENANCE_INTERVAL		100
#define OUTBOX_MAX_MAINTENANCE_INTERVAL		(24 * 60 * 60 * 1000)

/* Databases without the extension are looked at again every so many intervals. */
#define OUTBOX_LAUNCHER_RECHECK		10

/* Databases remembered as lacking the extension; more are just looked at more often. */
#define OUTBOX_MAX_ABSENT			256

/* Maintenance runs at once, at most: each takes a background worker slot. */
#define OUTBOX_LAUNCHER_MAX_WORKERS	2

PGDLLEXPORT void OutboxLauncherMain(Datum main_arg);
PGDLLEXPORT void OutboxMaintenanceWorkerMain(Datum main_arg);

PG_FUNCTION_INFO_V1(outbox_maintenance_wake);

/* pg_outbox.maintenance_interval */
static int	pg_outbox_maintenance_interval = OUTBOX_DEFAULT_MAINTENANCE_INTERVAL;

/* pg_outbox.background_maintenance: off in a database, its runs do nothing. */
static bool BackgroundMaintenance = true;

/* What the launcher and the workers share. */
typedef struct OutboxLauncherShared
{
	slock_t		mutex;			/* protects everything below */
	Latch	   *launcher_latch; /* NULL while no launcher runs */
	bool		woken;			/* an install committed: start a round now */
	int			nabsent;
	Oid			absent[OUTBOX_MAX_ABSENT];	/* databases found without the extension */
} OutboxLauncherShared;

static OutboxLauncherShared *Launcher = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* A maintenance worker the launcher started. */
typedef struct OutboxWorkerEntry
{
	Oid			dbid;
	BackgroundWorkerHandle *handle;
} OutboxWorkerEntry;

static volatile sig_atomic_t got_sigterm = false;

/* This transaction installed the extension: wake the launcher at commit. */
static bool WakeAtCommit = false;

static void
OutboxLauncherShmemRequest(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(sizeof(OutboxLauncherShared));
}

static void
OutboxLauncherShmemStartup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	Launcher = ShmemInitStruct("pg_outbox launcher", sizeof(OutboxLauncherShared), &found);
	if (!found)
	{
		memset(Launcher, 0, sizeof(OutboxLauncherShared));
		SpinLockInit(&Launcher->mutex);
	}
	LWLockRelease(AddinShmemInitLock);
}

/* At commit of a transaction that installed the extension: wakes the launcher. */
static void
OutboxWorkerXactCallback(XactEvent event, void *arg)
{
	if (!WakeAtCommit)
		return;
	if (event == XACT_EVENT_COMMIT && Launcher != NULL)
	{
		SpinLockAcquire(&Launcher->mutex);
		Launcher->nabsent = 0;
		Launcher->woken = true;
		if (Launcher->launcher_latch)
			SetLatch(Launcher->launcher_latch);
		SpinLockRelease(&Launcher->mutex);
	}
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT ||
		event == XACT_EVENT_PARALLEL_COMMIT || event == XACT_EVENT_PARALLEL_ABORT)
		WakeAtCommit = false;
}

/*
 * Defines the workers' settings and, when preloading, registers the
 * launcher and its shared memory.
 */
void
OutboxWorkerInit(void)
{
	BackgroundWorker worker;

	DefineCustomIntVariable("pg_outbox.maintenance_interval",
							"How often the maintenance workers run outbox_maintain().",
							"Also how often the launcher looks for databases to maintain.",
							&pg_outbox_maintenance_interval,
							OUTBOX_DEFAULT_MAINTENANCE_INTERVAL,
							OUTBOX_MIN_MAINTENANCE_INTERVAL,
							OUTBOX_MAX_MAINTENANCE_INTERVAL,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomBoolVariable("pg_outbox.background_maintenance",
							 "Whether the background workers maintain this database.",
							 "Set per database (ALTER DATABASE ... SET): off, the database is maintained only by outbox_maintain() calls, from a relay or a scheduler.",
							 &BackgroundMaintenance,
							 true,
							 PGC_SUSET,
							 0,
							 NULL, NULL, NULL);

	/* Background workers and shared memory are set up while preloading only. */
	if (!process_shared_preload_libraries_in_progress)
		return;

	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = OutboxLauncherShmemRequest;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = OutboxLauncherShmemStartup;
	RegisterXactCallback(OutboxWorkerXactCallback, NULL);

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = 10;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "pg_outbox");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "OutboxLauncherMain");
	snprintf(worker.bgw_name, BGW_MAXLEN, "pg_outbox launcher");
	snprintf(worker.bgw_type, BGW_MAXLEN, "pg_outbox launcher");
	RegisterBackgroundWorker(&worker);
}

/* SIGTERM: ask the loop to finish. */
static void
OutboxWorkerSigterm(SIGNAL_ARGS)
{
	int			save_errno = errno;

	got_sigterm = true;
	SetLatch(MyLatch);
	errno = save_errno;
}

/* Sets up signals the way every pg_outbox background process handles them. */
static void
OutboxWorkerSignals(void)
{
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, OutboxWorkerSigterm);
	BackgroundWorkerUnblockSignals();
}

/*
 * The launcher waits on its latch until "timeout" ms have passed or
 * something woke it, and reloads its settings on SIGHUP.
 */
static void
OutboxLauncherWait(long timeout)
{
	(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, timeout, PG_WAIT_EXTENSION);
	ResetLatch(MyLatch);
	CHECK_FOR_INTERRUPTS();
	if (ConfigReloadPending)
	{
		ConfigReloadPending = false;
		ProcessConfigFile(PGC_SIGHUP);
		ereport(LOG,
				(errmsg("pg_outbox launcher reloaded its settings, running every %d ms",
						pg_outbox_maintenance_interval)));
	}
}

/* Whether the launcher recently found the database without the extension. */
static bool
OutboxDatabaseAbsent(Oid dbid)
{
	bool		absent = false;
	int			i;

	SpinLockAcquire(&Launcher->mutex);
	for (i = 0; i < Launcher->nabsent && !absent; i++)
		absent = Launcher->absent[i] == dbid;
	SpinLockRelease(&Launcher->mutex);
	return absent;
}

/* Notes that this worker's database lacks the extension. */
static void
OutboxNoteAbsent(void)
{
	SpinLockAcquire(&Launcher->mutex);
	if (Launcher->nabsent < OUTBOX_MAX_ABSENT)
		Launcher->absent[Launcher->nabsent++] = MyDatabaseId;
	SpinLockRelease(&Launcher->mutex);
}

/* The databases that accept connections, as a list of Oids. */
static List *
OutboxDatabases(void)
{
	List	   *dbs = NIL;
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tuple;
	MemoryContext caller = CurrentMemoryContext;

	StartTransactionCommand();
	(void) GetTransactionSnapshot();
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while (HeapTupleIsValid(tuple = heap_getnext(scan, ForwardScanDirection)))
	{
		Form_pg_database db = (Form_pg_database) GETSTRUCT(tuple);
		MemoryContext old;

		if (!db->datallowconn || db->datistemplate)
			continue;
		old = MemoryContextSwitchTo(caller);
		dbs = lappend_oid(dbs, db->oid);
		MemoryContextSwitchTo(old);
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	CommitTransactionCommand();
	return dbs;
}

/* Starts a maintenance worker for a database; NULL when no slot is free. */
static BackgroundWorkerHandle *
OutboxStartWorker(Oid dbid)
{
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	worker.bgw_main_arg = ObjectIdGetDatum(dbid);
	worker.bgw_notify_pid = MyProcPid;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "pg_outbox");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "OutboxMaintenanceWorkerMain");
	snprintf(worker.bgw_name, BGW_MAXLEN, "pg_outbox maintenance %u", dbid);
	snprintf(worker.bgw_type, BGW_MAXLEN, "pg_outbox maintenance");
	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
		return NULL;
	return handle;
}

/*
 * Entry point of the launcher: each interval, every database that accepts
 * connections (less those recently found without the extension) gets a
 * maintenance run, at most OUTBOX_LAUNCHER_MAX_WORKERS at a time.
 */
void
OutboxLauncherMain(Datum main_arg)
{
	List	   *running = NIL;	/* of OutboxWorkerEntry *: started, not yet exited */
	List	   *pending = NIL;	/* Oids of databases still to run this round */
	TimestampTz next_round = 0;
	int			rounds = 0;
	bool		slots_warned = false;

	OutboxWorkerSignals();
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);

	SpinLockAcquire(&Launcher->mutex);
	Launcher->launcher_latch = MyLatch;
	Launcher->nabsent = 0;
	SpinLockRelease(&Launcher->mutex);
	ereport(LOG,
			(errmsg("pg_outbox launcher started, maintaining every database with pg_outbox every %d ms",
					pg_outbox_maintenance_interval)));

	while (!got_sigterm)
	{
		List	   *still = NIL;
		ListCell   *lc;
		bool		woken;
		TimestampTz now = GetCurrentTimestamp();

		/* Forget the runs that ended. */
		foreach(lc, running)
		{
			OutboxWorkerEntry *w = lfirst(lc);
			pid_t		pid;

			if (GetBackgroundWorkerPid(w->handle, &pid) == BGWH_STOPPED)
			{
				pfree(w->handle);
				pfree(w);
			}
			else
				still = lappend(still, w);
		}
		list_free(running);
		running = still;

		SpinLockAcquire(&Launcher->mutex);
		woken = Launcher->woken;
		Launcher->woken = false;
		SpinLockRelease(&Launcher->mutex);

		/* A new round: every database, unless its last run is still going. */
		if (now >= next_round || woken)
		{
			List	   *dbs = OutboxDatabases();

			/* Every so many rounds, look again at databases without the extension. */
			if (++rounds % OUTBOX_LAUNCHER_RECHECK == 0)
			{
				SpinLockAcquire(&Launcher->mutex);
				Launcher->nabsent = 0;
				SpinLockRelease(&Launcher->mutex);
			}
			list_free(pending);
			pending = NIL;
			foreach(lc, dbs)
			{
				Oid			dbid = lfirst_oid(lc);
				ListCell   *wc;
				bool		busy = false;

				foreach(wc, running)
					busy |= ((OutboxWorkerEntry *) lfirst(wc))->dbid == dbid;
				if (!busy && !OutboxDatabaseAbsent(dbid))
					pending = lappend_oid(pending, dbid);
			}
			list_free(dbs);
			next_round = TimestampTzPlusMilliseconds(now, pg_outbox_maintenance_interval);
		}

		/* Start what the round still owes, a few at a time. */
		while (pending != NIL && list_length(running) < OUTBOX_LAUNCHER_MAX_WORKERS)
		{
			Oid			dbid = linitial_oid(pending);
			BackgroundWorkerHandle *handle = OutboxStartWorker(dbid);
			OutboxWorkerEntry *w;

			if (handle == NULL)
			{
				if (!slots_warned)
					ereport(WARNING,
							(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
							 errmsg("pg_outbox launcher could not start a maintenance run: no background worker slot is free"),
							 errdetail("Maintenance runs one background worker at a time per database, at most %d at once.",
									   OUTBOX_LAUNCHER_MAX_WORKERS),
							 errhint("Raise max_worker_processes (a server restart is needed).")));
				slots_warned = true;
				break;
			}
			slots_warned = false;
			pending = list_delete_first(pending);
			w = palloc(sizeof(OutboxWorkerEntry));
			w->dbid = dbid;
			w->handle = handle;
			running = lappend(running, w);
		}

		/*
		 * Until the next round, or earlier: a run that ended (its worker
		 * reports to this process), an install that committed, SIGHUP.
		 */
		OutboxLauncherWait(Max(1, TimestampDifferenceMilliseconds(GetCurrentTimestamp(), next_round)));
	}

	SpinLockAcquire(&Launcher->mutex);
	Launcher->launcher_latch = NULL;
	SpinLockRelease(&Launcher->mutex);
	ereport(LOG, (errmsg("pg_outbox launcher stopping")));
	proc_exit(0);
}

/*
 * One maintenance run in its own transaction: outbox_maintain() in the
 * schema the extension was installed in, each action logged. False when
 * the extension is not installed.
 */
static bool
OutboxRunMaintenance(void)
{
	bool		installed;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "SELECT outbox_maintain()");

	installed = SPI_execute("SELECT n.nspname FROM pg_catalog.pg_extension e "
							"JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace "
							"WHERE e.extname = 'pg_outbox'", true, 1) == SPI_OK_SELECT &&
		SPI_processed == 1;
	if (installed)
	{
		char	   *schema = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
		char	   *sql = psprintf("SELECT action, object, detail FROM %s.outbox_maintain()",
								   quote_identifier(schema));
		uint64		i;

		if (SPI_execute(sql, false, 0) != SPI_OK_SELECT)
			elog(ERROR, "could not run outbox_maintain()");
		for (i = 0; i < SPI_processed; i++)
		{
			HeapTuple	row = SPI_tuptable->vals[i];
			TupleDesc	desc = SPI_tuptable->tupdesc;
			char	   *object = SPI_getvalue(row, desc, 2);

			ereport(LOG,
					(errmsg("pg_outbox maintenance: %s%s%s: %s",
							SPI_getvalue(row, desc, 1),
							object ? " " : "", object ? object : "",
							SPI_getvalue(row, desc, 3))));
		}
	}

	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();

	/*
	 * The run held a transaction id, and with it the xid8 horizon: a
	 * relay sleeping in outbox_fetch() that a commit woke meanwhile found
	 * its events still above the horizon and went back to sleep. Now that
	 * the run has ended, the horizon may have passed them.
	 */
	OutboxWakeSleepers();
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);
	return installed;
}

/*
 * Entry point of a maintenance worker: one maintenance run in its
 * database, then exit. Between runs no pg_outbox process is connected to
 * the database, so DROP DATABASE or a CREATE DATABASE that copies it is
 * held up by nothing longer than a run.
 */
void
OutboxMaintenanceWorkerMain(Datum main_arg)
{
	bool		installed = true;

	OutboxWorkerSignals();
	BackgroundWorkerInitializeConnectionByOid(DatumGetObjectId(main_arg), InvalidOid, 0);

	/* The database's own settings apply by now (ALTER DATABASE ... SET). */
	if (!BackgroundMaintenance)
		proc_exit(0);

	/*
	 * But not its search_path: the database's owner may set one that puts a
	 * schema of its own before pg_catalog, and this process runs as the
	 * bootstrap superuser. Its statements resolve names in pg_catalog alone
	 * (I-17).
	 */
	SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET, PGC_S_OVERRIDE);

	PG_TRY();
	{
		installed = OutboxRunMaintenance();
	}
	PG_CATCH();
	{
		/* Log it; the next round runs again. */
		EmitErrorReport();
		FlushErrorState();
		AbortCurrentTransaction();
	}
	PG_END_TRY();

	if (!installed)
	{
		/* Not a database of pg_outbox: looked at again only now and then. */
		OutboxNoteAbsent();
		ereport(DEBUG1,
				(errmsg("pg_outbox is not installed in database %u: not maintained", MyDatabaseId)));
	}
	proc_exit(0);
}

/*
 * outbox.maintenance_wake(): called by the install script; once the
 * installing transaction commits, the launcher looks at every database
 * again and maintenance starts here at once. Nothing without preloading.
 */
Datum
outbox_maintenance_wake(PG_FUNCTION_ARGS)
{
	WakeAtCommit = Launcher != NULL;
	PG_RETURN_BOOL(Launcher != NULL);
}
