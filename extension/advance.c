/*-------------------------------------------------------------------------
 *
 * advance.c
 *	  outbox_advance(): the leader moves its group's cursor forward to the
 *	  last position it published.
 *
 * The other half of a leader's cycle, beside fetch.c: the two share the
 * group's row read (group.c) and the checks a leader's call passes, that
 * this session still leads the group (OB003) and that its cursor was not
 * moved under it since it last looked (OB002). Then:
 *
 * - the position, in the group's order, taken off its epoch
 *   (position.c): one behind the cursor is refused (outbox_rewind() moves
 *   a cursor backwards), as is one beyond the horizon (a transaction still
 *   running, or a commit ticket not final yet, would be skipped);
 * - "streams", the last position the relay published to each stream,
 *   merged into the group's record of them (outbox.recorded_streams(), in
 *   SQL: the record is bounded by pg_outbox.max_group_streams);
 * - the update of the row, which renews the leader's lease.
 *
 * The row is locked first (FOR NO KEY UPDATE): its leader is the leader
 * until this transaction ends. An advance to the cursor without streams
 * writes nothing.
 *
 * This was a PL/pgSQL function, which repeated the leader and generation
 * checks of the C fetch; its SQLSTATEs, messages and privileges are
 * unchanged.
 *
 * Layering: calls group.c, position.c and commit.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/transam.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/xid8.h"

#include "commit.h"
#include "group.h"
#include "position.h"

PG_FUNCTION_INFO_V1(outbox_advance);

/* The update of the group's row, prepared once per session. */
static SPIPlanPtr AdvancePlan = NULL;

/* True when "s" (len bytes) is a stream entry id: 1 to 20 digits, "-", 1 to 19 digits. */
static bool
OutboxIsStreamPosition(const char *s, int len)
{
	int			i = 0;
	int			start;

	while (i < len && s[i] >= '0' && s[i] <= '9')
		i++;
	if (i < 1 || i > 20 || i >= len || s[i] != '-')
		return false;
	start = ++i;
	while (i < len && s[i] >= '0' && s[i] <= '9')
		i++;
	return i == len && i - start >= 1 && i - start <= 19;
}

/*
 * Refuses "streams" unless it is a JSON object of stream names and
 * positions; names the first wrong entry, in the object's order.
 */
static void
OutboxCheckStreams(Jsonb *streams)
{
	JsonbIterator *it;
	JsonbValue	v;
	JsonbValue	key = {0};
	JsonbIteratorToken token;

	if (!JB_ROOT_IS_OBJECT(streams) || JB_ROOT_IS_SCALAR(streams))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("streams must be a JSON object of stream names and positions")));
	it = JsonbIteratorInit(&streams->root);
	while ((token = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (token == WJB_KEY)
			key = v;
		else if (token == WJB_VALUE &&
				 (v.type != jbvString || !OutboxIsStreamPosition(v.val.string.val, v.val.string.len)))
		{
			Jsonb	   *value = JsonbValueToJsonb(&v);

			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid position %s for stream \"%s\" in streams",
							JsonbToCString(NULL, &value->root, VARSIZE(value)),
							pnstrdup(key.val.string.val, key.val.string.len)),
					 errhint("streams maps each stream name to the last position published there, as a string such as \"1042-3\".")));
		}
	}
}

/* "<order + epoch>-<seq>", the group's new cursor as its positions are written. */
static char *
OutboxShiftedPosition(uint64 order, uint64 epoch, int64 seq)
{
	uint128		n = (uint128) order + epoch;
	char		digits[48];
	int			i = sizeof(digits);

	digits[--i] = '\0';
	do
	{
		digits[--i] = (char) ('0' + (int) (n % 10));
		n /= 10;
	} while (n > 0);
	return psprintf("%s-" INT64_FORMAT, digits + i, seq);
}

/*
 * outbox_advance(group_name, pos, streams): moves the group's cursor
 * forward to "pos" (leader only), recording the last position per stream.
 */
