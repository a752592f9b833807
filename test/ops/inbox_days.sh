#!/usr/bin/env bash
# A consumer-only database (the inbox, no events) maintained across
# simulated days (pg_outbox.today): each day's maintenance keeps partitions
# three days ahead, moves rows that landed in the default partition into
# partitions of their days (also far ahead: maintenance never wedges on
# them), and drops the partitions past inbox_retention.
#
# Runs against the server in PG*, with the engine PG_OUTBOX_ENGINE names
# (tap.bash); prints one "ok" / "not ok" line per
# check and exits non-zero if any failed.
set -uo pipefail

. "$(dirname "$0")/tap.bash"
q() { psql -X -q -At -v ON_ERROR_STOP=1 -d ledger "$@"; }

createdb ledger
q -c "CREATE EXTENSION $EXT" -c "UPDATE outbox.config SET inbox_retention = '2 days'" >/dev/null
start=$(q -c "SELECT (now() AT TIME ZONE 'UTC')::date + 10")

# Days of the inbox partitions, as offsets from the first simulated day.
days() {
	q -c "SELECT string_agg((to_date(substr(c.relname, 7), 'YYYYMMDD') - '$start'::date)::text, ',' ORDER BY c.relname)
	        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
	       WHERE i.inhparent = 'outbox.inbox'::regclass AND c.relname ~ '^inbox_[0-9]{8}$'
	         AND to_date(substr(c.relname, 7), 'YYYYMMDD') >= '$start'::date - 5"
}
# An apply on a simulated day: the row lands where that day's rows go.
applied_on() {
	q -c "INSERT INTO outbox.inbox (consumer, event_id, payload, applied_at)
	      VALUES ('ledger', gen_random_uuid(), '{}', ('$start'::date + $1)::timestamp AT TIME ZONE 'UTC' + interval '12 hours')"
}
# Maintenance on a simulated day; again while the background run of the
# real day holds the maintenance lock (the run is then skipped).
maintain_on() {
	local i
	for i in $(seq 1 100); do
		[ "$(q -c "SET pg_outbox.today = '$(q -c "SELECT '$start'::date + $1")'" \
			-c "SELECT count(*) FROM outbox_maintain() WHERE action = 'skipped'")" = 0 ] && return
		sleep 0.1
	done
}

# Before any maintenance of these days, applies land in the default partition.
applied_on 0
applied_on 1
applied_on 30
check "applies before maintenance land in the default partition" eq "$(q -c "SELECT count(*) FROM outbox.inbox_default")" 3
maintain_on 0
check "day 0: rows moved out of the default partition" eq "$(q -c "SELECT count(*) FROM outbox.inbox_default")" 0
check "day 0: partitions for days 0..3 and for the row of day 30" eq "$(days)" "0,1,2,3,30"
check "day 0: no row lost" eq "$(q -c "SELECT count(*) FROM outbox.inbox")" 3
for d in 1 2 3 4 5 6; do
	applied_on "$d"
	maintain_on "$d"
done
check "day 6: partitions ahead, those past retention (2 days) dropped" eq "$(days)" "4,5,6,7,8,9,30"
check "day 6: the default partition stays empty" eq "$(q -c "SELECT count(*) FROM outbox.inbox_default")" 0
check "day 6: the rows of the days kept are there" eq "$(q -c "SELECT count(*) FROM outbox.inbox")" 4
# The C engine's pg_outbox.today is a parameter of pg_outbox.so, which
# refuses what is no day in YYYY-MM-DD when it is set; the SQL engine's is
# a placeholder, read as a date.
if [ "$ENGINE" = c ]; then
	for bad in tomorrow 2026-13-01 2026-02-30 2026-1-1 "2026-01-01 " "2026-01-01x"; do
		check "pg_outbox.today = '$bad' is refused" bash -c "! psql -X -q -d ledger -c \"SET pg_outbox.today = '$bad'\" 2>/dev/null"
	done
fi
check "pg_outbox.today = '2028-02-29' is a day" psql -X -q -d ledger -c "SET pg_outbox.today = '2028-02-29'"

finish
