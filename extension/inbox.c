/*-------------------------------------------------------------------------
 *
 * inbox.c
 *	  Who may act for an inbox consumer, and what the inbox already holds.
 *
 * Consumers are bound to roles: outbox.consumers names the role that owns
 * each consumer. Only members of that role (and of outbox_admin) may apply,
 * consume, dead-letter or replay for it, so that one consumer can neither
 * read another's payloads nor pre-mark or rewrite its events.
 *
 * The check needs the role that calls, which a SECURITY DEFINER function no
 * longer sees as current_user. So each inbox function that names a
 * consumer (or a dead letter of one) is the C entry point
 * outbox_inbox_checked(): running as the caller, it checks the consumer
 * and then calls the function's SQL body, outbox.<name>_unchecked with the
 * same arguments, directly through fmgr. The bodies are SECURITY DEFINER
 * and granted to nobody, so the check cannot be skipped by calling them.
 *
 * What the inbox holds is recorded by outbox.inbox_record() (consume.c),
 * for inbox_apply() and inbox_consume() alike.
 *
 * pg_outbox.today, the day inbox maintenance takes as today, is defined
 * here with the inbox, whose SQL (outbox.inbox_today()) reads it.
 *
 * Layering: inbox.c calls only tables.c; consume.c calls its consumer
 * check (OutboxCheckConsumer); nothing else calls into it but fmgr and
 * _PG_init.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/value.h"
#include "parser/parse_func.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/uuid.h"

#include "inbox.h"
#include "tables.h"

/* Longest consumer name, in bytes. */
#define OUTBOX_MAX_CONSUMER_LEN 255

/* Columns of outbox.consumers and outbox.dead_letters (1-based). */
#define CONSUMERS_NAME		1
#define CONSUMERS_OWNER		2
#define DEAD_LETTERS_ID		1
#define DEAD_LETTERS_CONSUMER 2

PG_FUNCTION_INFO_V1(outbox_inbox_consumer_check);
PG_FUNCTION_INFO_V1(outbox_consumer_name_check);
PG_FUNCTION_INFO_V1(outbox_inbox_checked);

/* pg_outbox.today, read by outbox.inbox_today() in SQL */
static char *pg_outbox_today = NULL;

/* pg_outbox.today is empty or a valid date written YYYY-MM-DD. */
static bool
OutboxCheckToday(char **newval, void **extra, GucSource source)
{
	const char *v = *newval;
	int			i;
	int			year,
				month,
				day,
				y,
				m,
				d;

	if (v == NULL || v[0] == '\0')
		return true;
	for (i = 0; i < 10; i++)
		if (i == 4 || i == 7 ? v[i] != '-' : !isdigit((unsigned char) v[i]))
			break;
	if (i < 10 || v[10] != '\0')
	{
		GUC_check_errdetail("pg_outbox.today is a date written YYYY-MM-DD, or empty.");
		return false;
	}
	year = atoi(v);
	month = atoi(v + 5);
	day = atoi(v + 8);
	/* A day that does not exist comes back from the Julian day as another. */
	j2date(date2j(year, month, day), &y, &m, &d);
	if (month < 1 || month > 12 || day < 1 || y != year || m != month || d != day)
	{
		GUC_check_errdetail("%s is not a day of the calendar.", v);
		return false;
	}
	return true;
}

/* Defines pg_outbox.today; called once from _PG_init. */
void
OutboxInboxInit(void)
{
	DefineCustomStringVariable("pg_outbox.today",
							   "The day (UTC) inbox maintenance takes as today.",
							   "For tests that run maintenance across days; empty: the real date.",
							   &pg_outbox_today,
							   "",
							   PGC_SUSET,
							   0,
							   OutboxCheckToday, NULL, NULL);
}

/* The SQL body an entry point calls after its check. */
typedef struct InboxBody
{
	FmgrInfo	flinfo;
	bool		by_dead_letter; /* first argument: a dead letter id */
} InboxBody;

