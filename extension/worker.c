/*-------------------------------------------------------------------------
 *
 * worker.c
 *	  The maintenance background worker.
 *
 * When pg_outbox is in shared_preload_libraries, a background worker
 * connects to pg_outbox.database and runs outbox_maintain() every
 * pg_outbox.maintenance_interval, if the extension is installed there.
 * It waits on its latch (so SIGHUP and postmaster death wake it), reloads
 * its settings on SIGHUP, exits cleanly on SIGTERM, and survives an error
 * in a run: the error is logged, the transaction aborted, and the next run
 * happens on time.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"

#include "pg_outbox.h"

PGDLLEXPORT void OutboxMaintenanceWorkerMain(Datum main_arg);

char	   *pg_outbox_database = NULL;
int			pg_outbox_maintenance_interval = OUTBOX_DEFAULT_MAINTENANCE_INTERVAL;

static volatile sig_atomic_t got_sigterm = false;

/* Defines the worker's settings and, when preloading, registers it. */
void
OutboxWorkerInit(void)
{
	BackgroundWorker worker;

	DefineCustomIntVariable("pg_outbox.maintenance_interval",
							"How often the maintenance worker runs outbox_maintain().",
							NULL,
							&pg_outbox_maintenance_interval,
							OUTBOX_DEFAULT_MAINTENANCE_INTERVAL,
							OUTBOX_MIN_MAINTENANCE_INTERVAL,
							OUTBOX_MAX_MAINTENANCE_INTERVAL,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	/* A postmaster-level setting can only be defined while preloading. */
	if (!process_shared_preload_libraries_in_progress)
		return;

	DefineCustomStringVariable("pg_outbox.database",
							   "Database in which the maintenance worker runs outbox_maintain().",
							   "Only used when pg_outbox is in shared_preload_libraries.",
							   &pg_outbox_database,
							   "postgres",
							   PGC_POSTMASTER,
							   0,
							   NULL, NULL, NULL);

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = 10;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "pg_outbox");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "OutboxMaintenanceWorkerMain");
	snprintf(worker.bgw_name, BGW_MAXLEN, "pg_outbox maintenance");
	snprintf(worker.bgw_type, BGW_MAXLEN, "pg_outbox maintenance");
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

/*
 * One maintenance run in its own transaction: outbox_maintain() in the
 * schema the extension was installed in, each action logged. Does nothing
 * while the extension is not installed.
 */
static void
OutboxRunMaintenance(void)
{
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "SELECT outbox_maintain()");

	if (SPI_execute("SELECT n.nspname FROM pg_catalog.pg_extension e "
					"JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace "
					"WHERE e.extname = 'pg_outbox'", true, 1) == SPI_OK_SELECT &&
		SPI_processed == 1)
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
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);
}

/* Entry point of the maintenance worker. */
void
OutboxMaintenanceWorkerMain(Datum main_arg)
{
	MemoryContext loop_context;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, OutboxWorkerSigterm);
	BackgroundWorkerUnblockSignals();

	BackgroundWorkerInitializeConnection(pg_outbox_database, NULL, 0);
	ereport(LOG,
			(errmsg("pg_outbox maintenance worker started in database \"%s\", running every %d ms",
					pg_outbox_database, pg_outbox_maintenance_interval)));

	loop_context = AllocSetContextCreate(TopMemoryContext, "pg_outbox maintenance",
										 ALLOCSET_DEFAULT_SIZES);

	while (!got_sigterm)
	{
		int			rc;

		rc = WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
					   pg_outbox_maintenance_interval, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();

		if (got_sigterm)
			break;
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			ereport(LOG,
					(errmsg("pg_outbox maintenance worker reloaded its settings, running every %d ms",
							pg_outbox_maintenance_interval)));
		}
		if (!(rc & WL_TIMEOUT))
			continue;

		MemoryContextSwitchTo(loop_context);
		PG_TRY();
		{
			OutboxRunMaintenance();
		}
		PG_CATCH();
		{
			/* Log it, abort the run, and try again at the next interval. */
			EmitErrorReport();
			FlushErrorState();
			AbortCurrentTransaction();
			pgstat_report_activity(STATE_IDLE, NULL);
		}
		PG_END_TRY();
		MemoryContextSwitchTo(TopMemoryContext);
		MemoryContextReset(loop_context);
	}

	ereport(LOG, (errmsg("pg_outbox maintenance worker stopping")));
	proc_exit(0);
}
