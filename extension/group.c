/*-------------------------------------------------------------------------
 *
 * group.c
 *	  Groups: the name grammar, the row read and its errors, the leadership
 *	  and the checks that a leader's fetch and advance pass.
 *
 * A group is a row of outbox.groups, or one row per shard of a sharded
 * group. It is named "<group>" or "<group>/<shard>" wherever a name is
 * taken, a group of one shard also as "<group>/0". This file is the one
 * home of the concept, as position.c is of positions:
 *
 * - the grammar: OutboxParseGroupName() is the one parser of the shard
 *   suffix, "/" and a number from 0 to 999 without leading zeros (the
 *   table allows up to 256 shards; a larger number names a shard that does
 *   not exist, not a malformed name). outbox.split_group_name() is its SQL
 *   face, which the SQL functions call; the relay's parser is checked
 *   against it with the vectors of test/vectors/group_names.txt.
 * - the row read and its errors (42704 for a group or shard that does
 *   not exist, 22023 for a sharded group named without its shard):
 *   OutboxGetGroup(), and outbox.get_group() for SQL.
 * - the leadership: outbox.lead() takes, keeps or refuses a group for this
 *   session (see lead.c for what a leader is); the rule that a leader's
 *   lease is live (OutboxLeaderLive(), outbox.leader_live() for SQL); the
 *   checks that a leader's call passes, that it still leads (OB003) and
 *   that its cursor was not moved under it (OB002), shared by fetch.c and
 *   advance.c.
 *
 * The leadership writes the group's row with plain SQL statements through
 * SPI, prepared once per session; reads go by the name's index.
 *
 * Layering: calls lead.c and tables.c; fetch.c, fetch_010.c and advance.c
 * call into it.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "group.h"
#include "lead.h"
#include "sqlstates.h"
#include "tables.h"

PG_FUNCTION_INFO_V1(outbox_split_group_name);
PG_FUNCTION_INFO_V1(outbox_group_of);
PG_FUNCTION_INFO_V1(outbox_get_group);
PG_FUNCTION_INFO_V1(outbox_lead_group);
PG_FUNCTION_INFO_V1(outbox_leader_live);

static const char *const GroupColumnNames[GROUP_NCOLUMNS] = {
	"id", "name", "topics", "ordering", "cursor_txid", "cursor_ticket", "cursor_seq",
	"epoch", "cursor", "generation", "leader_pid", "leader_started", "lease_renewed",
	"lease_until", "shard", "shards"
};

/* Longest shard number, in digits. */
#define OUTBOX_SHARD_DIGITS		3

/* The statements of the leadership, prepared once per session. */
static SPIPlanPtr LockPlan = NULL;
static SPIPlanPtr LeaderPlan = NULL;
static SPIPlanPtr RenewPlan = NULL;
static SPIPlanPtr TakeOverPlan = NULL;

text *
OutboxParseGroupName(text *name, int32 *shard)
{
	const char *s = VARDATA_ANY(name);
	int			len = VARSIZE_ANY_EXHDR(name);
	const char *slash = memchr(s, '/', len);
	int			digits;
	int			i;

	*shard = -1;
	if (slash == NULL)
		return name;
	digits = len - (slash - s) - 1;
	if (digits < 1 || digits > OUTBOX_SHARD_DIGITS || (digits > 1 && slash[1] == '0'))
		digits = 0;
	for (i = 0; i < digits; i++)
		if (slash[1 + i] < '0' || slash[1 + i] > '9')
			digits = 0;
	if (digits == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid shard name \"%s\"", text_to_cstring(name)),
				 errdetail("A shard is named by its group's name, \"/\" and its number, from 0: \"orders/0\".")));
	*shard = 0;
	for (i = 0; i < digits; i++)
		*shard = *shard * 10 + (slash[1 + i] - '0');
	return cstring_to_text_with_len(s, slash - s);
}

/*
 * outbox.group_of(group_name): the group a shard name names, whether or not
 * its shard is a number; NULL for a name without a shard. For the calls
 * that take a whole group only, to name it in their refusal of a shard.
 */
