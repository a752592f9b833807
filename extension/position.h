/*-------------------------------------------------------------------------
 *
 * position.h
 *	  Feed positions: "<order>-<seq>", the text a relay gives a stream
 *	  entry as its id.
 *
 * <order> is a transaction id (xid8 order) or a commit ticket (commit
 * order), plus the group's epoch (outbox_reanchor); <seq> the event's
 * number within its transaction. Both are decimal, without sign: at most
 * 20 digits up to 2^64 - 1 for the order, at most 19 up to 2^63 - 1 for
 * the sequence. This is the one parser of the extension: the SQL
 * functions outbox.parse_position(), parse_commit_position() and
 * unshift_position() call it, and so does outbox_fetch().
 *
 * Includes no other header of pg_outbox.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_POSITION_H
#define OUTBOX_POSITION_H

/* Longest text of a position: 20 digits, '-', 19 digits, NUL. */
#define OUTBOX_POSITION_LEN		41

/*
 * Parses a position; an error (22004, 22023) names what is wrong, in the
 * words of the SQL functions. "commit": the order part is a commit ticket,
 * at most 2^63 - 1.
 */
extern void OutboxParsePosition(const char *pos, bool commit, uint64 *order, int64 *seq);

/*
 * A re-anchored group's position as this server's: the epoch taken off the
 * order part. Text that is no position comes back as is, for the parser to
 * refuse; a position from before the epoch is an error (22023). Returns a
 * palloc'd string, or "pos" itself.
 */
extern const char *OutboxUnshiftPosition(const char *pos, uint64 epoch);

/* Writes "<order + epoch>-<seq>" into buf (OUTBOX_POSITION_LEN bytes). */
extern void OutboxFormatPosition(char *buf, uint64 order, uint64 epoch, int64 seq);

/*
 * A transaction id of a snapshot (at most 2^31 behind the next one) as a
 * full one, the order part of an xid8 position.
 */
extern uint64 OutboxFullXid(TransactionId xid);

#endif							/* OUTBOX_POSITION_H */
