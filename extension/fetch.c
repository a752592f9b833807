/*-------------------------------------------------------------------------
 *
 * fetch.c
 *	  outbox_fetch(): the next batch of a group's feed.
 *
 * What a batch is lives in SQL: outbox.fetch_args() checks the arguments,
 * takes the group's leadership and says where the batch starts (and, in
 * commit order, up to which commit horizon); outbox.fetch_sql() and
 * outbox.commit_fetch_sql() are the batch queries. This file runs them, in
 * that order, and hands the rows to the caller.
 *
 * It is written in C for one reason: where the rows are kept. A function
 * that returns a set hands its rows over in a tuplestore, and a relay asks
 * for a batch of some hundreds of kilobytes many times a second. Kept in the
 * calling query's memory, as PL/pgSQL keeps them, those kilobytes go back to
 * the operating system when the query ends and are faulted in again by the
 * next batch, which cost as much as running the batch query itself. Here
 * the tuplestore lives in a memory context of the backend that keeps the
 * memory its rows are freed into, for the next batch.
 *
 * That context is emptied when no batch is in use and it holds more than
 * OUTBOX_FETCH_KEEP_BYTES: a batch whose query failed leaves its rows
 * behind (nothing ends its tuplestore), and a large batch should not stay
 * allocated for the life of the session. A batch is in use from the call
 * until the calling query's memory goes away, which a callback on that
 * memory tells.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "executor/tstoreReceiver.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/params.h"
#include "utils/memutils.h"
#include "utils/tuplestore.h"

#include "pg_outbox.h"

/* Memory kept between batches, at most. */
#define OUTBOX_FETCH_KEEP_BYTES		(8 * 1024 * 1024)

PG_FUNCTION_INFO_V1(outbox_fetch);

/* Where batches' rows are kept, and how many batches are in use. */
static MemoryContext FetchContext = NULL;
static int	FetchesInUse = 0;

/*
 * Called when the memory of a query that called outbox_fetch() goes away:
 * its batch is no longer in use.
 */
static void
OutboxFetchDone(void *arg)
{
	Assert(FetchesInUse > 0);
	FetchesInUse--;
	if (FetchesInUse == 0 &&
		MemoryContextMemAllocated(FetchContext, true) > OUTBOX_FETCH_KEEP_BYTES)
		MemoryContextReset(FetchContext);
}

/* Sets a parameter of the batch query to a column of outbox.fetch_args(). */
static void
OutboxSetParam(ParamListInfo params, int i, Oid type, HeapTuple row, TupleDesc desc, int column)
{
	ParamExternData *param = &params->params[i];

	param->ptype = type;
	param->value = SPI_getbinval(row, desc, column, &param->isnull);
	/* Planned as a constant: partitions are pruned and ranges bounded. */
	param->pflags = PARAM_FLAG_CONST;
}

/*
 * outbox_fetch(group_name, batch_size, after): the rows of the group's next
 * batch, in feed order; none while another session leads the group.
 */
Datum
outbox_fetch(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Oid			argtypes[3] = {TEXTOID, INT4OID, TEXTOID};
	Datum		args[3];
	char		nulls[3];
	TupleDesc	tupdesc;
	Tuplestorestate *store;
	MemoryContext oldcontext;
	MemoryContextCallback *done;
	int			i;

	if (rsinfo == NULL || !IsA(rsinfo, ReturnSetInfo) ||
		(rsinfo->allowedModes & SFRM_Materialize) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("set-valued function called in context that cannot accept a set")));
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	if (FetchContext == NULL)
		FetchContext = AllocSetContextCreate(TopMemoryContext, "pg_outbox fetch",
											 ALLOCSET_DEFAULT_SIZES);

	/* The batch is in use until the calling query's memory goes away. */
	done = MemoryContextAlloc(rsinfo->econtext->ecxt_per_query_memory, sizeof(MemoryContextCallback));
	done->func = OutboxFetchDone;
	done->arg = NULL;
	MemoryContextRegisterResetCallback(rsinfo->econtext->ecxt_per_query_memory, done);
	FetchesInUse++;

	oldcontext = MemoryContextSwitchTo(FetchContext);
	store = tuplestore_begin_heap((rsinfo->allowedModes & SFRM_Materialize_Random) != 0,
								  false, work_mem);
	MemoryContextSwitchTo(oldcontext);
	rsinfo->returnMode = SFRM_Materialize;
	rsinfo->setResult = store;
	rsinfo->setDesc = CreateTupleDescCopy(tupdesc);

	for (i = 0; i < 3; i++)
	{
		args[i] = PG_GETARG_DATUM(i);
		nulls[i] = PG_ARGISNULL(i) ? 'n' : ' ';
	}

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");

	if (SPI_execute_with_args("SELECT * FROM outbox.fetch_args($1, $2, $3)",
							  3, argtypes, args, nulls, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "pg_outbox: outbox.fetch_args() failed");

	if (SPI_processed == 1)
	{
		HeapTuple	row = SPI_tuptable->vals[0];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		commit = strcmp(SPI_getvalue(row, desc, 1), "commit") == 0;
		char	   *sql = SPI_getvalue(row, desc, 2);
		ParamListInfo params = makeParamList(commit ? 6 : 5);
		Oid			types[6];
		SPIPlanPtr	plan;
		DestReceiver *dest;
		SPIExecuteOptions options;

		/*
		 * The parameters of outbox.fetch_sql(): cursor txid, cursor seq,
		 * topics, limit, horizon; of outbox.commit_fetch_sql(): cursor
		 * ticket, cursor seq, topics, horizon, limit, transaction id bound.
		 */
		OutboxSetParam(params, 0, commit ? INT8OID : XID8OID, row, desc, commit ? 4 : 3);
		OutboxSetParam(params, 1, INT8OID, row, desc, 5);
		OutboxSetParam(params, 2, TEXTARRAYOID, row, desc, 6);
		if (commit)
		{
			OutboxSetParam(params, 3, INT8OID, row, desc, 7);
			OutboxSetParam(params, 4, INT4OID, row, desc, 8);
			OutboxSetParam(params, 5, XID8OID, row, desc, 9);
		}
		else
		{
			OutboxSetParam(params, 3, INT4OID, row, desc, 8);
			OutboxSetParam(params, 4, XID8OID, row, desc, 9);
		}
		for (i = 0; i < params->numParams; i++)
			types[i] = params->params[i].ptype;

		/*
		 * A new plan at each call, with the parameters as constants. The
		 * query takes its own snapshot, after the horizon was read.
		 */
		plan = SPI_prepare_cursor(sql, params->numParams, types, CURSOR_OPT_CUSTOM_PLAN);
		if (plan == NULL)
			elog(ERROR, "pg_outbox: preparing the batch query failed: %s",
				 SPI_result_code_string(SPI_result));

		dest = CreateDestReceiver(DestTuplestore);
		SetTuplestoreDestReceiverParams(dest, store, FetchContext, false, rsinfo->setDesc,
										gettext_noop("batch query's columns do not match outbox_fetch()'s result"));
		memset(&options, 0, sizeof(options));
		options.params = params;
		options.read_only = false;
		options.dest = dest;
		if (SPI_execute_plan_extended(plan, &options) != SPI_OK_SELECT)
			elog(ERROR, "pg_outbox: the batch query failed");
		dest->rDestroy(dest);
	}

	SPI_finish();
	return (Datum) 0;
}