Datum
outbox_group_of(PG_FUNCTION_ARGS)
{
	text	   *name = PG_GETARG_TEXT_PP(0);
	const char *s = VARDATA_ANY(name);
	const char *slash = memchr(s, '/', VARSIZE_ANY_EXHDR(name));

	if (slash == NULL)
		PG_RETURN_NULL();
	PG_RETURN_TEXT_P(cstring_to_text_with_len(s, slash - s));
}

/* The group name argument: 22004 when null. */
static text *
OutboxGroupNameArg(FunctionCallInfo fcinfo, int n)
{
	if (PG_ARGISNULL(n))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("group name must not be null")));
	return PG_GETARG_TEXT_PP(n);
}

/*
 * outbox.split_group_name(group_name, OUT name text, OUT shard integer):
 * the name and the shard, NULL when none is named.
 */
Datum
outbox_split_group_name(PG_FUNCTION_ARGS)
{
	int32		shard;
	text	   *group = OutboxParseGroupName(OutboxGroupNameArg(fcinfo, 0), &shard);
	TupleDesc	desc;
	Datum		values[2];
	bool		nulls[2] = {false, shard < 0};

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	values[0] = PointerGetDatum(group);
	values[1] = Int32GetDatum(Max(shard, 0));
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}

/*
 * The attribute numbers of the columns the C code reads, in the table's
 * descriptor (the order of columns differs between a fresh install and an
 * updated one). False when the table has no lease columns: SQL objects of
 * 0.1.0.
 */
static bool
OutboxGroupColumns(TupleDesc desc, AttrNumber *attnos)
{
	int			c;
	int			i;

	for (c = 0; c < GROUP_NCOLUMNS; c++)
	{
		attnos[c] = InvalidAttrNumber;
		for (i = 0; i < desc->natts; i++)
		{
			Form_pg_attribute att = TupleDescAttr(desc, i);

			if (!att->attisdropped && strcmp(NameStr(att->attname), GroupColumnNames[c]) == 0)
			{
				attnos[c] = att->attnum;
				break;
			}
		}
		if (attnos[c] == InvalidAttrNumber)
			return false;
	}
	return true;
}

/* Prepares a statement of the leadership once per session. */
static SPIPlanPtr
OutboxPrepare(SPIPlanPtr *plan, const char *sql, int nargs, Oid *argtypes)
{
	if (*plan == NULL)
	{
		SPIPlanPtr	p = SPI_prepare(sql, nargs, argtypes);

		if (p == NULL || SPI_keepplan(p) != 0)
			elog(ERROR, "pg_outbox: preparing \"%s\" failed: %s", sql, SPI_result_code_string(SPI_result));
		*plan = p;
	}
	return *plan;
}

/*
 * Locks the row of the group "group", shard "shard" (FOR NO KEY UPDATE,
 * as UPDATE would); false when there is none.
 */
