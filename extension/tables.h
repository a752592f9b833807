/*-------------------------------------------------------------------------
 *
 * tables.h
 *	  Where pg_outbox keeps its rows: its schema, the columns of the tables
 *	  the C code reads and writes, and how to find those tables.
 *
 * The bottom of the extension's layering: it includes no other header of
 * pg_outbox, so every part can include it. A column added to outbox.event
 * or outbox.commit_log is added here, in the table's order, and the writer
 * refuses a table whose column count differs.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_TABLES_H
#define OUTBOX_TABLES_H

/* Schema of the extension's storage. */
#define OUTBOX_SCHEMA			"outbox"

/* Columns of outbox.event, in order (0-based). */
enum
{
	EVENT_TXID,
	EVENT_SEQ,
	EVENT_EVENT_ID,
	EVENT_TOPIC,
	EVENT_KEY,
	EVENT_PAYLOAD,
	EVENT_HEADERS,
	EVENT_CREATED_AT,
	EVENT_NATTS
};

/* Columns of outbox.commit_log, in order (0-based). */
enum
{
	MARKER_TXID,
	MARKER_TICKET,
	MARKER_NATTS
};

extern Oid	OutboxRelid(const char *name);

#endif							/* OUTBOX_TABLES_H */
