/*-------------------------------------------------------------------------
 *
 * pg_outbox.c
 *	  Module entry point and settings of the pg_outbox extension.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "utils/datetime.h"
#include "utils/guc.h"

#include "commit.h"
#include "pg_outbox.h"
#include "wakeup.h"
#include "writer.h"
#include "xact.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

int			pg_outbox_max_payload_size = OUTBOX_DEFAULT_MAX_PAYLOAD_SIZE;

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

/* Defines the settings and initialises each subsystem. */
void
_PG_init(void)
{
	DefineCustomIntVariable("pg_outbox.max_payload_size",
							"Largest event payload outbox_emit() accepts.",
							"The size of the payload as stored (jsonb), in bytes.",
							&pg_outbox_max_payload_size,
							OUTBOX_DEFAULT_MAX_PAYLOAD_SIZE,
							OUTBOX_MIN_MAX_PAYLOAD_SIZE,
							OUTBOX_MAX_MAX_PAYLOAD_SIZE,
							PGC_SUSET,
							GUC_UNIT_BYTE,
							NULL, NULL, NULL);

	DefineCustomStringVariable("pg_outbox.today",
							   "The day (UTC) inbox maintenance takes as today.",
							   "For tests that run maintenance across days; empty: the real date.",
							   &pg_outbox_today,
							   "",
							   PGC_SUSET,
							   0,
							   OutboxCheckToday, NULL, NULL);

	OutboxWorkerInit();
	OutboxCommitInit();
	OutboxWriterInit();
	OutboxXactInit();
	OutboxWakeupInit();

	/* After every part defined its settings: their placeholders are adopted. */
	MarkGUCPrefixReserved("pg_outbox");
}