static bool
OutboxLockGroupRow(text *group, int32 shard)
{
	Oid			argtypes[2] = {TEXTOID, INT4OID};
	Datum		args[2] = {PointerGetDatum(group), Int32GetDatum(shard)};
	bool		found;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	OutboxPrepare(&LockPlan,
				  "SELECT 1 FROM outbox.groups"
				  " WHERE name OPERATOR(pg_catalog.=) $1 AND shard OPERATOR(pg_catalog.=) $2"
				  " FOR NO KEY UPDATE", 2, argtypes);
	if (SPI_execute_plan(LockPlan, args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "pg_outbox: locking the row of group \"%s\" failed", text_to_cstring(group));
	found = SPI_processed == 1;
	SPI_finish();
	return found;
}

/*
 * Reads the row of the group "group", shard "shard", by the name's index,
 * with a new snapshot (each read sees what committed, and this
 * transaction's own changes, before it). False when there is none; also
 * false, with *current set to false, when the SQL objects are those of
 * 0.1.0. The values are copied into the current memory context.
 */
static bool
OutboxReadGroupRow(text *group, int32 shard, GroupRow *row, bool *current)
{
	Relation	groups = table_open(OutboxRelid("groups"), AccessShareLock);
	Relation	index = index_open(OutboxRelid("groups_name_key"), AccessShareLock);
	AttrNumber	attnos[GROUP_NCOLUMNS];
	TupleTableSlot *slot;
	IndexScanDesc scan;
	ScanKeyData keys[2];
	Snapshot	snapshot;
	bool		found = false;
	int			c;

	*current = OutboxGroupColumns(RelationGetDescr(groups), attnos);
	if (*current)
	{
		snapshot = RegisterSnapshot(GetTransactionSnapshot());
		slot = table_slot_create(groups, NULL);
		ScanKeyEntryInitialize(&keys[0], 0, 1, BTEqualStrategyNumber, InvalidOid,
							   index->rd_indcollation[0], F_TEXTEQ, PointerGetDatum(group));
		ScanKeyInit(&keys[1], 2, BTEqualStrategyNumber, F_INT4EQ, Int32GetDatum(shard));
		scan = index_beginscan(groups, index, snapshot, 2, 0);
		index_rescan(scan, keys, 2, NULL, 0);
		if (index_getnext_slot(scan, ForwardScanDirection, slot))
		{
			bool		should_free;
			HeapTuple	tuple = ExecFetchSlotHeapTuple(slot, false, &should_free);

			found = true;
			row->row = DatumGetHeapTupleHeader(heap_copy_tuple_as_datum(tuple, RelationGetDescr(groups)));
			if (should_free)
				heap_freetuple(tuple);
			slot_getallattrs(slot);
			for (c = 0; c < GROUP_NCOLUMNS; c++)
			{
				Form_pg_attribute att = TupleDescAttr(RelationGetDescr(groups), attnos[c] - 1);

				row->nulls[c] = slot->tts_isnull[attnos[c] - 1];
				row->values[c] = row->nulls[c] ? (Datum) 0 :
					datumCopy(slot->tts_values[attnos[c] - 1], att->attbyval, att->attlen);
			}
		}
		index_endscan(scan);
		ExecDropSingleTupleTableSlot(slot);
		UnregisterSnapshot(snapshot);
	}
	index_close(index, AccessShareLock);
	table_close(groups, AccessShareLock);
	return found;
}

bool
OutboxGetGroup(text *name, bool for_update, GroupRow *row)
{
	int32		shard;
	text	   *group = OutboxParseGroupName(name, &shard);
	char	   *g;
	int32		shards;
	bool		current = true;
	bool		found;

	/* The lock first, then a snapshot that sees the version locked. */
	found = (!for_update || OutboxLockGroupRow(group, Max(shard, 0))) &&
		OutboxReadGroupRow(group, Max(shard, 0), row, &current);
	if (for_update && !found)
		(void) OutboxReadGroupRow(group, Max(shard, 0), row, &current);
	if (!found)
	{
		if (!current)
			return false;
		g = text_to_cstring(group);
		if (shard > 0 && OutboxReadGroupRow(group, 0, row, &current))
		{
			shards = DatumGetInt32(row->values[GROUP_SHARDS]);
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("group \"%s\" has no shard %d", g, shard),
					 shards > 1 ?
					 errhint("Its shards are %s/0 to %s/%d.", g, g, shards - 1) :
					 errhint("It has one shard: \"%s\", also named \"%s/0\".", g, g)));
		}
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("group \"%s\" does not exist", g),
				 errhint("Create it with outbox_group_create().")));
	}
	shards = DatumGetInt32(row->values[GROUP_SHARDS]);
	if (shard < 0 && shards > 1)
	{
		g = text_to_cstring(group);
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("group \"%s\" has %d shards: name one", g, shards),
				 errhint("Its shards are %s/0 to %s/%d; each has its own cursor and leader.", g, g, shards - 1)));
	}
	return true;
}

/*
 * outbox.get_group(group_name, for_update): the row of a group, or of a
 * shard of one, locked when asked.
 */
Datum
outbox_get_group(PG_FUNCTION_ARGS)
{
	GroupRow	g;

	if (!OutboxGetGroup(OutboxGroupNameArg(fcinfo, 0), !PG_ARGISNULL(1) && PG_GETARG_BOOL(1), &g))
		elog(ERROR, "pg_outbox: outbox.groups has no lease columns");
	PG_RETURN_HEAPTUPLEHEADER(g.row);
}

bool
OutboxLeads(const GroupRow *g)
{
	return !g->nulls[GROUP_LEADER_PID] && !g->nulls[GROUP_LEADER_STARTED] &&
		DatumGetInt32(g->values[GROUP_LEADER_PID]) == MyProcPid &&
		DatumGetTimestampTz(g->values[GROUP_LEADER_STARTED]) == MyStartTimestamp;
}

