/*-------------------------------------------------------------------------
 *
 * lead.c
 *	  Group leadership: which session may publish a group's feed.
 *
 * A relay leads a group by holding a session-level advisory lock keyed by
 * the group's id. A session lock is held without a transaction, so the
 * leader keeps no transaction id open across its round trips to the broker
 * (an open transaction id would hold back every group's horizon), and the
 * lock goes away with the leader's connection, so a standby takes over as
 * soon as the leader dies.
 *
 * The lock's classid is a constant of pg_outbox and its objsubid is 3, a
 * value the SQL advisory lock functions never use, so these locks cannot
 * collide with an application's own advisory locks. In pg_locks they show
 * as locktype 'advisory', classid outbox.lock_class(), objid the group id.
 *
 * A leader also notes the generation of each group it leads: every
 * outbox_rewind() bumps it. A leader reads ahead of its cursor (the "after"
 * position of outbox_fetch) and advances to positions it published, so a
 * cursor moved under it would be overwritten by its next advance, or its
 * next advance refused. When the generation it noted differs from the
 * group's, its fetch or advance is refused once (SQLSTATE OB002) and it
 * starts again from the cursor where the rewind put it.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "storage/lock.h"
#include "utils/hsearch.h"

#include "pg_outbox.h"

/* "obox" */
#define OUTBOX_LOCK_CLASS	0x6F626F78
#define OUTBOX_LOCK_SUBID	3

PG_FUNCTION_INFO_V1(outbox_lead);
PG_FUNCTION_INFO_V1(outbox_is_leader);
PG_FUNCTION_INFO_V1(outbox_resign);
PG_FUNCTION_INFO_V1(outbox_lock_class);
PG_FUNCTION_INFO_V1(outbox_note_generation);

/* The generation this session noted for a group it leads. */
typedef struct OutboxNotedGeneration
{
	int32		group_id;		/* hash key */
	int64		generation;
} OutboxNotedGeneration;

static HTAB *NotedGenerations = NULL;

/* Forgets the generation noted for a group (leadership taken or given up). */
static void
OutboxForgetGeneration(int32 group_id)
{
	if (NotedGenerations != NULL)
		(void) hash_search(NotedGenerations, &group_id, HASH_REMOVE, NULL);
}

/* Fills the lock tag of a group's leadership. */
static void
OutboxLeaderTag(LOCKTAG *tag, int32 group_id)
{
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, OUTBOX_LOCK_CLASS,
						 (uint32) group_id, OUTBOX_LOCK_SUBID);
}

/* Takes the group's leadership for this session if free; true when held. */
Datum
outbox_lead(PG_FUNCTION_ARGS)
{
	LOCKTAG		tag;

	OutboxLeaderTag(&tag, PG_GETARG_INT32(0));
	if (LockHeldByMe(&tag, ExclusiveLock))
		PG_RETURN_BOOL(true);
	if (LockAcquire(&tag, ExclusiveLock, true, true) == LOCKACQUIRE_NOT_AVAIL)
		PG_RETURN_BOOL(false);
	OutboxForgetGeneration(PG_GETARG_INT32(0));
	PG_RETURN_BOOL(true);
}

/* True when this session leads the group. */
Datum
outbox_is_leader(PG_FUNCTION_ARGS)
{
	LOCKTAG		tag;

	OutboxLeaderTag(&tag, PG_GETARG_INT32(0));
	PG_RETURN_BOOL(LockHeldByMe(&tag, ExclusiveLock));
}

/* Gives up the group's leadership; true when this session held it. */
Datum
outbox_resign(PG_FUNCTION_ARGS)
{
	LOCKTAG		tag;
	bool		held = false;

	OutboxLeaderTag(&tag, PG_GETARG_INT32(0));
	while (LockHeldByMe(&tag, ExclusiveLock))
	{
		LockRelease(&tag, ExclusiveLock, true);
		held = true;
	}
	OutboxForgetGeneration(PG_GETARG_INT32(0));
	PG_RETURN_BOOL(held);
}

/* The classid of leadership locks, for finding them in pg_locks. */
Datum
outbox_lock_class(PG_FUNCTION_ARGS)
{
	PG_RETURN_OID((Oid) OUTBOX_LOCK_CLASS);
}

/*
 * outbox.note_generation(group_id, generation): notes the group's
 * generation for this session and returns the one noted before (the given
 * one the first time after taking the leadership).
 */
Datum
outbox_note_generation(PG_FUNCTION_ARGS)
{
	int32		group_id = PG_GETARG_INT32(0);
	int64		generation = PG_GETARG_INT64(1);
	OutboxNotedGeneration *entry;
	bool		found;
	int64		before;

	if (NotedGenerations == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(int32);
		ctl.entrysize = sizeof(OutboxNotedGeneration);
		NotedGenerations = hash_create("pg_outbox noted generations", 16, &ctl,
									   HASH_ELEM | HASH_BLOBS);
	}
	entry = hash_search(NotedGenerations, &group_id, HASH_ENTER, &found);
	before = found ? entry->generation : generation;
	entry->generation = generation;
	PG_RETURN_INT64(before);
}
