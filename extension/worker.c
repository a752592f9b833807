/*-------------------------------------------------------------------------
 *
 * worker.c
 *	  Maintenance background workers: a launcher and one worker per
 *	  database that uses pg_outbox.
 *
 * When pg_outbox is in shared_preload_libraries, a launcher starts with the
 * server. It connects to no database (it reads pg_database, a shared
 * catalog) and starts maintenance runs in each database that accepts
 * connections: a background worker that connects to the database, runs
 * outbox_maintain() if the extension is installed there, and exits. Where
 * it is not, the worker says so, and the launcher looks at that database
 * again only every OUTBOX_LAUNCHER_RECHECK intervals. Installing the
 * extension wakes the launcher when its transaction commits, so a new
 * database is maintained at once. Nothing lists databases by hand, and a
 * consumer-only database (inbox partitions, inbox retention) is maintained
 * like a producer's.
 *
 * The schedule is fair: a database is due one pg_outbox.maintenance_interval
 * after its last run started, and of the databases due, the one whose last
 * run started first runs first. When the runs of all databases take longer
 * than the interval, every database still runs in turn, each once per
 * round of all of them: none is late by more than the round's length
 * beyond its interval. (Starting every round from the head of pg_database
 * instead would run the first databases every interval and starve the
 * last ones.) The launcher keeps the schedule in its own memory, unbounded;
 * what each database's last run did is published in shared memory, for
 * outbox_maintenance_databases(), for OUTBOX_MAX_DATABASES databases.
 *
 * A run holds a database connection only while it runs, so DROP DATABASE
 * and CREATE DATABASE ... TEMPLATE are not held up between runs; at most
 * OUTBOX_LAUNCHER_MAX_WORKERS runs go at once, so that maintenance takes
 * few of max_worker_processes' slots. When no slot is free the launcher
 * logs it once, with the fix, and tries again.
 *
 * The launcher waits on its latch until the next database is due (a run
 * that ended, an install, SIGHUP and postmaster death wake it), and exits
 * cleanly on SIGTERM. On SIGHUP it reloads its settings and computes every
 * database's next run with the new interval at once, so a shorter interval
 * takes effect within itself, not after the wait armed with the old one.
 * An error in a run is logged, shown as the database's last outcome, and
 * the next run comes on time.
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
#include "funcapi.h"
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
#include "utils/tuplestore.h"

#include "wakeup.h"
#include "worker.h"

/* pg_outbox.maintenance_interval, in milliseconds */
#define OUTBOX_DEFAULT_MAINTENANCE_INTERVAL	(60 * 1000)
#define OUTBOX_MIN_MAINTENANCE_INTERVAL		100
#define OUTBOX_MAX_MAINTENANCE_INTERVAL		(24 * 60 * 60 * 1000)

/* Databases without the extension are looked at again every so many intervals. */
#define OUTBOX_LAUNCHER_RECHECK		10

/* Databases whose last run shared memory shows; more are maintained all the same. */
#define OUTBOX_MAX_DATABASES		1024

/* Maintenance runs at once, at most: each takes a background worker slot. */
#define OUTBOX_LAUNCHER_MAX_WORKERS	2

PGDLLEXPORT void OutboxLauncherMain(Datum main_arg);
PGDLLEXPORT void OutboxMaintenanceWorkerMain(Datum main_arg);

PG_FUNCTION_INFO_V1(outbox_maintenance_wake);
PG_FUNCTION_INFO_V1(outbox_maintenance_databases);

/* pg_outbox.maintenance_interval */
static int	pg_outbox_maintenance_interval = OUTBOX_DEFAULT_MAINTENANCE_INTERVAL;

/* pg_outbox.background_maintenance: off in a database, its runs do nothing. */
static bool BackgroundMaintenance = true;

/* How a database's last run went, as outbox_maintenance_databases() says. */
typedef enum OutboxRunOutcome
{
	OUTBOX_RUN_NONE = 0,		/* no run yet */
	OUTBOX_RUN_RUNNING,			/* started, not ended */
	OUTBOX_RUN_OK,				/* outbox_maintain() ran */
	OUTBOX_RUN_SKIPPED,			/* another run (a relay's, a call's) held the lock */
	OUTBOX_RUN_FAILED,			/* an error, logged; or the worker ended early */
	OUTBOX_RUN_NOT_INSTALLED,	/* the database has no pg_outbox */
	OUTBOX_RUN_OFF				/* pg_outbox.background_maintenance is off there */
} OutboxRunOutcome;