bool
OutboxLeadsFreshly(const GroupRow *g)
{
	TimestampTz due;

	if (!OutboxLeads(g) || g->nulls[GROUP_LEASE_RENEWED])
		return false;
	/* Renewed at most every third of the lease (outbox.lead()). */
	due = TimestampTzPlusMilliseconds(DatumGetTimestampTz(g->values[GROUP_LEASE_RENEWED]),
									  pg_outbox_lease_ms / 3);
	return GetCurrentTimestamp() < due;
}

/*
 * The rule of a live leader: its lease has not run out, and its session
 * runs. A standby takes the group over from a leader that is not live.
 */
bool
OutboxLeaderLive(int32 pid, TimestampTz started, TimestampTz lease_until)
{
	return lease_until > GetCurrentTimestamp() && OutboxSessionAlive(pid, started);
}

/* outbox.leader_live(pid, started, lease_until) */
Datum
outbox_leader_live(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(OutboxLeaderLive(PG_GETARG_INT32(0), PG_GETARG_TIMESTAMPTZ(1), PG_GETARG_TIMESTAMPTZ(2)));
}

/*
 * Refuses the call of a session whose leadership of the group passed to
 * another session, once: the leadership noted for it is forgotten, and
 * its next call stands by or takes the group back. "group" is the group's
 * name, without a shard.
 */
static void
OutboxRaiseLost(const char *group, int64 generation)
{
	ereport(ERROR,
			(errcode(ERRCODE_OUTBOX_NOT_LEADER),
			 errmsg("this session no longer leads group \"%s\"", group),
			 errdetail("Its lease ran out and another session took the group over (generation " INT64_FORMAT ").",
					   generation),
			 errhint("Stand by: what this session published is harmless, and the new leader publishes from the cursor.")));
}

void
OutboxLeaseFromNow(Datum *renewed, Datum *until)
{
	TimestampTz now = GetCurrentTimestamp();

	*renewed = TimestampTzGetDatum(now);
	*until = TimestampTzGetDatum(TimestampTzPlusMilliseconds(now, pg_outbox_lease_ms));
}

/*
 * Takes or keeps the group's leadership for this session; true when it
 * leads. The leader renews its lease (outbox_fetch() calls this once a
 * third of the lease has passed, so that most fetches write nothing; a
 * relay calls outbox_lead() before a long call, such as maintenance).
 * Another session takes the group over when no session leads it, when the
 * leader's session ended, or when its lease ran out. The takeover compares
 * and sets the leader and the lease in one update, so that of two standbys
 * one wins and a lease renewed meanwhile is not taken; it bumps the
 * generation (fencing). A session that led the group and finds another
 * leading is refused once (OB003).
 */
