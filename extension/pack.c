/*-------------------------------------------------------------------------
 *
 * pack.c
 *	  A batch of the feed packed in one value: what outbox_fetch_packed()
 *	  returns to the relay.
 *
 * outbox_fetch() returns a batch as rows of nine columns: the relay's
 * backend spent more time sending them than reading them. Each row is a
 * message, each column goes through its type's output function, and the
 * relay's query formatted created_at with to_char() and computed the age
 * of the first event per row. A packed batch is one bytea: the fields the
 * relay writes to its streams, already in the text it writes, each
 * prefixed with its length, so that the relay slices them out without
 * parsing or unescaping anything.
 *
 * The format, integers in network byte order (as PostgreSQL's own binary
 * formats):
 *
 *	batch := "OBP1" count:uint32 first_age_us:int64 event{count}
 *	event := position event_id topic key payload headers created_at
 *	field := length:int32 byte{length}		length -1: NULL, no bytes
 *
 * position is "<order>-<seq>" as outbox_fetch() returns it; event_id is the
 * uuid's canonical text; payload and headers are JSON text as jsonb's
 * output function writes it (key and headers may be NULL); created_at is
 * RFC 3339 in UTC with microseconds ("2026-12-02T01:30:00.123456Z"), NULL
 * if not finite. first_age_us is how long ago the first event was created
 * (-1 for an empty batch), for the relay's lag metric.
 *
 * Layering: called by feed.c (the events) and fetch.c (the batch).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "libpq/pqformat.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "pack.h"
#include "tables.h"

#define OUTBOX_PACK_NULL	(-1)

/* Writes a big-endian int32 at "offset" of "buf", over what is there. */
static void
OutboxPackPut32(StringInfo buf, int offset, uint32 v)
{
	v = pg_hton32(v);
	memcpy(buf->data + offset, &v, sizeof(v));
}

static void
OutboxPackBytes(StringInfo buf, const char *data, int len)
{
	pq_sendint32(buf, (uint32) len);
	pq_sendbytes(buf, data, len);
}

static void
OutboxPackText(StringInfo buf, Datum value, bool isnull)
{
	text	   *t;

	if (isnull)
	{
		pq_sendint32(buf, (uint32) OUTBOX_PACK_NULL);
		return;
	}
	t = DatumGetTextPP(value);
	OutboxPackBytes(buf, VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t));
	if ((Pointer) t != DatumGetPointer(value))
		pfree(t);
}

/*
 * Whether any of the 8 bytes of "w" needs an escape in a JSON string: is
 * below 0x20, a '"' or a '\\'. Word-at-a-time tests, exact as a whole:
 * "(x - ones) & ~x & highs" is nonzero iff a byte of x is zero, and with
 * "ones * 0x20" in place of "ones", iff a byte is below 0x20 (bytes of
 * 0x80 and above never count: their high bit is set in x).
 */
static inline bool
OutboxJsonWordNeedsEscape(uint64 w)
{
	const uint64 ones = UINT64CONST(0x0101010101010101);
	const uint64 highs = UINT64CONST(0x8080808080808080);
	uint64		quote = w ^ (ones * '"');
	uint64		backslash = w ^ (ones * '\\');

	return (((quote - ones) & ~quote) |
			((backslash - ones) & ~backslash) |
			((w - ones * 0x20) & ~w)) & highs;
}

/*
 * A JSON string as escape_json() writes it (jsonb's output function),
 * without first copying it to end it with a NUL: runs of characters that
 * need no escape are copied whole. A jsonb string holds no NUL.
 */