Datum
outbox_advance(PG_FUNCTION_ARGS)
{
	text	   *name;
	const char *pos = PG_ARGISNULL(1) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(1));
	Jsonb	   *streams = PG_ARGISNULL(2) ? NULL : PG_GETARG_JSONB_P(2);
	GroupRow	g;
	const char *lpos;
	uint64		epoch;
	uint64		order;
	int64		seq;
	bool		commit;
	int64		cursor_seq;
	bool		behind;
	Oid			argtypes[8] = {INT4OID, XID8OID, INT8OID, INT8OID, TIMESTAMPTZOID, TIMESTAMPTZOID, JSONBOID, TEXTOID};
	Datum		args[8];
	char		nulls[8];

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("group name must not be null")));
	name = PG_GETARG_TEXT_PP(0);
	if (!OutboxGetGroup(name, true, &g))
		elog(ERROR, "pg_outbox: outbox.groups has no lease columns");
	epoch = (uint64) DatumGetInt64(g.values[GROUP_EPOCH]);
	lpos = OutboxUnshiftPosition(pos, epoch);
	OutboxParsePosition(lpos, false, &order, &seq);

	/* The row is locked: its leader is the leader until this transaction ends. */
	OutboxCheckLeader(&g, text_to_cstring(name),
					  "Only the session that fetched the batch with outbox_fetch() may advance the cursor.");
	OutboxCheckGeneration(&g, TextDatumGetCString(g.values[GROUP_NAME]));
	if (streams != NULL)
		OutboxCheckStreams(streams);

	/* The position in the group's order: (ticket, seq) or (txid, seq). */
	commit = strcmp(TextDatumGetCString(g.values[GROUP_ORDERING]), "commit") == 0;
	cursor_seq = DatumGetInt64(g.values[GROUP_CURSOR_SEQ]);
	if (commit)
	{
		int64		cursor_ticket = DatumGetInt64(g.values[GROUP_CURSOR_TICKET]);

		OutboxParsePosition(lpos, true, &order, &seq);
		behind = (int64) order < cursor_ticket || ((int64) order == cursor_ticket && seq < cursor_seq);
	}
	else
	{
		uint64		cursor_txid = U64FromFullTransactionId(DatumGetFullTransactionId(g.values[GROUP_CURSOR_TXID]));

		behind = order < cursor_txid || (order == cursor_txid && seq < cursor_seq);
	}
	if (behind)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("position %s is behind the cursor of group \"%s\"", pos, text_to_cstring(name)),
				 errdetail("The cursor is at %s.", TextDatumGetCString(g.values[GROUP_CURSOR])),
				 errhint("Use outbox_rewind() to move a cursor backwards.")));
	if (commit)
	{
		int64		horizon = OutboxCommitHorizon();

		if ((int64) order > horizon)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("position %s is beyond the commit horizon", pos),
					 errdetail("Commit tickets after " INT64_FORMAT " may still be committing.", horizon)));
	}
	else
	{
		uint64		horizon = OutboxFullXid(GetTransactionSnapshot()->xmin);

		if (order >= horizon)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("position %s is beyond the feed horizon", pos),
					 errdetail("Transactions from " UINT64_FORMAT " on may still be running.", horizon)));
	}
	if (streams == NULL && seq == cursor_seq &&
		(commit ? (int64) order == DatumGetInt64(g.values[GROUP_CURSOR_TICKET]) :
		 order == U64FromFullTransactionId(DatumGetFullTransactionId(g.values[GROUP_CURSOR_TXID]))))
		PG_RETURN_VOID();

	args[0] = g.values[GROUP_ID];
	args[1] = FullTransactionIdGetDatum(FullTransactionIdFromU64(order));
	args[2] = Int64GetDatum((int64) order);
	args[3] = Int64GetDatum(seq);
	OutboxLeaseFromNow(&args[4], &args[5]);
	args[6] = PointerGetDatum(streams);
	args[7] = CStringGetTextDatum(OutboxShiftedPosition(order, epoch, seq));
	memset(nulls, ' ', sizeof(nulls));
	nulls[commit ? 1 : 2] = 'n';
	nulls[6] = streams == NULL ? 'n' : ' ';

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (AdvancePlan == NULL)
	{
		SPIPlanPtr	plan = SPI_prepare("UPDATE outbox.groups g"
									   " SET cursor_txid = $2, cursor_ticket = $3, cursor_seq = $4,"
									   " advanced_at = pg_catalog.now(), lease_renewed = $5, lease_until = $6,"
									   " streams = outbox.recorded_streams(g, $7, $8)"
									   " WHERE id OPERATOR(pg_catalog.=) $1", 8, argtypes);

		if (plan == NULL || SPI_keepplan(plan) != 0)
			elog(ERROR, "pg_outbox: preparing the update of outbox_advance() failed: %s",
				 SPI_result_code_string(SPI_result));
		AdvancePlan = plan;
	}
	if (SPI_execute_plan(AdvancePlan, args, nulls, false, 0) != SPI_OK_UPDATE || SPI_processed != 1)
		elog(ERROR, "pg_outbox: the update of group \"%s\" failed", text_to_cstring(name));
	SPI_finish();
	PG_RETURN_VOID();
}
