#!/usr/bin/env bash
# Background maintenance of many databases: the launcher runs them in
# turn, so that when a round of runs outlasts pg_outbox.maintenance_interval
# every database still runs once per round (none starves at the tail of
# pg_database); outbox_maintenance_databases() shows each database's last
# run; a reloaded interval applies at once, not after the wait armed with
# the old one.
#
# Nothing here asserts a duration: progress is read from the run counters
# that outbox_maintenance_databases() returns, polled with deadlines far
# longer than the runs need and far shorter than what a wrong schedule
# would take (an hour).
#
# Runs against the server in PG* (pg_outbox preloaded); prints one "ok" /
# "not ok" line per check and exits non-zero if any failed.
set -uo pipefail

. "$(dirname "$0")/tap.bash"
q() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$@"; }

dbs=16
names=$(seq -f 'maint%02g' 1 "$dbs")
# The databases of this test, as an SQL list.
in_list="($(printf "'%s'," $names | sed 's/,$//'))"

# Waits until an SQL condition holds in database m01, polling every 0.2 s
# for at most "limit" seconds: until SECONDS SQL.
until_true() {
	local limit=$1 sql=$2 i
	for i in $(seq 1 $((limit * 5))); do
		[ "$(q maint01 -c "$sql" 2>/dev/null)" = t ] && return 0
		sleep 0.2
	done
	echo "# not true after ${limit}s: $sql" >&2
	return 1
}

# The run counters of this test's databases: "name=runs ...".
runs() {
	q maint01 -c "SELECT string_agg(database || '=' || runs, ' ' ORDER BY database)
	                FROM outbox_maintenance_databases() WHERE database IN $in_list"
}

# The runs started since "runs" printed $1, of each database: "name=delta ...".
since() {
	q maint01 -c "SELECT string_agg(m.database || '=' || (m.runs - b.runs), ' ' ORDER BY m.database)
	                FROM outbox_maintenance_databases() m
	                JOIN (SELECT split_part(x, '=', 1) AS database, split_part(x, '=', 2)::bigint AS runs
	                        FROM unnest(string_to_array('$1', ' ')) x) b ON b.database = m.database"
}

# Sets the interval and reloads the configuration.
interval() {
	q postgres -c "ALTER SYSTEM SET pg_outbox.maintenance_interval = '$1'" -c "SELECT pg_reload_conf()" >/dev/null
}

# An hour: after its first run, a database is not due again during the test.
interval 1h
for d in $names; do
	createdb "$d"
	q "$d" -c "CREATE EXTENSION pg_outbox" >/dev/null
done
# Each install woke the launcher: every database ran once, at once.
check "each install starts a run in its database at once" \
	until_true 120 "SELECT count(*) = $dbs AND bool_and(runs >= 1 AND last_outcome = 'ok')
	                  FROM outbox_maintenance_databases() WHERE database IN $in_list"
check "the run is the database's outbox_maintain() (outbox_maintenance_status() there)" \
	eq "$(q maint07 -c "SELECT last_finished_at IS NOT NULL FROM outbox_maintenance_status()")" t
check "a database without the extension is listed as such" \
	eq "$(q maint01 -c "SELECT last_outcome FROM outbox_maintenance_databases() WHERE database = 'postgres'")" "not installed"
check "a finished run has both times, the end after the start" \
	eq "$(q maint01 -c "SELECT bool_and(last_finished_at >= last_started_at) FROM outbox_maintenance_databases()
	                     WHERE database IN $in_list")" t

# Access: outbox_admin reads it, a role without a grant does not. The
# roles act through the superuser's connection (the role setting), since
# a throwaway cluster may give only the superuser a password.
q postgres -c "CREATE ROLE maint_admin IN ROLE outbox_admin" -c "CREATE ROLE maint_nobody" >/dev/null
check "outbox_admin reads outbox_maintenance_databases()" \
	eq "$(PGOPTIONS="-c role=maint_admin" psql -X -q -At -d maint01 -c "SELECT count(*) >= $dbs FROM outbox_maintenance_databases()")" t
