#!/usr/bin/env bash
# The SQL reference cannot drift from the catalog: every function of
# pg_outbox's API (the extension's members in its schema, and those in
# schema outbox that docs/sql-reference.md names) has its signature line in
# a fenced sql block of docs/sql-reference.md, and every signature line
# there is, after spacing and the casts PostgreSQL prints in defaults, what
# pg_get_function_arguments() and pg_get_function_result() print for it.
# Run on a throwaway cluster, for each engine (both have one API).
#
# A signature line starts a line of a ```sql block with the function's
# name and "(", and runs to the line before the next such line or the
# block's end: "name(args) RETURNS type" or "... RETURNS TABLE (...)".
# Prints "ok"/"not ok" lines and "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
. test/ops/tap.bash

throwaway_workspace docs_signatures
trap 'stop_servers; rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM
pg_start "$WORK/pg" "$PG_PORT" || exit 1
psql_do() { psql -X -q -v ON_ERROR_STOP=1 -At -h 127.0.0.1 -p "$PG_PORT" -U postgres "$@"; }

# name<TAB>signature, one line per documented signature, normalized.
normalize='
import re, sys
def norm(s):
    s = re.sub(r"\s+", " ", s).strip()
    s = re.sub(r"(DEFAULT (?:NULL|\x27[^\x27]*\x27|[-0-9.]+|true|false))::[a-z ]+(\[\])?", r"\1", s)
    s = s.replace("timestamp with time zone", "timestamptz")
    s = s.replace("TABLE(", "TABLE (").replace("( ", "(").replace(" )", ")")
    return s
'
/usr/bin/python3 - docs/sql-reference.md >"$WORK/documented" <<PY
$normalize
lines = open(sys.argv[1], encoding="utf-8").read().split("\n")
sql, cur = False, None
def flush():
    global cur
    if cur:
        text = norm(" ".join(cur))
        print(text.split("(", 1)[0] + "\t" + text)
    cur = None
for l in lines:
    if l.startswith("\`\`\`"):
        flush()
        sql = (not sql) and l.strip() == "\`\`\`sql"
        continue
    if not sql:
        continue
    if re.match(r"^[a-z_]+\.?[a-z_]*\(", l) and not l.startswith(("SELECT", "CREATE", "GRANT")):
        flush()
        cur = [l]
    elif cur is not None and l.strip() and not re.match(r"^(SELECT|CREATE|GRANT|--)", l):
        cur.append(l)
    else:
        flush()
flush()
PY

for ext in pg_outbox pg_outbox_sql; do
	db=sig_${ext}
	psql_do -d postgres -c "CREATE DATABASE $db" >/dev/null
	psql_do -d "$db" -c "CREATE EXTENSION $ext" >/dev/null
	# The API: the extension's functions in its own schema, and those of
	# schema outbox the reference names.
	psql_do -d "$db" -F $'\t' >"$WORK/catalog.raw" <<'SQL'
SELECT CASE WHEN n.nspname = 'outbox' THEN 'outbox.' ELSE '' END || p.proname,
       CASE WHEN n.nspname = 'outbox' THEN 'outbox.' ELSE '' END || p.proname
       || '(' || pg_catalog.pg_get_function_arguments(p.oid) || ') RETURNS '
       || pg_catalog.pg_get_function_result(p.oid)
  FROM pg_catalog.pg_proc p
  JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
  JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass
       AND d.objid = p.oid AND d.deptype = 'e'
  JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid
 WHERE e.extname OPERATOR(pg_catalog.=) ANY (ARRAY['pg_outbox', 'pg_outbox_sql'])
 ORDER BY 1, 2
SQL
	/usr/bin/python3 - "$WORK/catalog.raw" "$WORK/documented" >"$WORK/report" <<PY
$normalize
catalog = {}
for l in open(sys.argv[1], encoding="utf-8"):
    name, sig = l.rstrip("\n").split("\t", 1)
    catalog.setdefault(name, set()).add(norm(sig))
documented = {}
for l in open(sys.argv[2], encoding="utf-8"):
    name, sig = l.rstrip("\n").split("\t", 1)
    documented.setdefault(name, set()).add(sig)
for name in sorted(catalog):
    if name.startswith("outbox.") and name not in documented:
        continue   # internals of schema outbox the reference does not name
    if name not in documented:
        for sig in sorted(catalog[name]):
            print(f"{name}: not in docs/sql-reference.md: {sig}")
        continue
    for sig in sorted(catalog[name] - documented[name]):
        print(f"{name}: the catalog has   {sig}")
    for sig in sorted(documented[name] - catalog[name]):
        print(f"{name}: the reference has {sig}")
for name in sorted(set(documented) - set(catalog)):
    print(f"{name}: documented, but no such function")
PY
	documented_all() { [ ! -s "$WORK/report" ] || { sed 's/^/# /' "$WORK/report" >&2; return 1; }; }
	check "$ext: docs/sql-reference.md gives every API function's signature as the catalog does" documented_all
done
finish