static const char *const OutboxRunOutcomeNames[] = {
	[OUTBOX_RUN_NONE] = "none",
	[OUTBOX_RUN_RUNNING] = "running",
	[OUTBOX_RUN_OK] = "ok",
	[OUTBOX_RUN_SKIPPED] = "skipped",
	[OUTBOX_RUN_FAILED] = "failed",
	[OUTBOX_RUN_NOT_INSTALLED] = "not installed",
	[OUTBOX_RUN_OFF] = "off",
};

/*
 * The last run of one database, in shared memory. The launcher takes a
 * slot for a database it finds and frees it when the database is gone; it
 * writes the start of each run, the run's worker its end.
 */
typedef struct OutboxDatabaseStatus
{
	Oid			dbid;			/* InvalidOid: a free slot */
	OutboxRunOutcome outcome;
	int64		runs;			/* runs started since the launcher started */
	TimestampTz started;
	TimestampTz finished;
} OutboxDatabaseStatus;

/* What the launcher, the workers and outbox_maintenance_databases() share. */
typedef struct OutboxLauncherShared
{
	slock_t		mutex;			/* protects launcher_latch and woken */
	Latch	   *launcher_latch; /* NULL while no launcher runs */
	bool		woken;			/* an install committed: look at every database now */
	LWLock	   *lock;			/* protects status */
	OutboxDatabaseStatus status[OUTBOX_MAX_DATABASES];
} OutboxLauncherShared;

static OutboxLauncherShared *Launcher = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* A database in the launcher's schedule (its own memory). */
typedef struct OutboxScheduled
{
	Oid			dbid;
	int			slot;			/* its status in shared memory, or -1 */
	TimestampTz last_start;		/* 0: never started */
	bool		absent;			/* its last run found no pg_outbox */
	bool		now;			/* due at once (an install committed) */
	bool		listed;			/* found in pg_database by the last look */
	BackgroundWorkerHandle *handle; /* its run, while one goes */
} OutboxScheduled;

static volatile sig_atomic_t got_sigterm = false;

/* This transaction installed the extension: wake the launcher at commit. */
static bool WakeAtCommit = false;

