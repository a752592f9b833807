# Puts an engine's functions into the install parts. pg_outbox has two
# engines behind one API: C (extension/, pg_outbox.so) and SQL (SQL and
# PL/pgSQL only, for servers where no C extension may be installed). A part
# of sql/install/ defines what both engines share; where a function is the
# engine's own, the part has a line
#
#   -- @engine NAME@
#
# and each engine has the file sql/engine/<engine>/NAME.sql, with the same
# functions under the same signatures, volatility, strictness, parallel
# safety and security. make runs
#
#   awk -v engine=sql -v version=0.2.0 -f sql/engine.awk sql/install/*.sql
#
# and gets the parts with each such line replaced by that engine's file,
# "@extversion@" in it replaced by the version.
# It fails when a file is missing, so an engine cannot lack a part.
BEGIN {
	if (engine == "") {
		print "sql/engine.awk: engine is not set (-v engine=c or -v engine=sql)" > "/dev/stderr"
		exit 1
	}
}

/^-- @engine [a-z0-9_]+@$/ {
	name = $3
	sub(/@$/, "", name)
	file = "sql/engine/" engine "/" name ".sql"
	n = 0
	while ((got = (getline line < file)) > 0) {
		gsub(/@extversion@/, version, line)
		print line
		n++
	}
	if (got < 0 || n == 0) {
		printf "%s:%d: %s is missing or empty\n", FILENAME, FNR, file > "/dev/stderr"
		exit 1
	}
	close(file)
	next
}

{ print }