bool
OutboxLead(int32 group_id)
{
	Oid			read_types[1] = {INT4OID};
	Oid			renew_types[5] = {INT4OID, INT4OID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID};
	Oid			take_types[8] = {INT4OID, INT4OID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID,
	INT4OID, TIMESTAMPTZOID, TIMESTAMPTZOID};
	Datum		args[8];
	char		nulls[8];
	Datum		leader[5];
	bool		leader_nulls[5];
	bool		leads = false;
	bool		isnull;
	int			i;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	OutboxPrepare(&LeaderPlan,
				  "SELECT leader_pid, leader_started, lease_until, name, generation FROM outbox.groups"
				  " WHERE id OPERATOR(pg_catalog.=) $1", 1, read_types);
	OutboxPrepare(&RenewPlan,
				  "UPDATE outbox.groups SET lease_renewed = $4, lease_until = $5"
				  " WHERE id OPERATOR(pg_catalog.=) $1 AND leader_pid OPERATOR(pg_catalog.=) $2"
				  " AND leader_started OPERATOR(pg_catalog.=) $3", 5, renew_types);
	OutboxPrepare(&TakeOverPlan,
				  "UPDATE outbox.groups SET leader_pid = $2, leader_started = $3, lease_renewed = $4, lease_until = $5,"
				  " generation = generation OPERATOR(pg_catalog.+) 1::bigint"
				  " WHERE id OPERATOR(pg_catalog.=) $1 AND leader_pid IS NOT DISTINCT FROM $6"
				  " AND leader_started IS NOT DISTINCT FROM $7 AND lease_until IS NOT DISTINCT FROM $8"
				  " RETURNING generation", 8, take_types);

	args[0] = Int32GetDatum(group_id);
	args[1] = Int32GetDatum(MyProcPid);
	args[2] = TimestampTzGetDatum(MyStartTimestamp);
	memset(nulls, ' ', sizeof(nulls));

	if (SPI_execute_plan(LeaderPlan, args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "pg_outbox: reading the leader of group %d failed", group_id);
	if (SPI_processed == 0)
	{
		SPI_finish();
		return false;
	}
	for (i = 0; i < 5; i++)
		leader[i] = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, i + 1, &leader_nulls[i]);

	/* The leader renews its lease, while the row says it leads. */
	if (!leader_nulls[0] && !leader_nulls[1] && DatumGetInt32(leader[0]) == MyProcPid &&
		DatumGetTimestampTz(leader[1]) == MyStartTimestamp)
	{
		OutboxLeaseFromNow(&args[3], &args[4]);
		if (SPI_execute_plan(RenewPlan, args, NULL, false, 0) != SPI_OK_UPDATE)
			elog(ERROR, "pg_outbox: renewing the lease of group %d failed", group_id);
		if (SPI_processed == 1)
		{
			/* What it wrote is seen by the next read of the row. */
			CommandCounterIncrement();
			SPI_finish();
			return true;
		}
		if (SPI_execute_plan(LeaderPlan, args, NULL, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
			elog(ERROR, "pg_outbox: group %d went away while this session led it", group_id);
		for (i = 0; i < 5; i++)
			leader[i] = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, i + 1, &leader_nulls[i]);
	}
	if (OutboxForgetLeadership(group_id))
		OutboxRaiseLost(TextDatumGetCString(leader[3]), DatumGetInt64(leader[4]));
	if (!leader_nulls[0] && !leader_nulls[1] && !leader_nulls[2] &&
		OutboxLeaderLive(DatumGetInt32(leader[0]), DatumGetTimestampTz(leader[1]), DatumGetTimestampTz(leader[2])))
	{
		SPI_finish();
		return false;
	}

	/* The takeover: only from the leader and lease read. */
	OutboxLeaseFromNow(&args[3], &args[4]);
	for (i = 0; i < 3; i++)
	{
		args[5 + i] = leader[i];
		nulls[5 + i] = leader_nulls[i] ? 'n' : ' ';
	}
	if (SPI_execute_plan(TakeOverPlan, args, nulls, false, 0) != SPI_OK_UPDATE_RETURNING)
		elog(ERROR, "pg_outbox: taking the lead of group %d failed", group_id);
	if (SPI_processed == 1)
	{
		int64		generation = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));

		(void) OutboxNoteGeneration(group_id, generation);
		leads = true;
		CommandCounterIncrement();
	}
	SPI_finish();
	return leads;
}

/* outbox.lead(group_id) */
Datum
outbox_lead_group(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(OutboxLead(PG_GETARG_INT32(0)));
}

void
OutboxCheckLeader(const GroupRow *g, const char *name, const char *hint)
{
	if (OutboxLeads(g))
		return;
	if (OutboxForgetLeadership(DatumGetInt32(g->values[GROUP_ID])))
		OutboxRaiseLost(TextDatumGetCString(g->values[GROUP_NAME]), DatumGetInt64(g->values[GROUP_GENERATION]));
	ereport(ERROR,
			(errcode(ERRCODE_OUTBOX_NOT_LEADER),
			 errmsg("this session does not lead group \"%s\"", name),
			 errhint("%s", hint)));
}

void
OutboxCheckGeneration(const GroupRow *g, const char *name)
{
	int64		generation = DatumGetInt64(g->values[GROUP_GENERATION]);

	if (OutboxNoteGeneration(DatumGetInt32(g->values[GROUP_ID]), generation) != generation)
		ereport(ERROR,
				(errcode(ERRCODE_OUTBOX_REWOUND),
				 errmsg("cursor of group \"%s\" was moved by outbox_rewind() while this session led it", name),
				 errdetail("The cursor is at %s now.", TextDatumGetCString(g->values[GROUP_CURSOR])),
				 errhint("Fetch again without \"after\": the next batch starts at the moved cursor.")));
}