static void
OutboxLauncherShmemRequest(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(sizeof(OutboxLauncherShared));
	RequestNamedLWLockTranche("pg_outbox maintenance", 1);
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
		Launcher->lock = &(GetNamedLWLockTranche("pg_outbox maintenance"))->lock;
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
							"How often the maintenance workers run outbox_maintain() in each database.",
							"A database is due this long after its last run started; a reload applies at once.",
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
 * something woke it, and reloads its settings on SIGHUP; true when it did.
 */
static bool
OutboxLauncherWait(long timeout)
{
	(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, timeout, PG_WAIT_EXTENSION);
	ResetLatch(MyLatch);
	CHECK_FOR_INTERRUPTS();
	if (!ConfigReloadPending)
		return false;
	ConfigReloadPending = false;
	ProcessConfigFile(PGC_SIGHUP);
	ereport(LOG,
			(errmsg("pg_outbox launcher reloaded its settings, running every %d ms",
					pg_outbox_maintenance_interval)));
	return true;
}

/*
 * The slot of a database's status, taken for it when it has none: its own
 * from an earlier launcher, else a free one; -1 when none is free.
 */
static int
OutboxStatusSlot(Oid dbid)
{
	int			free_slot = -1;
	int			i;

	LWLockAcquire(Launcher->lock, LW_EXCLUSIVE);
	for (i = 0; i < OUTBOX_MAX_DATABASES; i++)
	{
		if (Launcher->status[i].dbid == dbid)
		{
			LWLockRelease(Launcher->lock);
			return i;
		}
		if (free_slot < 0 && !OidIsValid(Launcher->status[i].dbid))
			free_slot = i;
	}
	if (free_slot >= 0)
	{
		memset(&Launcher->status[free_slot], 0, sizeof(OutboxDatabaseStatus));
		Launcher->status[free_slot].dbid = dbid;
	}
	LWLockRelease(Launcher->lock);
	return free_slot;
}

/* Frees the status slots of the databases that are gone ("keep" lists the rest). */
static void
OutboxStatusForget(List *keep)
{
	int			i;

	LWLockAcquire(Launcher->lock, LW_EXCLUSIVE);
	for (i = 0; i < OUTBOX_MAX_DATABASES; i++)
		if (OidIsValid(Launcher->status[i].dbid) && !list_member_oid(keep, Launcher->status[i].dbid))
			Launcher->status[i].dbid = InvalidOid;
	LWLockRelease(Launcher->lock);
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

/*
 * Brings the schedule up to date with pg_database: a new database is due
 * at once, one that is gone leaves once its run (if one goes) ended.
 */
static List *
OutboxScheduleRefresh(List *schedule)
{
	List	   *dbs = OutboxDatabases();
	List	   *kept = NIL;
	List	   *keep_oids = NIL;
	ListCell   *lc;
	static bool full_warned = false;

	foreach(lc, schedule)
		((OutboxScheduled *) lfirst(lc))->listed = false;
	foreach(lc, dbs)
	{
		Oid			dbid = lfirst_oid(lc);
		ListCell   *sc;
		OutboxScheduled *d = NULL;

		foreach(sc, schedule)
		{
			if (((OutboxScheduled *) lfirst(sc))->dbid == dbid)
			{
				d = lfirst(sc);
				break;
			}
		}
		if (d == NULL)
		{
			d = palloc0(sizeof(OutboxScheduled));
			d->dbid = dbid;
			d->slot = OutboxStatusSlot(dbid);
			if (d->slot < 0 && !full_warned)
			{
				ereport(WARNING,
						(errmsg("pg_outbox launcher shows the maintenance of %d databases at most",
								OUTBOX_MAX_DATABASES),
						 errdetail("Database %u and later ones are maintained, but outbox_maintenance_databases() does not list them.",
								   dbid)));
				full_warned = true;
			}
			schedule = lappend(schedule, d);
		}
		d->listed = true;
	}
	foreach(lc, schedule)
	{
		OutboxScheduled *d = lfirst(lc);

		if (d->listed || d->handle != NULL)
		{
			kept = lappend(kept, d);
			keep_oids = lappend_oid(keep_oids, d->dbid);
		}
		else
			pfree(d);
	}
	OutboxStatusForget(keep_oids);
	list_free(keep_oids);
	list_free(schedule);
	list_free(dbs);
	return kept;
}

/* When a database is due next: its last start plus an interval (ten when absent). */
static TimestampTz
OutboxDue(const OutboxScheduled *d)
{
	if (d->now || d->last_start == 0)
		return 0;
	return TimestampTzPlusMilliseconds(d->last_start,
									   (int64) pg_outbox_maintenance_interval *
									   (d->absent ? OUTBOX_LAUNCHER_RECHECK : 1));
}

/*
 * The next database to run: of those due and not running, the one whose
 * last run started first (never, first of all); NULL when none is due.
 */
static OutboxScheduled *
OutboxNextDue(List *schedule, TimestampTz now)
{
	OutboxScheduled *next = NULL;
	ListCell   *lc;

	foreach(lc, schedule)
	{
		OutboxScheduled *d = lfirst(lc);

		if (d->handle != NULL || !d->listed || OutboxDue(d) > now)
			continue;
		if (next == NULL || (d->now && !next->now) ||
			(d->now == next->now && d->last_start < next->last_start))
			next = d;
	}
	return next;
}

/* Records the start of a run in the database's status. */
static void
OutboxStatusStarted(const OutboxScheduled *d)
{
	OutboxDatabaseStatus *s;

	if (d->slot < 0)
		return;
	LWLockAcquire(Launcher->lock, LW_EXCLUSIVE);
	s = &Launcher->status[d->slot];
	if (s->dbid == d->dbid)
	{
		s->outcome = OUTBOX_RUN_RUNNING;
		s->started = d->last_start;
		s->runs++;
	}
	LWLockRelease(Launcher->lock);
}

/*
 * A run's worker exited: what it recorded, or "failed" when it recorded
 * nothing (it ended before its run did: a FATAL error, the database
 * dropped meanwhile).
 */
static OutboxRunOutcome
OutboxStatusEnded(const OutboxScheduled *d)
{
	OutboxDatabaseStatus *s;
	OutboxRunOutcome outcome = OUTBOX_RUN_OK;

	/*
	 * Without a slot nothing was recorded: the run counts as one that ran,
	 * and a database without the extension is looked at every interval.
	 */
	if (d->slot < 0)
		return outcome;
	LWLockAcquire(Launcher->lock, LW_EXCLUSIVE);
	s = &Launcher->status[d->slot];
	if (s->dbid == d->dbid)
	{
		if (s->outcome == OUTBOX_RUN_RUNNING)
		{
			s->outcome = OUTBOX_RUN_FAILED;
			s->finished = GetCurrentTimestamp();
		}
		outcome = s->outcome;
	}
	LWLockRelease(Launcher->lock);
	return outcome;
}

/* Starts a maintenance worker for a database; NULL when no slot is free. */
static BackgroundWorkerHandle *
OutboxStartWorker(const OutboxScheduled *d)
{
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	worker.bgw_main_arg = ObjectIdGetDatum(d->dbid);
	worker.bgw_notify_pid = MyProcPid;
	/* The worker records its outcome in this status slot. */
	memcpy(worker.bgw_extra, &d->slot, sizeof(d->slot));
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "pg_outbox");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "OutboxMaintenanceWorkerMain");
	snprintf(worker.bgw_name, BGW_MAXLEN, "pg_outbox maintenance %u", d->dbid);
	snprintf(worker.bgw_type, BGW_MAXLEN, "pg_outbox maintenance");
	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
		return NULL;
	return handle;
}

