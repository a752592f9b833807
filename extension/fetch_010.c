/*-------------------------------------------------------------------------
 *
 * fetch_010.c
 *	  outbox_fetch() on the SQL objects of version 0.1.0.
 *
 * A database whose library was updated but whose SQL objects are still
 * those of 0.1.0 (ALTER EXTENSION pg_outbox UPDATE not yet run) has no
 * lease in its groups: its batches are placed by its own
 * outbox.fetch_args(), which also takes the leadership by its advisory
 * lock (lead.c keeps the C functions 0.1.0's SQL declares). fetch.c comes
 * here when the group's table has no lease columns; the batch is then read
 * as any other.
 *
 * This file goes in version 0.3.0: a library of 0.3.0 requires the SQL
 * objects of 0.2.0 at least, and the 0.1.0 functions of lead.c go with it.
 *
 * Layering: called by fetch.c only.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/xid8.h"

#include "feed.h"
#include "fetch.h"

/* The call of outbox.fetch_args(), prepared once per session. */
static SPIPlanPtr FetchArgsPlan = NULL;

/* A column of outbox.fetch_args()'s row (0.1.0), by name. */
static Datum
OutboxArg(HeapTuple row, TupleDesc desc, const char *name, bool *isnull)
{
	int			column = SPI_fnumber(desc, name);

	if (column <= 0)
		elog(ERROR, "outbox.fetch_args() has no column \"%s\"", name);
	return SPI_getbinval(row, desc, column, isnull);
}

/* Reads outbox.fetch_args()'s row; topics are copied into the current memory. */
static void
OutboxReadArgs(HeapTuple row, TupleDesc desc, FeedRange *a)
{
	bool		isnull;
	int			column;
	Datum		topics;

	a->commit = strcmp(TextDatumGetCString(OutboxArg(row, desc, "ordering", &isnull)), "commit") == 0;
	if (a->commit)
	{
		a->cursor_ticket = DatumGetInt64(OutboxArg(row, desc, "cursor_ticket", &isnull));
		if (isnull)
			elog(ERROR, "outbox.fetch_args() returned no cursor");
		a->horizon = DatumGetInt64(OutboxArg(row, desc, "horizon", &isnull));
		if (isnull)
			elog(ERROR, "outbox.fetch_args() returned no commit horizon");
	}
	else
	{
		a->cursor_txid = U64FromFullTransactionId(
			DatumGetFullTransactionId(OutboxArg(row, desc, "cursor_txid", &isnull)));
		if (isnull)
			elog(ERROR, "outbox.fetch_args() returned no cursor");
	}
	a->cursor_seq = DatumGetInt64(OutboxArg(row, desc, "cursor_seq", &isnull));
	a->limit = DatumGetInt32(OutboxArg(row, desc, "row_limit", &isnull));
	/* No epoch before 0.2.0's SQL (a new library before ALTER EXTENSION UPDATE). */
	column = SPI_fnumber(desc, "epoch");
	a->epoch = column > 0 ? (uint64) DatumGetInt64(SPI_getbinval(row, desc, column, &isnull)) : 0;
	a->below = U64FromFullTransactionId(DatumGetFullTransactionId(OutboxArg(row, desc, "below", &isnull)));
	if (isnull)
		elog(ERROR, "outbox.fetch_args() returned no transaction id bound");

	/* Copied: the row goes with the next SPI call. */
	topics = OutboxArg(row, desc, "topics", &isnull);
	OutboxRangeTopics(a, isnull ? NULL : DatumGetArrayTypePCopy(topics));
}


bool
OutboxPlaceBatchByArgs(Datum *args, char *nulls, FeedRange *a)
{
	MemoryContext caller = CurrentMemoryContext;
	bool		placed = false;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (FetchArgsPlan == NULL)
	{
		Oid			argtypes[3] = {TEXTOID, INT4OID, TEXTOID};
		SPIPlanPtr	plan = SPI_prepare("SELECT * FROM outbox.fetch_args($1, $2, $3)", 3, argtypes);

		if (plan == NULL || SPI_keepplan(plan) != 0)
			elog(ERROR, "pg_outbox: preparing the call of outbox.fetch_args() failed: %s",
				 SPI_result_code_string(SPI_result));
		FetchArgsPlan = plan;
	}
	if (SPI_execute_plan(FetchArgsPlan, args, nulls, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "pg_outbox: outbox.fetch_args() failed");
	if (SPI_processed == 1)
	{
		/* The range outlives SPI's memory: it is made in the caller's. */
		MemoryContext spi = MemoryContextSwitchTo(caller);

		memset(a, 0, sizeof(*a));
		a->name = nulls[0] == 'n' ? "" : TextDatumGetCString(args[0]);
		OutboxReadArgs(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, a);
		MemoryContextSwitchTo(spi);
		placed = true;
	}
	SPI_finish();
	return placed;
}