/*
 * Refuses a consumer name that no consumer can have: NULL, empty, over
 * the limit, or with control characters. The one definition of the rules;
 * outbox.consumers' check constraint repeats them.
 */
static void
OutboxCheckConsumerName(FunctionCallInfo fcinfo, int arg)
{
	text	   *t;
	const char *s;
	int			len;

	if (PG_ARGISNULL(arg))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("consumer must not be null")));
	t = PG_GETARG_TEXT_PP(arg);
	s = VARDATA_ANY(t);
	len = VARSIZE_ANY_EXHDR(t);
	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("consumer must not be empty")));
	if (len > OUTBOX_MAX_CONSUMER_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("consumer name is too long"),
				 errdetail("The name is %d bytes; the limit is %d bytes.", len, OUTBOX_MAX_CONSUMER_LEN)));
	for (int i = 0; i < len; i++)
	{
		unsigned char c = (unsigned char) s[i];

		if (c < 0x20 || c == 0x7f)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("consumer name must not contain control characters"),
					 errdetail("Byte %d of the name is 0x%02x.", i + 1, c)));
	}
}

/*
 * The owner of a registered consumer, read through outbox.consumers'
 * primary key with the statement's snapshot; false when not registered.
 * The name column is of collation "C", the collation of the scan key.
 */
static bool
OutboxConsumerOwner(text *name, Oid *owner)
{
	Relation	rel = table_open(OutboxRelid("consumers"), AccessShareLock);
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tuple;
	bool		found = false;

	ScanKeyInit(&key, CONSUMERS_NAME, BTEqualStrategyNumber, F_TEXTEQ, PointerGetDatum(name));
	scan = systable_beginscan(rel, OutboxRelid("consumers_pkey"), true, GetActiveSnapshot(), 1, &key);
	tuple = systable_getnext(scan);
	if (HeapTupleIsValid(tuple))
	{
		bool		isnull;

		*owner = DatumGetObjectId(heap_getattr(tuple, CONSUMERS_OWNER, RelationGetDescr(rel), &isnull));
		found = !isnull;
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return found;
}

/* The consumer of a dead letter, as a text datum; errors when none. */
static text *
OutboxDeadLetterConsumer(int64 id)
{
	Relation	rel = table_open(OutboxRelid("dead_letters"), AccessShareLock);
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tuple;
	text	   *consumer = NULL;

	ScanKeyInit(&key, DEAD_LETTERS_ID, BTEqualStrategyNumber, F_INT8EQ, Int64GetDatum(id));
	scan = systable_beginscan(rel, OutboxRelid("dead_letters_pkey"), true, GetActiveSnapshot(), 1, &key);
	tuple = systable_getnext(scan);
	if (HeapTupleIsValid(tuple))
	{
		bool		isnull;
		Datum		d = heap_getattr(tuple, DEAD_LETTERS_CONSUMER, RelationGetDescr(rel), &isnull);

		if (!isnull)
			consumer = DatumGetTextPCopy(d);
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	if (consumer == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("dead letter " INT64_FORMAT " does not exist", id)));
	return consumer;
}

/*
 * Errors unless the current user may act for the consumer: a member of
 * the role that owns it, or of outbox_admin (superusers are members of
 * every role).
 */
static void
OutboxCheckConsumerAccess(text *name)
{
	char	   *cname = text_to_cstring(name);
	Oid			owner;
	Oid			admin = get_role_oid("outbox_admin", true);

	if (!OutboxConsumerOwner(name, &owner))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("consumer \"%s\" is not registered", cname),
				 errhint("An outbox_admin registers it with inbox_consumer_create(), naming the role whose members may act for it.")));
	if (OidIsValid(admin) && is_member_of_role(GetUserId(), admin))
		return;
	if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(owner)))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("consumer \"%s\" has no owner", cname),
				 errdetail("The role that owned it (OID %u) was dropped.", owner),
				 errhint("An outbox_admin gives it an owner with inbox_consumer_set_owner().")));
	if (!is_member_of_role(GetUserId(), owner))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied for consumer \"%s\"", cname),
				 errdetail("Role \"%s\" is not a member of the role that owns the consumer.",
						   GetUserNameFromId(GetUserId(), false)),
				 errhint("Act for it as a member of its owner, or have an outbox_admin register a consumer of your own with inbox_consumer_create().")));
}

