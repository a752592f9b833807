/*-------------------------------------------------------------------------
 *
 * locks.h
 *	  The advisory lock tags of pg_outbox, in one table.
 *
 * pg_outbox takes PostgreSQL advisory locks with objsubids the SQL
 * advisory lock functions never use (they use 1 for a bigint key, 2 for
 * two integer keys), so its locks cannot collide with an application's.
 * Every sub-id pg_outbox takes is listed here, so that a new lock takes a
 * free one and the users of one lock agree on it. In pg_locks they show as
 * locktype 'advisory' with these objsubids, where operators (and, for
 * leadership, the install script and the README) look them up: a value
 * never changes meaning once released.
 *
 * A header of constants only, below every part: it includes no other
 * header of pg_outbox.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_LOCKS_H
#define OUTBOX_LOCKS_H

/* "obox": the classid of the group leadership locks (pg_locks.classid) */
#define OUTBOX_LOCK_CLASS	0x6F626F78

/* objsubids of pg_outbox's advisory locks */
typedef enum OutboxLockSubid
{
	/*
	 * Group leadership as the SQL objects of version 0.1.0 take it: a
	 * session lock, classid OUTBOX_LOCK_CLASS, objid the group id (lead.c,
	 * until ALTER EXTENSION UPDATE). Leadership is a lease in the group's
	 * row since 0.2.0. Not to be reused for another lock.
	 */
	OUTBOX_LOCK_LEADER = 3,

	/*
	 * Applies of one event by one consumer: a transaction lock, classid and
	 * objid the halves of a hash of (consumer, event id) (locks.c,
	 * OutboxInboxLock()).
	 */
	OUTBOX_LOCK_INBOX = 4,

	/*
	 * A database's maintenance run: a transaction lock, classid and objid 0,
	 * tried rather than waited for (locks.c, outbox.try_maintenance_lock()).
	 */
	OUTBOX_LOCK_MAINTENANCE = 5,

	/*
	 * Commit order against two-phase commit: a prepared transaction that
	 * emitted holds it in share mode, creating a commit-ordered group takes
	 * it exclusively; classid and objid 0 (commit.c).
	 */
	OUTBOX_LOCK_COMMIT_ORDER = 6,
} OutboxLockSubid;

/* Waits for the inbox lock of a (consumer, event id) key (locks.c). */
extern void OutboxInboxLock(uint64 key);

#endif							/* OUTBOX_LOCKS_H */