static void
OutboxJsonString(StringInfo buf, const char *s, int len)
{
	const char *end = s + len;
	const char *run = s;
	const char *p;

	enlargeStringInfo(buf, len + 2);
	appendStringInfoCharMacro(buf, '"');
	for (p = s; p < end; p++)
	{
		unsigned char c;

		/* Most strings need no escape: skip them 8 bytes at a time. */
		while (end - p >= (int) sizeof(uint64))
		{
			uint64		w;

			memcpy(&w, p, sizeof(w));
			if (OutboxJsonWordNeedsEscape(w))
				break;
			p += sizeof(w);
		}
		if (p >= end)
			break;
		c = (unsigned char) *p;
		if (c >= 0x20 && c != '"' && c != '\\')
			continue;
		appendBinaryStringInfo(buf, run, p - run);
		run = p + 1;
		switch (c)
		{
			case '\b':
				appendBinaryStringInfo(buf, "\\b", 2);
				break;
			case '\f':
				appendBinaryStringInfo(buf, "\\f", 2);
				break;
			case '\n':
				appendBinaryStringInfo(buf, "\\n", 2);
				break;
			case '\r':
				appendBinaryStringInfo(buf, "\\r", 2);
				break;
			case '\t':
				appendBinaryStringInfo(buf, "\\t", 2);
				break;
			case '"':
				appendBinaryStringInfo(buf, "\\\"", 2);
				break;
			case '\\':
				appendBinaryStringInfo(buf, "\\\\", 2);
				break;
			default:
				appendStringInfo(buf, "\\u%04x", (int) c);
				break;
		}
	}
	appendBinaryStringInfo(buf, run, end - run);
	appendStringInfoCharMacro(buf, '"');
}

static void OutboxJsonContainer(StringInfo buf, const JsonbContainer *jc);

/* The value of entry "je", at "start" (length "len") of "data". */
static void
OutboxJsonValue(StringInfo buf, JEntry je, const char *data, uint32 start, uint32 len)
{
	if (JBE_ISSTRING(je))
		OutboxJsonString(buf, data + start, len);
	else if (JBE_ISNUMERIC(je))
		appendStringInfoString(buf, DatumGetCString(DirectFunctionCall1(numeric_out,
																	 PointerGetDatum(data + INTALIGN(start)))));
	else if (JBE_ISBOOL_TRUE(je))
		appendBinaryStringInfo(buf, "true", 4);
	else if (JBE_ISBOOL_FALSE(je))
		appendBinaryStringInfo(buf, "false", 5);
	else if (JBE_ISNULL(je))
		appendBinaryStringInfo(buf, "null", 4);
	else if (JBE_ISCONTAINER(je))
		OutboxJsonContainer(buf, (const JsonbContainer *) (data + INTALIGN(start)));
	else
		elog(ERROR, "unknown type of jsonb entry: %08x", je);
}

/*
 * A jsonb container as JSON text, exactly as jsonb's output function
 * writes it ("{"a": 1, "b": [true, null]}", a root scalar alone), read
 * straight from its entries: jsonb_out() goes through the generic
 * iterator, which builds a value per token and copies every string, and
 * took most of the time of a batch. Layout as in utils/jsonb.h: the
 * entries (an object's keys, then its values), then their data; an entry
 * holds its length, or every JB_OFFSET_STRIDE-th its end offset.
 */
static void
OutboxJsonContainer(StringInfo buf, const JsonbContainer *jc)
{
	uint32		count = JsonContainerSize(jc);
	bool		object = JsonContainerIsObject(jc);
	const char *data = (const char *) &jc->children[object ? count * 2 : count];
	uint32		key_offset = 0;
	uint32		value_offset = object ? getJsonbOffset(jc, count) : 0;
	uint32		i;

	check_stack_depth();
	if (JsonContainerIsScalar(jc))
	{
		OutboxJsonValue(buf, jc->children[0], data, 0, getJsonbLength(jc, 0));
		return;
	}
	appendStringInfoCharMacro(buf, object ? '{' : '[');
	for (i = 0; i < count; i++)
	{
		JEntry		value = jc->children[object ? count + i : i];
		uint32		start;

		if (i > 0)
			appendBinaryStringInfo(buf, ", ", 2);
		if (object)
		{
			JEntry		key = jc->children[i];

			start = key_offset;
			JBE_ADVANCE_OFFSET(key_offset, key);
			OutboxJsonString(buf, data + start, key_offset - start);
			appendBinaryStringInfo(buf, ": ", 2);
		}
		start = value_offset;
		JBE_ADVANCE_OFFSET(value_offset, value);
		OutboxJsonValue(buf, value, data, start, value_offset - start);
	}
	appendStringInfoCharMacro(buf, object ? '}' : ']');
}

