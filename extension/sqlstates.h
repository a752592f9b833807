/*-------------------------------------------------------------------------
 *
 * sqlstates.h
 *	  The SQLSTATEs of pg_outbox's own, class OB: the one definition of
 *	  them in C.
 *
 * A client tells these refusals apart by their code, so the codes are part
 * of the interface. The same table is written once per language: here for
 * the extension's C, in the comment table of sql/install/00_schema_roles.sql
 * for its SQL, and in relay/include/pg_outbox/sqlstates.hpp for the relay;
 * test/layout.sh checks that the three agree and that no other file of a
 * language writes a code as a literal.
 *
 * Includes no other header of pg_outbox.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_SQLSTATES_H
#define OUTBOX_SQLSTATES_H

/* OB001: an event id applied before with another payload (the inbox). */
#define OUTBOX_SQLSTATE_IDENTITY_CONFLICT	"OB001"
#define ERRCODE_OUTBOX_IDENTITY_CONFLICT	MAKE_SQLSTATE('O', 'B', '0', '0', '1')

/* OB002: the leader's group's cursor was moved by outbox_rewind() or outbox_skip(). */
#define OUTBOX_SQLSTATE_REWOUND				"OB002"
#define ERRCODE_OUTBOX_REWOUND				MAKE_SQLSTATE('O', 'B', '0', '0', '2')

/* OB003: this session does not lead the group (any more). */
#define OUTBOX_SQLSTATE_NOT_LEADER			"OB003"
#define ERRCODE_OUTBOX_NOT_LEADER			MAKE_SQLSTATE('O', 'B', '0', '0', '3')

/* OB004: the group's next event is too large to publish. */
#define OUTBOX_SQLSTATE_EVENT_TOO_LARGE		"OB004"
#define ERRCODE_OUTBOX_EVENT_TOO_LARGE		MAKE_SQLSTATE('O', 'B', '0', '0', '4')

/* OB005: a consumer's parked entries would exceed outbox.config.park_limit. */
#define OUTBOX_SQLSTATE_PARK_LIMIT_REACHED	"OB005"
#define ERRCODE_OUTBOX_PARK_LIMIT_REACHED	MAKE_SQLSTATE('O', 'B', '0', '0', '5')

/* OB006: outbox_emit() dropped a trace context that is not valid (a warning). */
#define OUTBOX_SQLSTATE_TRACE_CONTEXT_DROPPED	"OB006"
#define ERRCODE_OUTBOX_TRACE_CONTEXT_DROPPED	MAKE_SQLSTATE('O', 'B', '0', '0', '6')

#endif							/* OUTBOX_SQLSTATES_H */