/*
 * Entry point of the launcher: runs each database that accepts connections
 * when it is due (OutboxNextDue), at most OUTBOX_LAUNCHER_MAX_WORKERS at a
 * time, and looks at pg_database once an interval for databases created or
 * dropped.
 */
void
OutboxLauncherMain(Datum main_arg)
{
	List	   *schedule = NIL; /* of OutboxScheduled * */
	int			running = 0;
	TimestampTz next_look = 0;
	TimestampTz retry_at = 0;	/* no worker slot was free: not before then */
	bool		slots_warned = false;

	OutboxWorkerSignals();
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);

	/* What an earlier launcher recorded is forgotten, with its schedule. */
	LWLockAcquire(Launcher->lock, LW_EXCLUSIVE);
	memset(Launcher->status, 0, sizeof(Launcher->status));
	LWLockRelease(Launcher->lock);
	SpinLockAcquire(&Launcher->mutex);
	Launcher->launcher_latch = MyLatch;
	SpinLockRelease(&Launcher->mutex);
	ereport(LOG,
			(errmsg("pg_outbox launcher started, maintaining every database with pg_outbox every %d ms",
					pg_outbox_maintenance_interval)));

	while (!got_sigterm)
	{
		ListCell   *lc;
		bool		woken;
		TimestampTz now = GetCurrentTimestamp();
		TimestampTz wake;
		OutboxScheduled *d;

		/* The runs that ended: how they went. */
		foreach(lc, schedule)
		{
			pid_t		pid;

			d = lfirst(lc);
			if (d->handle == NULL || GetBackgroundWorkerPid(d->handle, &pid) != BGWH_STOPPED)
				continue;
			d->absent = OutboxStatusEnded(d) == OUTBOX_RUN_NOT_INSTALLED;
			pfree(d->handle);
			d->handle = NULL;
			running--;
		}

		SpinLockAcquire(&Launcher->mutex);
		woken = Launcher->woken;
		Launcher->woken = false;
		SpinLockRelease(&Launcher->mutex);

		/* New and dropped databases; after an install, every one at once. */
		if (woken || now >= next_look)
		{
			schedule = OutboxScheduleRefresh(schedule);
			next_look = TimestampTzPlusMilliseconds(now, pg_outbox_maintenance_interval);
			foreach(lc, schedule)
			{
				d = lfirst(lc);
				if (woken && d->absent)
				{
					d->absent = false;
					d->now = true;
				}
			}
		}

		/* Start the databases due, the longest waiting first. */
		while (running < OUTBOX_LAUNCHER_MAX_WORKERS && now >= retry_at &&
			   (d = OutboxNextDue(schedule, now)) != NULL)
		{
			BackgroundWorkerHandle *handle = OutboxStartWorker(d);

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
				retry_at = TimestampTzPlusMilliseconds(now, Min(pg_outbox_maintenance_interval, 1000));
				break;
			}
			slots_warned = false;
			d->handle = handle;
			d->last_start = now;
			d->now = false;
			OutboxStatusStarted(d);
			running++;
		}

		/*
		 * Until the next database is due or the next look at pg_database,
		 * or earlier: a run that ended (its worker reports to this
		 * process), an install that committed, SIGHUP. While every run
		 * slot is taken, only a run that ends frees one.
		 */
		wake = next_look;
		if (now < retry_at)
			wake = Min(wake, retry_at);
		else if (running < OUTBOX_LAUNCHER_MAX_WORKERS)
		{
			foreach(lc, schedule)
			{
				d = lfirst(lc);
				if (d->handle == NULL && d->listed)
					wake = Min(wake, OutboxDue(d));
			}
		}
		if (OutboxLauncherWait(Max(1, TimestampDifferenceMilliseconds(GetCurrentTimestamp(), wake))))
		{
			/* The new interval applies to the next look as well. */
			next_look = 0;
		}
	}

	SpinLockAcquire(&Launcher->mutex);
	Launcher->launcher_latch = NULL;
	SpinLockRelease(&Launcher->mutex);
	ereport(LOG, (errmsg("pg_outbox launcher stopping")));
	proc_exit(0);
}

