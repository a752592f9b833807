/*-------------------------------------------------------------------------
 *
 * position.c
 *	  Parsing and formatting feed positions (see position.h).
 *
 * A position is checked by its syntax first, "^[0-9]{1,20}-[0-9]{1,19}$",
 * then by the range of each part, so that the same text is refused with
 * the same message wherever it comes from: an argument of outbox_fetch(),
 * outbox_advance(), outbox_rewind(), or a relay's stream entry id.
 *
 * Layering: calls no other part of pg_outbox.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/transam.h"
#include "fmgr.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/xid8.h"

#include "position.h"

PG_FUNCTION_INFO_V1(outbox_parse_position);
PG_FUNCTION_INFO_V1(outbox_parse_commit_position);
PG_FUNCTION_INFO_V1(outbox_unshift_position);

/*
 * Splits "pos" if its syntax is that of a position: the digits of each
 * part, and where they end. No range check.
 */
static bool
OutboxPositionSyntax(const char *pos, int *order_len, const char **seq_start, int *seq_len)
{
	const char *p = pos;
	int			n = 0;

	while (*p >= '0' && *p <= '9')
		p++, n++;
	if (n < 1 || n > 20 || *p != '-')
		return false;
	*order_len = n;
	*seq_start = ++p;
	n = 0;
	while (*p >= '0' && *p <= '9')
		p++, n++;
	if (n < 1 || n > 19 || *p != '\0')
		return false;
	*seq_len = n;
	return true;
}

/* The value of n decimal digits, or false when it is above "max". */
static bool
OutboxDigits(const char *s, int n, uint64 max, uint64 *value)
{
	uint64		v = 0;
	int			i;

	for (i = 0; i < n; i++)
	{
		uint64		d = (uint64) (s[i] - '0');

		if (v > (max - d) / 10)
			return false;
		v = v * 10 + d;
	}
	*value = v;
	return true;
}

void
OutboxParsePosition(const char *pos, bool commit, uint64 *order, int64 *seq)
{
	int			order_len;
	int			seq_len;
	const char *seq_start;
	uint64		s;

	if (pos == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("position must not be null")));
	if (!OutboxPositionSyntax(pos, &order_len, &seq_start, &seq_len))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid feed position \"%s\"", pos),
				 errhint("A position is written \"<transaction id>-<sequence>\", for example \"1042-3\".")));
	if (!OutboxDigits(pos, order_len, PG_UINT64_MAX, order) ||
		!OutboxDigits(seq_start, seq_len, (uint64) PG_INT64_MAX, &s))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid feed position \"%s\"", pos),
				 errdetail("A part of the position is out of range.")));
	if (commit && *order > (uint64) PG_INT64_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid feed position \"%s\"", pos),
				 errdetail("The commit ticket is out of range.")));
	*seq = (int64) s;
}

const char *
OutboxUnshiftPosition(const char *pos, uint64 epoch)
{
	int			order_len;
	int			seq_len;
	const char *seq_start;
	uint128		order = 0;
	int			i;

	if (epoch == 0 || pos == NULL || !OutboxPositionSyntax(pos, &order_len, &seq_start, &seq_len))
		return pos;
	/* Up to 20 digits: above 2^64 - 1 at times, never above 2^67. */
	for (i = 0; i < order_len; i++)
		order = order * 10 + (uint128) (pos[i] - '0');
	if (order < (uint128) epoch)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("position %s is from before the group was re-anchored", pos),
				 errdetail("The group's positions start at " UINT64_FORMAT " since outbox_reanchor().", epoch)));
	order -= epoch;
	/* In decimal; above 2^64 - 1 it is left for the parser to refuse. */
	{
		char		digits[24];
		int			n = sizeof(digits);

		digits[--n] = '\0';
		do
		{
			digits[--n] = (char) ('0' + (int) (order % 10));
			order /= 10;
		} while (order > 0);
		return psprintf("%s%s", digits + n, seq_start - 1);
	}
}

void
OutboxFormatPosition(char *buf, uint64 order, uint64 epoch, int64 seq)
{
	if (order > PG_UINT64_MAX - epoch)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("position of event beyond the range of stream ids"),
				 errdetail("Transaction id or ticket " UINT64_FORMAT " plus the group's epoch " UINT64_FORMAT " is above 2^64 - 1.",
						   order, epoch)));
	snprintf(buf, OUTBOX_POSITION_LEN, UINT64_FORMAT "-" INT64_FORMAT, order + epoch, seq);
}

uint64
OutboxFullXid(TransactionId xid)
{
	FullTransactionId next = ReadNextFullTransactionId();

	/* xid is at most 2^31 behind the next id (see xid8funcs.c). */
	return U64FromFullTransactionId(next) + (int64) (int32) (xid - XidFromFullTransactionId(next));
}

/* The text argument as a C string, or NULL. */
static char *
OutboxPositionArg(FunctionCallInfo fcinfo, int n)
{
	return PG_ARGISNULL(n) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(n));
}

/* A row of the function's result type from two values. */
static Datum
OutboxPositionRow(FunctionCallInfo fcinfo, Datum first, Datum second)
{
	TupleDesc	desc;
	Datum		values[2];
	bool		nulls[2] = {false, false};

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	values[0] = first;
	values[1] = second;
	return HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls));
}

/* outbox.parse_position(pos, OUT txid xid8, OUT seq bigint) */
Datum
outbox_parse_position(PG_FUNCTION_ARGS)
{
	uint64		order;
	int64		seq;

	OutboxParsePosition(OutboxPositionArg(fcinfo, 0), false, &order, &seq);
	PG_RETURN_DATUM(OutboxPositionRow(fcinfo, FullTransactionIdGetDatum(FullTransactionIdFromU64(order)),
									  Int64GetDatum(seq)));
}

/* outbox.parse_commit_position(pos, OUT ticket bigint, OUT seq bigint) */
Datum
outbox_parse_commit_position(PG_FUNCTION_ARGS)
{
	uint64		order;
	int64		seq;

	OutboxParsePosition(OutboxPositionArg(fcinfo, 0), true, &order, &seq);
	PG_RETURN_DATUM(OutboxPositionRow(fcinfo, Int64GetDatum((int64) order), Int64GetDatum(seq)));
}

/* outbox.unshift_position(pos, epoch), strict */
Datum
outbox_unshift_position(PG_FUNCTION_ARGS)
{
	const char *pos = OutboxPositionArg(fcinfo, 0);
	const char *out;

	if (PG_GETARG_INT64(1) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("epoch must not be negative")));
	out = OutboxUnshiftPosition(pos, (uint64) PG_GETARG_INT64(1));
	PG_RETURN_TEXT_P(cstring_to_text(out));
}
