/*-------------------------------------------------------------------------
 *
 * lead.c
 *	  Group leadership: which session may publish a group's feed, and for
 *	  how long without showing progress.
 *
 * A group's leader is written in its row of outbox.groups: the backend's
 * pid and start time (a pid alone may be reused by a later backend) and a
 * lease, renewed by the leader's fetches and advances. The SQL side
 * (outbox.lead() and friends, in group.c) decides; this file gives it what
 * only C can see:
 *
 * - outbox.session_started(): this backend's start time, which with its
 *   pid names the session for as long as it lives.
 * - outbox.session_alive(pid, started): whether that session still runs.
 *   A standby takes over at once from a leader whose session ended, and
 *   otherwise only once the lease has run out. A session that is alive
 *   but makes no progress (its relay stopped, paused, or stuck in a
 *   broker call) keeps its backend, and with it everything a session lock
 *   would keep; the lease is what lets it go.
 * - pg_outbox.lease: how long a lease lasts, set by each leader for
 *   itself; outbox.lease() reads it.
 * - the leadership this session noted, per group, with the generation it
 *   saw (below).
 * - pg_outbox.max_group_streams: how many streams a group's row records
 *   the last position of (outbox.groups.streams, kept by
 *   outbox_advance() for the relay's check that Redis lost nothing);
 *   outbox.max_group_streams() reads it.
 *
 * Every change of leader and every outbox_rewind() bumps the group's
 * generation. A leader notes the generation when it takes the lead. When
 * its next fetch or advance sees another one while it still leads, the
 * cursor was moved under it: that call is refused once (SQLSTATE OB002)
 * and it starts again from the cursor. When it no longer leads, its
 * leadership passed to another session (its lease ran out): its next call
 * is refused with SQLSTATE OB003 and it stands by. Its broker writes from
 * before are harmless: each entry's id is its position in the feed, and
 * the broker refuses an id at or below a stream's last one.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "storage/lock.h"
#include "storage/procarray.h"
#include "utils/backend_status.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/timestamp.h"

#include "lead.h"
#include "locks.h"


/* pg_outbox.lease, in milliseconds */
#define OUTBOX_DEFAULT_LEASE_MS		15000
#define OUTBOX_MIN_LEASE_MS			100
#define OUTBOX_MAX_LEASE_MS			3600000

int			pg_outbox_lease_ms = OUTBOX_DEFAULT_LEASE_MS;

/*
 * pg_outbox.max_group_streams: a group's row keeps the last position of
 * its most recently written streams only, so that a group publishing to
 * ever new streams (a topic per customer) does not rewrite an ever larger
 * row with each advance, nor have its relay check every stream it ever
 * wrote.
 */
#define OUTBOX_DEFAULT_MAX_GROUP_STREAMS	1000
#define OUTBOX_MIN_MAX_GROUP_STREAMS		1
#define OUTBOX_MAX_MAX_GROUP_STREAMS		100000

static int	pg_outbox_max_group_streams = OUTBOX_DEFAULT_MAX_GROUP_STREAMS;

PG_FUNCTION_INFO_V1(outbox_lock_class);
PG_FUNCTION_INFO_V1(outbox_note_generation);
PG_FUNCTION_INFO_V1(outbox_forget_leadership);
PG_FUNCTION_INFO_V1(outbox_session_started);
PG_FUNCTION_INFO_V1(outbox_session_alive);
PG_FUNCTION_INFO_V1(outbox_lease);
PG_FUNCTION_INFO_V1(outbox_max_group_streams);
PG_FUNCTION_INFO_V1(outbox_lead);
PG_FUNCTION_INFO_V1(outbox_is_leader);
PG_FUNCTION_INFO_V1(outbox_resign);

/* A group this session took the lead of, with the generation it saw. */
typedef struct OutboxNotedGeneration
{
	int32		group_id;		/* hash key */
	int64		generation;
} OutboxNotedGeneration;

static HTAB *NotedGenerations = NULL;

/* Registers pg_outbox.lease; called by _PG_init. */
void
OutboxLeadInit(void)
{
	DefineCustomIntVariable("pg_outbox.lease",
							"How long this session's leadership of a group lasts without a fetch or advance.",
							"A standby takes a group over once its leader's lease has run out, or at once when "
							"the leader's session ended. Each leader sets it for itself.",
							&pg_outbox_lease_ms,
							OUTBOX_DEFAULT_LEASE_MS,
							OUTBOX_MIN_LEASE_MS,
							OUTBOX_MAX_LEASE_MS,
							PGC_USERSET,
							GUC_UNIT_MS,
							NULL, NULL, NULL);
	/*
	 * Only a superuser sets it (or the server's configuration): a session
	 * that set it low would make a group forget streams whose loss the
	 * relay would then not see.
	 */
	DefineCustomIntVariable("pg_outbox.max_group_streams",
							"How many streams a group records the last published position of.",
							"outbox_advance() keeps the most recently written ones (and every one above the "
							"cursor) and forgets the rest, and the ones whose events retention removed; the "
							"relay checks these streams for entries Redis lost.",
							&pg_outbox_max_group_streams,
							OUTBOX_DEFAULT_MAX_GROUP_STREAMS,
							OUTBOX_MIN_MAX_GROUP_STREAMS,
							OUTBOX_MAX_MAX_GROUP_STREAMS,
							PGC_SUSET,
							0,
							NULL, NULL, NULL);
}