static void
OutboxPackJson(StringInfo buf, Datum value, bool isnull)
{
	Jsonb	   *jb;
	int			at;

	if (isnull)
	{
		pq_sendint32(buf, (uint32) OUTBOX_PACK_NULL);
		return;
	}
	jb = DatumGetJsonbP(value);
	at = buf->len;
	pq_sendint32(buf, 0);		/* the length, once known */
	OutboxJsonContainer(buf, &jb->root);
	OutboxPackPut32(buf, at, (uint32) (buf->len - at - 4));
	if ((Pointer) jb != DatumGetPointer(value))
		pfree(jb);
}

static void
OutboxPackUuid(StringInfo buf, Datum value)
{
	static const char hex[] = "0123456789abcdef";
	const pg_uuid_t *u = DatumGetUUIDP(value);
	char		text[UUID_LEN * 2 + 4];
	int			n = 0;
	int			i;

	for (i = 0; i < UUID_LEN; i++)
	{
		if (i == 4 || i == 6 || i == 8 || i == 10)
			text[n++] = '-';
		text[n++] = hex[u->data[i] >> 4];
		text[n++] = hex[u->data[i] & 0x0F];
	}
	OutboxPackBytes(buf, text, n);
}

/* Writes "v" as exactly "width" decimal digits at "p"; returns the end. */
static char *
OutboxPackDigits(char *p, int v, int width)
{
	int			i;

	for (i = width - 1; i >= 0; i--)
	{
		p[i] = '0' + v % 10;
		v /= 10;
	}
	return p + width;
}

static void
OutboxPackTimestamp(StringInfo buf, Datum value, bool isnull)
{
	TimestampTz ts;
	struct pg_tm tm;
	fsec_t		fsec;
	char		text[32];
	char	   *p = text;

	if (isnull || TIMESTAMP_NOT_FINITE(ts = DatumGetTimestampTz(value)) ||
		timestamp2tm(ts, NULL, &tm, &fsec, NULL, NULL) != 0 || tm.tm_year < 1 || tm.tm_year > 9999)
	{
		/* Not representable in RFC 3339 (and never made by outbox_emit()). */
		pq_sendint32(buf, (uint32) OUTBOX_PACK_NULL);
		return;
	}
	p = OutboxPackDigits(p, tm.tm_year, 4);
	*p++ = '-';
	p = OutboxPackDigits(p, tm.tm_mon, 2);
	*p++ = '-';
	p = OutboxPackDigits(p, tm.tm_mday, 2);
	*p++ = 'T';
	p = OutboxPackDigits(p, tm.tm_hour, 2);
	*p++ = ':';
	p = OutboxPackDigits(p, tm.tm_min, 2);
	*p++ = ':';
	p = OutboxPackDigits(p, tm.tm_sec, 2);
	*p++ = '.';
	p = OutboxPackDigits(p, fsec, 6);
	*p++ = 'Z';
	OutboxPackBytes(buf, text, p - text);
}

int
OutboxPackBegin(StringInfo buf)
{
	int			start = buf->len;

	pq_sendbytes(buf, OUTBOX_PACK_MAGIC, OUTBOX_PACK_MAGIC_LEN);
	pq_sendint32(buf, 0);
	pq_sendint64(buf, -1);
	return start;
}

void
OutboxPackEvent(StringInfo buf, const char *position, const Datum *values, const bool *nulls)
{
	OutboxPackBytes(buf, position, strlen(position));
	OutboxPackUuid(buf, values[EVENT_EVENT_ID]);
	OutboxPackText(buf, values[EVENT_TOPIC], nulls[EVENT_TOPIC]);
	OutboxPackText(buf, values[EVENT_KEY], nulls[EVENT_KEY]);
	OutboxPackJson(buf, values[EVENT_PAYLOAD], nulls[EVENT_PAYLOAD]);
	OutboxPackJson(buf, values[EVENT_HEADERS], nulls[EVENT_HEADERS]);
	OutboxPackTimestamp(buf, values[EVENT_CREATED_AT], nulls[EVENT_CREATED_AT]);
}

void
OutboxPackEnd(StringInfo buf, int start, int64 count, int64 first_age_us)
{
	uint64		age = pg_hton64((uint64) first_age_us);

	OutboxPackPut32(buf, start + OUTBOX_PACK_MAGIC_LEN, (uint32) count);
	memcpy(buf->data + start + OUTBOX_PACK_MAGIC_LEN + 4, &age, sizeof(age));
}