check "a role without outbox_admin is refused (42501)" \
	eq "$(PGOPTIONS="-c role=maint_nobody" psql -X -q -At -d maint01 -v VERBOSITY=sqlstate -c "SELECT * FROM outbox_maintenance_databases()" 2>&1)" \
	"ERROR:  42501"

# With an hour's interval nothing runs again.
before=$(runs)
sleep 2
check "with a 1 h interval no database runs again" eq "$(runs)" "$before"

# A reload with a shorter interval applies at once: the launcher's wait
# was armed for an hour.
interval 100ms
check "a reloaded shorter interval applies at once, not after the old wait (1 h)" \
	until_true 60 "SELECT count(*) = $dbs FROM outbox_maintenance_databases() m
	                JOIN (SELECT split_part(x, '=', 1) AS database, split_part(x, '=', 2)::bigint AS runs
	                        FROM unnest(string_to_array('$before', ' ')) x) b ON b.database = m.database
	               WHERE m.runs > b.runs"

# Fairness: 16 databases, two runs at a time, 100 ms between a database's
# runs: a round of all of them takes longer than the interval, so every
# database is due all the time. In three rounds' worth of runs (48 runs
# started, counted by the launcher), each database must have run; a
# launcher that restarted from the head of pg_database each interval ran
# the first ones only.
before=$(runs)
check "three rounds' worth of runs start" \
	until_true 180 "SELECT sum(m.runs - b.runs) >= 3 * $dbs FROM outbox_maintenance_databases() m
	                  JOIN (SELECT split_part(x, '=', 1) AS database, split_part(x, '=', 2)::bigint AS runs
	                          FROM unnest(string_to_array('$before', ' ')) x) b ON b.database = m.database"
deltas=$(since "$before")
echo "# runs per database in three rounds: $deltas"
check "within three rounds every database ran, none starved" \
	bash -c "! grep -qE '=0( |\$)' <<<'$deltas'"
check "within three rounds no database ran more than twice as often as another" \
	bash -c "min=\$(tr ' ' '\n' <<<'$deltas' | cut -d= -f2 | sort -n | head -1);
	         max=\$(tr ' ' '\n' <<<'$deltas' | cut -d= -f2 | sort -n | tail -1);
	         [ \"\$max\" -le \$((2 * min)) ] || { echo \"# min \$min, max \$max\" >&2; exit 1; }"

# How a run went: off where background maintenance is off, failed where
# outbox_maintain() raises (it writes, and the database's transactions are
# read-only), ok again once that is undone.
q postgres -c "ALTER DATABASE maint14 SET pg_outbox.background_maintenance = off" \
	-c "ALTER DATABASE maint15 SET default_transaction_read_only = on" >/dev/null
check "a run where background maintenance is off says so" \
	until_true 60 "SELECT last_outcome = 'off' FROM outbox_maintenance_databases() WHERE database = 'maint14'"
check "a run that failed says so, with the time it ended" \
	until_true 60 "SELECT last_outcome = 'failed' AND last_finished_at IS NOT NULL
	                 FROM outbox_maintenance_databases() WHERE database = 'maint15'"
q postgres -c "ALTER DATABASE maint14 RESET pg_outbox.background_maintenance" \
	-c "ALTER DATABASE maint15 RESET default_transaction_read_only" >/dev/null
check "the next runs are ok again" \
	until_true 60 "SELECT bool_and(last_outcome = 'ok') FROM outbox_maintenance_databases()
	                WHERE database IN ('maint14', 'maint15')"

# A dropped database leaves the list.
q postgres -c "DROP DATABASE maint16 WITH (FORCE)" >/dev/null
check "a dropped database leaves the list" \
	until_true 60 "SELECT NOT EXISTS (SELECT 1 FROM outbox_maintenance_databases() WHERE database = 'maint16')"

interval 1h
finish