/* The classid of pg_outbox's advisory locks, for finding them in pg_locks. */
Datum
outbox_lock_class(PG_FUNCTION_ARGS)
{
	PG_RETURN_OID((Oid) OUTBOX_LOCK_CLASS);
}

/*
 * outbox.note_generation(group_id, generation): notes the group's
 * generation for this session and returns the one noted before (the given
 * one the first time after taking the lead).
 */
int64
OutboxNoteGeneration(int32 group_id, int64 generation)
{
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
	return before;
}

Datum
outbox_note_generation(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT64(OutboxNoteGeneration(PG_GETARG_INT32(0), PG_GETARG_INT64(1)));
}

/*
 * outbox.forget_leadership(group_id): forgets what this session noted of
 * the group; true when it had taken the lead of it. Not transactional: a
 * leadership lost stays lost even when the call that found out fails.
 */
bool
OutboxForgetLeadership(int32 group_id)
{
	bool		found = false;

	if (NotedGenerations != NULL)
		(void) hash_search(NotedGenerations, &group_id, HASH_REMOVE, &found);
	return found;
}

Datum
outbox_forget_leadership(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(OutboxForgetLeadership(PG_GETARG_INT32(0)));
}

/* outbox.session_started(): when this backend started. */
Datum
outbox_session_started(PG_FUNCTION_ARGS)
{
	PG_RETURN_TIMESTAMPTZ(MyStartTimestamp);
}

/*
 * outbox.session_alive(pid, started): true while the backend with this pid
 * that started then runs, in any database. A pid without a backend is a
 * session that ended; one whose backend started at another time was
 * reused.
 */
bool
OutboxSessionAlive(int32 pid, TimestampTz started)
{
	int			n;
	int			i;

	if (pid == MyProcPid)
		return started == MyStartTimestamp;
	if (BackendPidGetProc(pid) == NULL)
		return false;
	/* The backend status array; read once per transaction. */
	n = pgstat_fetch_stat_numbackends();
	for (i = 1; i <= n; i++)
	{
		LocalPgBackendStatus *local = pgstat_fetch_stat_local_beentry(i);

		if (local != NULL && local->backendStatus.st_procpid == pid)
			return local->backendStatus.st_proc_start_timestamp == started;
	}
	return false;
}

Datum
outbox_session_alive(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(OutboxSessionAlive(PG_GETARG_INT32(0), PG_GETARG_TIMESTAMPTZ(1)));
}

/* outbox.lease(): pg_outbox.lease as an interval. */
Datum
outbox_lease(PG_FUNCTION_ARGS)
{
	Interval   *lease = palloc0(sizeof(Interval));

	lease->time = (int64) pg_outbox_lease_ms * INT64CONST(1000);
	PG_RETURN_INTERVAL_P(lease);
}

/* outbox.max_group_streams(): pg_outbox.max_group_streams. */
Datum
outbox_max_group_streams(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT32(pg_outbox_max_group_streams);
}

/*
 * Leadership as version 0.1.0 of the SQL objects declares it: a
 * session-level advisory lock per group, without a lease. A database
 * keeps these definitions until ALTER EXTENSION pg_outbox UPDATE, and they
 * keep working with this library until then.
 */
static void
OutboxLeaderTag(LOCKTAG *tag, int32 group_id)
{
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, OUTBOX_LOCK_CLASS,
						 (uint32) group_id, OUTBOX_LOCK_LEADER);
}

/* 0.1.0 outbox.lead(group_id): takes the group's lock if free. */
Datum
outbox_lead(PG_FUNCTION_ARGS)
{
	LOCKTAG		tag;

	OutboxLeaderTag(&tag, PG_GETARG_INT32(0));
	if (LockHeldByMe(&tag, ExclusiveLock))
		PG_RETURN_BOOL(true);
	PG_RETURN_BOOL(LockAcquire(&tag, ExclusiveLock, true, true) != LOCKACQUIRE_NOT_AVAIL);
}

/* 0.1.0 outbox.is_leader(group_id). */
Datum
outbox_is_leader(PG_FUNCTION_ARGS)
{
	LOCKTAG		tag;

	OutboxLeaderTag(&tag, PG_GETARG_INT32(0));
	PG_RETURN_BOOL(LockHeldByMe(&tag, ExclusiveLock));
}

/* 0.1.0 outbox.resign(group_id). */
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
	PG_RETURN_BOOL(held);
}
