/*-------------------------------------------------------------------------
 *
 * trace.c
 *	  W3C trace context (level 1): the settings pg_outbox.traceparent and
 *	  pg_outbox.tracestate, and the validation of both values.
 *
 * An event's trace context is two keys of its headers, "traceparent" and
 * "tracestate" (JSON strings). emit.c takes them from the caller's headers
 * or from the settings; consume.c hands an entry's traceparent to its
 * handler as $6 and sets the settings while the handler runs, so that an
 * event the handler emits carries the same trace.
 *
 * A value that is not valid is never an error: emit drops it with a
 * warning (OB006), consume treats it as absent. So the settings have no
 * check hook: a SET of a bad value succeeds, and only the emit that would
 * use it says why it did not. The validation here is the one definition
 * of the C engine; the SQL engine's outbox.traceparent_fault() and
 * outbox.tracestate_fault() (sql/engine/sql/trace.sql) decide alike and
 * give the same reasons, which the shared regression test compares.
 *
 *	traceparent: exactly 55 characters "vv-<32 hex>-<16 hex>-<2 hex>",
 *	  lowercase hex, version 00 only, trace-id and parent-id not all zeros.
 *	tracestate: at most 512 bytes of printable ASCII (0x20-0x7E), at most
 *	  32 comma-separated list-members, each (trimmed of spaces and tabs)
 *	  empty or key=value; kept only with a valid traceparent.
 *
 * Layering: trace.c calls nothing of pg_outbox; emit.c, consume.c and
 * _PG_init call it.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/jsonb.h"

#include "trace.h"

PG_FUNCTION_INFO_V1(outbox_traceparent_fault);
PG_FUNCTION_INFO_V1(outbox_tracestate_fault);

char	   *pg_outbox_traceparent = NULL;
char	   *pg_outbox_tracestate = NULL;

/* Defines the two settings; called once from _PG_init. */
void
OutboxTraceInit(void)
{
	DefineCustomStringVariable("pg_outbox.traceparent",
							   "W3C traceparent that outbox_emit() gives events emitted without one in their headers.",
							   "Empty: none. A value that is not a valid traceparent of version 00 is dropped by outbox_emit() with a warning (SQLSTATE OB006). inbox_consume() sets it to each entry's traceparent while its handler runs.",
							   &pg_outbox_traceparent,
							   "",
							   PGC_USERSET,
							   GUC_NOT_IN_SAMPLE,
							   NULL, NULL, NULL);
	DefineCustomStringVariable("pg_outbox.tracestate",
							   "W3C tracestate that outbox_emit() gives events together with pg_outbox.traceparent.",
							   "Empty: none. Kept only with a valid pg_outbox.traceparent; a value that is not a valid tracestate is dropped by outbox_emit() with a warning (SQLSTATE OB006).",
							   &pg_outbox_tracestate,
							   "",
							   PGC_USERSET,
							   GUC_NOT_IN_SAMPLE,
							   NULL, NULL, NULL);
}

