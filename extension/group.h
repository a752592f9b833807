/*-------------------------------------------------------------------------
 *
 * group.h
 *	  Groups (group.c): the name grammar, the row read and its errors, the
 *	  leadership and the checks a leader's call passes.
 *
 * Includes no other header of pg_outbox.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_GROUP_H
#define OUTBOX_GROUP_H

#include "access/htup.h"
#include "utils/timestamp.h"

/* The columns of outbox.groups that the C code reads. */
typedef enum GroupColumn
{
	GROUP_ID,
	GROUP_NAME,
	GROUP_TOPICS,
	GROUP_ORDERING,
	GROUP_CURSOR_TXID,
	GROUP_CURSOR_TICKET,
	GROUP_CURSOR_SEQ,
	GROUP_EPOCH,
	GROUP_CURSOR,
	GROUP_GENERATION,
	GROUP_LEADER_PID,
	GROUP_LEADER_STARTED,
	GROUP_LEASE_RENEWED,
	GROUP_LEASE_UNTIL,
	GROUP_SHARD,
	GROUP_SHARDS,
	GROUP_NCOLUMNS
} GroupColumn;

/* A group's row: its columns, and the whole row (outbox.groups's type). */
typedef struct GroupRow
{
	Datum		values[GROUP_NCOLUMNS];
	bool		nulls[GROUP_NCOLUMNS];
	HeapTupleHeader row;
} GroupRow;

/*
 * Splits a group name, "<group>" or "<group>/<shard>", into the group's
 * name (returned) and the shard, -1 when none is named; 22023 for a shard
 * that is no number. The one parser of the grammar.
 */
extern text *OutboxParseGroupName(text *name, int32 *shard);

/*
 * Reads the row of the group or shard "name" names, locking it (FOR NO KEY
 * UPDATE) when asked: 42704 when there is none, 22023 for a sharded group
 * named without its shard. False when the SQL objects are those of 0.1.0
 * (the table has no lease): nothing was read.
 */
extern bool OutboxGetGroup(text *name, bool for_update, GroupRow *row);

/* True when this session leads the group, by its row. */
extern bool OutboxLeads(const GroupRow *g);

/*
 * True when this session leads the group by its row and its lease is not
 * due for renewal yet (a third of pg_outbox.lease after the last one).
 */
extern bool OutboxLeadsFreshly(const GroupRow *g);

/*
 * The lease of a leader that renews it now, as the values of the row's
 * lease_renewed and lease_until (timestamptz): the one place a lease
 * starts, whether by taking the lead, renewing it, or advancing.
 */
extern void OutboxLeaseFromNow(Datum *renewed, Datum *until);

/* True when the leader named by pid and start time holds a lease that has not run out. */
extern bool OutboxLeaderLive(int32 pid, TimestampTz started, TimestampTz lease_until);

/*
 * Takes or keeps the leadership of the group for this session (renewing
 * its lease); true when it leads. A session whose leadership passed to
 * another is refused once (OB003).
 */
extern bool OutboxLead(int32 group_id);

/*
 * Refuses (OB003) the call of a session that does not lead the group:
 * once with the leadership lost when it had led it, else with "hint".
 * "name" is the group's name as the caller gave it.
 */
extern void OutboxCheckLeader(const GroupRow *g, const char *name, const char *hint);

/*
 * Refuses (OB002), once, the call of a leader whose group's cursor was
 * moved meanwhile (the generation differs from the one it noted). "name"
 * is the group's name as the error names it.
 */
extern void OutboxCheckGeneration(const GroupRow *g, const char *name);

#endif							/* OUTBOX_GROUP_H */
