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
 * The size of that JSON text is computed here too, without writing it:
 * emit.c bounds it with pg_outbox.max_payload_size, and feed.c checks it
 * before packing an event, so that a batch stops before an event that
 * would take it over its cap and an event too large to publish at all is
 * reported before it costs anything (see OutboxJsonTextSize).
 *
 * Layering: called by feed.c (the events), fetch.c (the batch) and emit.c
 * (the size of JSON text); calls nothing of pg_outbox's but tables.h.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/detoast.h"
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
 * Skips the words of 8 bytes from "p" on that need no escape (most strings
 * need none at all): returns the word's first byte that may, or the last
 * bytes, fewer than 8, which the caller checks one by one. The writer and
 * the sizer below both start each step here.
 */
static inline const char *
OutboxJsonSkipPlain(const char *p, const char *end)
{
	while (end - p >= (int) sizeof(uint64))
	{
		uint64		w;

		memcpy(&w, p, sizeof(w));
		if (OutboxJsonWordNeedsEscape(w))
			break;
		p += sizeof(w);
	}
	return p;
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

		p = OutboxJsonSkipPlain(p, end);
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

/*
 * The size of JSON text, computed without writing it: what the writer
 * above and jsonb's output function write, to the byte. A value's stored
 * size says little of it: jsonb stores 1e131071 in a dozen bytes and prints
 * it with 131,072 digits, and a string of control characters prints six
 * bytes ("\u0001") for each one. pg_outbox.max_payload_size bounds this
 * size at emit, and a fetch checks it before packing an event, so that no
 * event makes a batch that cannot be built.
 *
 * "exact" false gives an upper bound without reading the bytes of strings
 * (each may print as six): numbers, keywords and punctuation are counted
 * exactly either way, from the entries and the numbers' headers alone.
 */

/* How many bytes character "c" of a JSON string prints as. */
static inline int
OutboxJsonCharSize(unsigned char c)
{
	if (c >= 0x20 && c != '"' && c != '\\')
		return 1;
	switch (c)
	{
		case '\b':
		case '\f':
		case '\n':
		case '\r':
		case '\t':
		case '"':
		case '\\':
			return 2;
		default:
			return 6;			/* \u00XX */
	}
}

/* The size of a JSON string of "len" bytes at "s", quotes included. */
static uint64
OutboxJsonStringSize(const char *s, int len, bool exact)
{
	const char *end = s + len;
	const char *p = s;
	uint64		size = 2 + (uint64) len;

	if (!exact)
		return 2 + 6 * (uint64) len;
	while (p < end)
	{
		p = OutboxJsonSkipPlain(p, end);
		if (p >= end)
			break;
		size += OutboxJsonCharSize((unsigned char) *p) - 1;
		p++;
	}
	return size;
}

/*
 * The numeric header, as utils/adt/numeric.c lays it out (a format stored
 * on disk, which PostgreSQL keeps): numeric.h keeps it private, and
 * printing a number to count its digits would cost what this check is
 * meant to avoid.
 */
#define OUTBOX_NUMERIC_SIGN_MASK		0xC000
#define OUTBOX_NUMERIC_NEG				0x4000
#define OUTBOX_NUMERIC_SHORT			0x8000
#define OUTBOX_NUMERIC_SPECIAL			0xC000
#define OUTBOX_NUMERIC_SHORT_SIGN_MASK	0x2000
#define OUTBOX_NUMERIC_SHORT_DSCALE_MASK	0x1F80
#define OUTBOX_NUMERIC_SHORT_DSCALE_SHIFT	7
#define OUTBOX_NUMERIC_SHORT_WEIGHT_SIGN_MASK	0x0040
#define OUTBOX_NUMERIC_SHORT_WEIGHT_MASK	0x003F
#define OUTBOX_NUMERIC_DSCALE_MASK		0x3FFF

/*
 * The size of a number as numeric_out() prints it: a sign, the integer
 * part (the first base-10000 digit without leading zeros, four decimal
 * digits for each digit of weight after it, "0" below 1), and the point
 * and display scale's digits. NaN and the infinities are printed.
 */
static uint64
OutboxNumericSize(const char *value)
{
	const char *p = VARDATA_ANY(value);
	int			len = VARSIZE_ANY_EXHDR(value);
	uint16		header;
	int16		digit0 = 0;
	int			weight;
	int			dscale;
	int			ndigits;
	bool		negative;
	uint64		size;

	if (len < (int) sizeof(uint16))
		elog(ERROR, "pg_outbox: numeric of %d bytes in a jsonb value", len);
	memcpy(&header, p, sizeof(header));
	if ((header & OUTBOX_NUMERIC_SIGN_MASK) == OUTBOX_NUMERIC_SPECIAL)
		return strlen(DatumGetCString(DirectFunctionCall1(numeric_out, PointerGetDatum(value))));
	if (header & OUTBOX_NUMERIC_SHORT)
	{
		negative = (header & OUTBOX_NUMERIC_SHORT_SIGN_MASK) != 0;
		dscale = (header & OUTBOX_NUMERIC_SHORT_DSCALE_MASK) >> OUTBOX_NUMERIC_SHORT_DSCALE_SHIFT;
		weight = (header & OUTBOX_NUMERIC_SHORT_WEIGHT_SIGN_MASK ? ~OUTBOX_NUMERIC_SHORT_WEIGHT_MASK : 0) |
			(header & OUTBOX_NUMERIC_SHORT_WEIGHT_MASK);
		p += sizeof(uint16);
		len -= sizeof(uint16);
	}
	else
	{
		int16		w;

		if (len < (int) (sizeof(uint16) + sizeof(int16)))
			elog(ERROR, "pg_outbox: numeric of %d bytes in a jsonb value", len);
		negative = (header & OUTBOX_NUMERIC_SIGN_MASK) == OUTBOX_NUMERIC_NEG;
		dscale = header & OUTBOX_NUMERIC_DSCALE_MASK;
		memcpy(&w, p + sizeof(uint16), sizeof(w));
		weight = w;
		p += sizeof(uint16) + sizeof(int16);
		len -= sizeof(uint16) + sizeof(int16);
	}
	ndigits = len / (int) sizeof(int16);
	if (ndigits > 0)
		memcpy(&digit0, p, sizeof(digit0));

	size = negative ? 1 : 0;
	if (weight < 0)
		size += 1;
	else
		size += (digit0 >= 1000 ? 4 : digit0 >= 100 ? 3 : digit0 >= 10 ? 2 : 1) + 4 * (uint64) weight;
	if (dscale > 0)
		size += 1 + (uint64) dscale;
	return size;
}

static uint64 OutboxJsonContainerSize(const JsonbContainer *jc, bool exact);

/* The size of the value of entry "je", as OutboxJsonValue() writes it. */
static uint64
OutboxJsonValueSize(JEntry je, const char *data, uint32 start, uint32 len, bool exact)
{
	if (JBE_ISSTRING(je))
		return OutboxJsonStringSize(data + start, len, exact);
	if (JBE_ISNUMERIC(je))
		return OutboxNumericSize(data + INTALIGN(start));
	if (JBE_ISBOOL_TRUE(je))
		return 4;
	if (JBE_ISBOOL_FALSE(je))
		return 5;
	if (JBE_ISNULL(je))
		return 4;
	if (JBE_ISCONTAINER(je))
		return OutboxJsonContainerSize((const JsonbContainer *) (data + INTALIGN(start)), exact);
	elog(ERROR, "unknown type of jsonb entry: %08x", je);
	pg_unreachable();
}

/* The size of a container as OutboxJsonContainer() writes it. */
static uint64
OutboxJsonContainerSize(const JsonbContainer *jc, bool exact)
{
	uint32		count = JsonContainerSize(jc);
	bool		object = JsonContainerIsObject(jc);
	const char *data = (const char *) &jc->children[object ? count * 2 : count];
	uint32		key_offset = 0;
	uint32		value_offset = object ? getJsonbOffset(jc, count) : 0;
	uint64		size;
	uint32		i;

	check_stack_depth();
	if (JsonContainerIsScalar(jc))
		return OutboxJsonValueSize(jc->children[0], data, 0, getJsonbLength(jc, 0), exact);
	/* Brackets, ", " between entries, ": " after each key. */
	size = 2 + (count > 0 ? 2 * (uint64) (count - 1) : 0) + (object ? 2 * (uint64) count : 0);
	for (i = 0; i < count; i++)
	{
		JEntry		value = jc->children[object ? count + i : i];
		uint32		start;

		if (object)
		{
			JEntry		key = jc->children[i];

			start = key_offset;
			JBE_ADVANCE_OFFSET(key_offset, key);
			size += OutboxJsonStringSize(data + start, key_offset - start, exact);
		}
		start = value_offset;
		JBE_ADVANCE_OFFSET(value_offset, value);
		size += OutboxJsonValueSize(value, data, start, value_offset - start, exact);
	}
	return size;
}

uint64
OutboxJsonTextSize(const Jsonb *jb, bool exact)
{
	return OutboxJsonContainerSize(&jb->root, exact);
}

/*
 * outbox.json_text_size(value jsonb): the size of the value as JSON text,
 * for an operator looking for events too large to publish, and for the
 * record of outbox_skip().
 */
PG_FUNCTION_INFO_V1(outbox_json_text_size);

Datum
outbox_json_text_size(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT64((int64) OutboxJsonTextSize(PG_GETARG_JSONB_P(0), true));
}

uint64
OutboxEventTextSize(const Jsonb *payload, const Jsonb *headers, uint64 limit)
{
	uint64		bound = OutboxJsonTextSize(payload, false) + (headers ? OutboxJsonTextSize(headers, false) : 0);

	if (bound <= limit)
		return bound;
	return OutboxJsonTextSize(payload, true) + (headers ? OutboxJsonTextSize(headers, true) : 0);
}

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

uint64
OutboxPackEventOverhead(const char *position, const Datum *values, const bool *nulls)
{
	/* Seven lengths, the position, the uuid's 36 characters, the timestamp's 27. */
	uint64		size = 7 * 4 + strlen(position) + 36 + 27;

	size += toast_raw_datum_size(values[EVENT_TOPIC]) - VARHDRSZ;
	if (!nulls[EVENT_KEY])
		size += toast_raw_datum_size(values[EVENT_KEY]) - VARHDRSZ;
	return size;
}

void
OutboxPackEnd(StringInfo buf, int start, int64 count, int64 first_age_us)
{
	uint64		age = pg_hton64((uint64) first_age_us);

	OutboxPackPut32(buf, start + OUTBOX_PACK_MAGIC_LEN, (uint32) count);
	memcpy(buf->data + start + OUTBOX_PACK_MAGIC_LEN + 4, &age, sizeof(age));
}