/*
 * outbox.consumer_name_check(consumer text): errors when no consumer can
 * have the name.
 */
Datum
outbox_consumer_name_check(PG_FUNCTION_ARGS)
{
	OutboxCheckConsumerName(fcinfo, 0);
	PG_RETURN_VOID();
}

/*
 * Errors unless argument "arg" of a call names a consumer the current user
 * may act for.
 */
void
OutboxCheckConsumer(FunctionCallInfo fcinfo, int arg)
{
	OutboxCheckConsumerName(fcinfo, arg);
	OutboxCheckConsumerAccess(PG_GETARG_TEXT_PP(arg));
}

/*
 * inbox_consumer_check(consumer text): errors unless the current user may
 * act for the consumer.
 */
Datum
outbox_inbox_consumer_check(PG_FUNCTION_ARGS)
{
	OutboxCheckConsumer(fcinfo, 0);
	PG_RETURN_VOID();
}

/* Finds (once per call site) the SQL body of the calling entry point. */
static InboxBody *
OutboxInboxBody(FunctionCallInfo fcinfo)
{
	InboxBody  *body = (InboxBody *) fcinfo->flinfo->fn_extra;
	HeapTuple	proc;
	Form_pg_proc form;
	Oid		   *types;
	char	  **names;
	char	   *modes;
	List	   *qualified;
	Oid			target;

	if (body != NULL)
		return body;
	proc = SearchSysCache1(PROCOID, ObjectIdGetDatum(fcinfo->flinfo->fn_oid));
	if (!HeapTupleIsValid(proc))
		elog(ERROR, "cache lookup failed for function %u", fcinfo->flinfo->fn_oid);
	form = (Form_pg_proc) GETSTRUCT(proc);
	qualified = list_make2(makeString(OUTBOX_SCHEMA),
						   makeString(psprintf("%s_unchecked", NameStr(form->proname))));
	target = LookupFuncName(qualified, form->pronargs, form->proargtypes.values, false);
	(void) get_func_arg_info(proc, &types, &names, &modes);

	body = MemoryContextAllocZero(fcinfo->flinfo->fn_mcxt, sizeof(InboxBody));
	fmgr_info_cxt(target, &body->flinfo, fcinfo->flinfo->fn_mcxt);
	body->by_dead_letter = names != NULL && strcmp(names[0], "dead_letter_id") == 0;
	ReleaseSysCache(proc);
	fcinfo->flinfo->fn_extra = body;
	return body;
}

/*
 * The entry point of the inbox functions that name a consumer (first
 * argument "consumer") or a dead letter (first argument "dead_letter_id"):
 * checks that the caller may act for that consumer, then calls the
 * function's body outbox.<name>_unchecked with the same arguments.
 */
Datum
outbox_inbox_checked(PG_FUNCTION_ARGS)
{
	InboxBody  *body = OutboxInboxBody(fcinfo);
	LOCAL_FCINFO(call, FUNC_MAX_ARGS);
	Datum		result;

	if (body->by_dead_letter)
	{
		if (PG_ARGISNULL(0))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("dead_letter_id must not be null")));
		OutboxCheckConsumerAccess(OutboxDeadLetterConsumer(PG_GETARG_INT64(0)));
	}
	else
		OutboxCheckConsumer(fcinfo, 0);

	InitFunctionCallInfoData(*call, &body->flinfo, PG_NARGS(), PG_GET_COLLATION(),
							 fcinfo->context, fcinfo->resultinfo);
	for (int i = 0; i < PG_NARGS(); i++)
		call->args[i] = fcinfo->args[i];
	result = FunctionCallInvoke(call);
	fcinfo->isnull = call->isnull;
	return result;
}