/*
 * One maintenance run in its own transaction: outbox_maintain() in the
 * schema the extension was installed in, each action logged. Returns how
 * it went: ok, skipped (another run held the maintenance lock), or not
 * installed.
 */
static OutboxRunOutcome
OutboxRunMaintenance(void)
{
	OutboxRunOutcome outcome = OUTBOX_RUN_NOT_INSTALLED;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "SELECT outbox_maintain()");

	if (SPI_execute("SELECT n.nspname FROM pg_catalog.pg_extension e "
					"JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace "
					"WHERE e.extname OPERATOR(pg_catalog.=) 'pg_outbox'::pg_catalog.name", true, 1) == SPI_OK_SELECT &&
		SPI_processed == 1)
	{
		char	   *schema = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
		char	   *sql = psprintf("SELECT action, object, detail FROM %s.outbox_maintain()",
								   quote_identifier(schema));
		uint64		i;

		if (SPI_execute(sql, false, 0) != SPI_OK_SELECT)
			elog(ERROR, "could not run outbox_maintain()");
		outcome = OUTBOX_RUN_OK;
		for (i = 0; i < SPI_processed; i++)
		{
			HeapTuple	row = SPI_tuptable->vals[i];
			TupleDesc	desc = SPI_tuptable->tupdesc;
			char	   *action = SPI_getvalue(row, desc, 1);
			char	   *object = SPI_getvalue(row, desc, 2);

			if (action != NULL && strcmp(action, "skipped") == 0)
				outcome = OUTBOX_RUN_SKIPPED;
			ereport(LOG,
					(errmsg("pg_outbox maintenance: %s%s%s: %s",
							action ? action : "",
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
	return outcome;
}

/* Records how this worker's run ended, in the slot the launcher gave it. */
static void
OutboxStatusRecord(OutboxRunOutcome outcome)
{
	int			slot;

	memcpy(&slot, MyBgworkerEntry->bgw_extra, sizeof(slot));
	if (slot < 0 || slot >= OUTBOX_MAX_DATABASES)
		return;
	LWLockAcquire(Launcher->lock, LW_EXCLUSIVE);
	/* The slot is this database's unless the launcher restarted since. */
	if (Launcher->status[slot].dbid == MyDatabaseId)
	{
		Launcher->status[slot].outcome = outcome;
		Launcher->status[slot].finished = GetCurrentTimestamp();
	}
	LWLockRelease(Launcher->lock);
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
	OutboxRunOutcome outcome = OUTBOX_RUN_FAILED;

	OutboxWorkerSignals();
	BackgroundWorkerInitializeConnectionByOid(DatumGetObjectId(main_arg), InvalidOid, 0);

	/* The database's own settings apply by now (ALTER DATABASE ... SET). */
	if (!BackgroundMaintenance)
	{
		OutboxStatusRecord(OUTBOX_RUN_OFF);
		proc_exit(0);
	}

	/*
	 * But not its search_path: the database's owner may set one that puts a
	 * schema of its own before pg_catalog, and this process runs as the
	 * bootstrap superuser. Its statements resolve names in pg_catalog alone
	 * (I-17).
	 */
	SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET, PGC_S_OVERRIDE);

	PG_TRY();
	{
		outcome = OutboxRunMaintenance();
	}
	PG_CATCH();
	{
		/* Log it; the next run comes on time. */
		EmitErrorReport();
		FlushErrorState();
		AbortCurrentTransaction();
	}
	PG_END_TRY();

	/* Not a database of pg_outbox: looked at again only now and then. */
	if (outcome == OUTBOX_RUN_NOT_INSTALLED)
		ereport(DEBUG1,
				(errmsg("pg_outbox is not installed in database %u: not maintained", MyDatabaseId)));
	OutboxStatusRecord(outcome);
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

/* A database's status with its name, as outbox_maintenance_databases() sorts them. */
typedef struct OutboxStatusRow
{
	char	   *name;
	OutboxDatabaseStatus status;
} OutboxStatusRow;

static int
OutboxStatusRowCompare(const void *a, const void *b)
{
	return strcmp(((const OutboxStatusRow *) a)->name, ((const OutboxStatusRow *) b)->name);
}

/*
 * outbox_maintenance_databases(): the last background maintenance run of
 * every database the launcher maintains, by database name. Raises 55000
 * without preloading: then no background worker maintains anything.
 */
Datum
outbox_maintenance_databases(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	OutboxStatusRow *rows;
	int			nrows = 0;
	int			i;

	if (Launcher == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("background maintenance needs pg_outbox in shared_preload_libraries"),
				 errdetail("Without it no background worker runs maintenance, and nothing records runs."),
				 errhint("Add pg_outbox to shared_preload_libraries and restart the server, or read outbox_maintenance_status() in each database.")));

	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);

	/* A copy first: the names are read from the catalog, without the lock. */
	rows = palloc(sizeof(OutboxStatusRow) * OUTBOX_MAX_DATABASES);
	LWLockAcquire(Launcher->lock, LW_SHARED);
	for (i = 0; i < OUTBOX_MAX_DATABASES; i++)
		if (OidIsValid(Launcher->status[i].dbid))
			rows[nrows++].status = Launcher->status[i];
	LWLockRelease(Launcher->lock);

	/* A database dropped since the launcher last looked is left out. */
	for (i = 0; i < nrows; i++)
		rows[i].name = get_database_name(rows[i].status.dbid);
	for (i = 0; i < nrows;)
	{
		if (rows[i].name == NULL)
			rows[i] = rows[--nrows];
		else
			i++;
	}
	qsort(rows, nrows, sizeof(OutboxStatusRow), OutboxStatusRowCompare);

	for (i = 0; i < nrows; i++)
	{
		const OutboxDatabaseStatus *s = &rows[i].status;
		Datum		values[5];
		bool		nulls[5] = {false, false, false, false, false};

		values[0] = DirectFunctionCall1(namein, CStringGetDatum(rows[i].name));
		values[1] = Int64GetDatum(s->runs);
		values[2] = CStringGetTextDatum(OutboxRunOutcomeNames[s->outcome]);
		values[3] = TimestampTzGetDatum(s->started);
		nulls[3] = s->started == 0;
		values[4] = TimestampTzGetDatum(s->finished);
		nulls[4] = s->finished == 0 || s->outcome == OUTBOX_RUN_RUNNING;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