static bool
OutboxIsLowerHex(char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

/* Whether s[0, len) holds only '0'. */
static bool
OutboxAllZeros(const char *s, int len)
{
	for (int i = 0; i < len; i++)
		if (s[i] != '0')
			return false;
	return true;
}

/*
 * Why s[0, len) is not a valid traceparent, as the end of a sentence that
 * starts with the value's name; NULL when it is valid.
 */
const char *
OutboxTraceparentFault(const char *s, int len)
{
	if (len != OUTBOX_TRACEPARENT_LEN)
		return psprintf("is %d bytes, not %d", len, OUTBOX_TRACEPARENT_LEN);
	for (int i = 0; i < len; i++)
	{
		bool		dash = (i == 2 || i == 35 || i == 52);

		if (dash ? s[i] != '-' : !OutboxIsLowerHex(s[i]))
			return "is not of the form 00-<32 hex>-<16 hex>-<2 hex> in lowercase hex digits";
	}
	if (s[0] != '0' || s[1] != '0')
		return psprintf("has version %.2s; only version 00 is valid", s);
	if (OutboxAllZeros(s + 3, 32))
		return "has an all-zero trace-id";
	if (OutboxAllZeros(s + 36, 16))
		return "has an all-zero parent-id";
	return NULL;
}

/* A character of a key after its first: [_0-9a-z*\/-]. */
static bool
OutboxIsKeyChar(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '*' || c == '/';
}

/* Whether s[0, len) is a key of "first" then up to max - 1 key characters. */
static bool
OutboxKeyPart(const char *s, int len, bool digit_first, int max)
{
	if (len < 1 || len > max)
		return false;
	if (!((s[0] >= 'a' && s[0] <= 'z') || (digit_first && s[0] >= '0' && s[0] <= '9')))
		return false;
	for (int i = 1; i < len; i++)
		if (!OutboxIsKeyChar(s[i]))
			return false;
	return true;
}

/* Whether s[0, len), already trimmed and not empty, is a valid key=value. */
static bool
OutboxTracestateMember(const char *s, int len)
{
	const char *eq = memchr(s, '=', len);
	const char *at;
	int			klen;
	int			vlen;

	if (eq == NULL)
		return false;
	klen = eq - s;
	vlen = len - klen - 1;
	at = memchr(s, '@', klen);
	if (at == NULL)
	{
		if (!OutboxKeyPart(s, klen, true, 256))
			return false;
	}
	else if (!OutboxKeyPart(s, at - s, true, 241) ||
			 !OutboxKeyPart(at + 1, klen - (at - s) - 1, false, 14))
		return false;
	if (vlen < 1 || vlen > 256 || eq[vlen] == ' ')
		return false;
	for (int i = 1; i <= vlen; i++)
		if (eq[i] == ',' || eq[i] == '=')
			return false;
	return true;
}

/*
 * Why s[0, len) is not a valid tracestate, as the end of a sentence that
 * starts with the value's name; NULL when it is valid.
 */
const char *
OutboxTracestateFault(const char *s, int len)
{
	int			members = 1;
	int			start = 0;
	int			number = 0;

	if (len > OUTBOX_TRACESTATE_MAX_LEN)
		return psprintf("is %d bytes, over %d", len, OUTBOX_TRACESTATE_MAX_LEN);
	for (int i = 0; i < len; i++)
	{
		if ((unsigned char) s[i] < 0x20 || (unsigned char) s[i] > 0x7e)
			return "holds a character outside printable ASCII";
		if (s[i] == ',')
			members++;
	}
	if (members > OUTBOX_TRACESTATE_MAX_MEMBERS)
		return psprintf("has %d list-members, over %d", members, OUTBOX_TRACESTATE_MAX_MEMBERS);
	for (int i = 0; i <= len; i++)
	{
		int			from = start;
		int			to = i;

		if (i < len && s[i] != ',')
			continue;
		number++;
		start = i + 1;
		while (from < to && (s[from] == ' ' || s[from] == '\t'))
			from++;
		while (to > from && (s[to - 1] == ' ' || s[to - 1] == '\t'))
			to--;
		if (from < to && !OutboxTracestateMember(s + from, to - from))
			return psprintf("has an invalid list-member (number %d)", number);
	}
	return NULL;
}

/* A JSON string of "headers" under "key", or NULL (absent or no string). */
static JsonbValue *
OutboxHeadersString(Jsonb *headers, const char *key, JsonbValue *buf)
{
	JsonbValue *v = getKeyJsonValueFromContainer(&headers->root, key, strlen(key), buf);

	return v != NULL && v->type == jbvString ? v : NULL;
}

/*
 * The valid trace context of an event's headers (an object, or NULL): its
 * traceparent, and its tracestate when valid too, as text, or NULL.
 * Returns whether it has a valid traceparent.
 */
bool
OutboxTraceOfHeaders(Jsonb *headers, text **traceparent, text **tracestate)
{
	JsonbValue	buf;
	JsonbValue *v;

	*traceparent = NULL;
	*tracestate = NULL;
	if (headers == NULL || !JB_ROOT_IS_OBJECT(headers))
		return false;
	v = OutboxHeadersString(headers, "traceparent", &buf);
	if (v == NULL || OutboxTraceparentFault(v->val.string.val, v->val.string.len) != NULL)
		return false;
	*traceparent = cstring_to_text_with_len(v->val.string.val, v->val.string.len);
	v = OutboxHeadersString(headers, "tracestate", &buf);
	if (v != NULL && OutboxTracestateFault(v->val.string.val, v->val.string.len) == NULL)
		*tracestate = cstring_to_text_with_len(v->val.string.val, v->val.string.len);
	return true;
}

/* {"traceparent": traceparent, "tracestate": tracestate (unless NULL)} */
Jsonb *
OutboxTraceObject(const char *traceparent, const char *tracestate)
{
	JsonbParseState *state = NULL;
	JsonbValue	k;
	JsonbValue	v;
	JsonbValue *result;

	pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);
	k.type = jbvString;
	v.type = jbvString;
	k.val.string.val = "traceparent";
	k.val.string.len = strlen("traceparent");
	v.val.string.val = (char *) traceparent;
	v.val.string.len = strlen(traceparent);
	pushJsonbValue(&state, WJB_KEY, &k);
	pushJsonbValue(&state, WJB_VALUE, &v);
	if (tracestate != NULL)
	{
		k.val.string.val = "tracestate";
		k.val.string.len = strlen("tracestate");
		v.val.string.val = (char *) tracestate;
		v.val.string.len = strlen(tracestate);
		pushJsonbValue(&state, WJB_KEY, &k);
		pushJsonbValue(&state, WJB_VALUE, &v);
	}
	result = pushJsonbValue(&state, WJB_END_OBJECT, NULL);
	return JsonbValueToJsonb(result);
}

/*
 * outbox.traceparent_fault(value text): why value is not a valid
 * traceparent, or NULL.
 */
Datum
outbox_traceparent_fault(PG_FUNCTION_ARGS)
{
	text	   *value = PG_GETARG_TEXT_PP(0);
	const char *fault = OutboxTraceparentFault(VARDATA_ANY(value), VARSIZE_ANY_EXHDR(value));

	if (fault == NULL)
		PG_RETURN_NULL();
	PG_RETURN_TEXT_P(cstring_to_text(fault));
}

/*
 * outbox.tracestate_fault(value text): why value is not a valid
 * tracestate, or NULL.
 */
Datum
outbox_tracestate_fault(PG_FUNCTION_ARGS)
{
	text	   *value = PG_GETARG_TEXT_PP(0);
	const char *fault = OutboxTracestateFault(VARDATA_ANY(value), VARSIZE_ANY_EXHDR(value));

	if (fault == NULL)
		PG_RETURN_NULL();
	PG_RETURN_TEXT_P(cstring_to_text(fault));
}
