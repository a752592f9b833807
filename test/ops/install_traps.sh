#!/usr/bin/env bash
# Install traps (I-17): the install and upgrade scripts, and everything the
# extension runs as its owner, must resolve no operator or function
# through a schema that a less privileged role can write.
#
# A non-superuser that owns the database (and so "public", through
# pg_database_owner), or a schema named in CREATE EXTENSION ... SCHEMA,
# plants a trap for every operator and every function name that the
# install script, the upgrade script and the functions' bodies use: the
# names are extracted from the scripts' text (all of it: bodies, dynamic
# SQL in format strings, comments, which only adds traps), not listed by
# hand. For each name, a trap is planted for every argument type
# combination over the types the scripts name (and their arrays) that
# pg_catalog's operator or function of that name accepts through implicit
# casts: a trap whose argument types are exactly those of a reference
# wins wherever pg_catalog's is not an exact match (resolution takes an
# exact match first, then the candidate with the most exact arguments),
# and one with pg_catalog's own argument types wins wherever the reference
# is resolved with the planted schema before pg_catalog. Variadic "any"
# functions (format, concat...) get every combination of one or two
# variadic arguments and up to four of one type. Each trap is IMMUTABLE
# (so that it is accepted in a generated column), records who ran it,
# warns, and makes its planter a superuser when a superuser ran it.
#
# Then, with the traps in place: CREATE EXTENSION into public; CREATE
# EXTENSION ... SCHEMA owned by the database owner (traps in both
# schemas); ALTER EXTENSION UPDATE from every released version (traps
# planted after the old version's install); and every function of the
# extension's schema is called, with maintenance run by hand and by the
# background worker. The attacker also sets the database's search_path
# with its schema before pg_catalog (ALTER DATABASE ... SET), which every
# session that sets none of its own gets: the worker's, and the consumer's
# calls here. No trap may fire. A schema owned by another role is refused,
# on install and on update.
#
# The engine is the one PG_OUTBOX_ENGINE names (tap.bash): the C engine
# (preloaded) by default, or the SQL engine (whose functions' bodies are
# its own files, sql/engine/sql/, so the traps cover them too), which has
# no released version to update from.
#
# Runs against the server in PG* (as a superuser); prints one "ok" /
# "not ok" line per check and exits non-zero if any failed.
set -uo pipefail

. "$(dirname "$0")/tap.bash"
root=$(cd "$(dirname "$0")/../.." && pwd)
q() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$@"; }
# The test's own queries resolve in pg_catalog alone: the traps are for the
# extension, not for them.
qs() { PGOPTIONS='-c search_path=pg_catalog,pg_temp -c client_min_messages=warning' psql -X -q -At -v ON_ERROR_STOP=1 -d "$@"; }
# The same as another role: as_role ROLE DB [psql argument...]. The session
# is the superuser's (pg_virtualenv gives only it a password); every
# privilege check is the role's.
as_role() {
	local role=$1
	shift
	PGOPTIONS="-c search_path=pg_catalog,pg_temp -c client_min_messages=warning -c role=$role" \
		psql -X -q -At -v ON_ERROR_STOP=1 -d "$@"
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

current=$(sed -n "s/^default_version[[:space:]]*=[[:space:]]*'\([^']*\)'.*/\1/p" "$root/pg_outbox.control")
# The sources of the install and upgrade scripts (an upgrade script is its
# hand part and the install parts' functions).
scripts=("$root"/sql/preamble.sql "$root"/sql/install/*.sql "$root"/sql/engine/"$ENGINE"/*.sql "$root"/sql/upgrade/*.sql)
# The released versions' install scripts (ALTER EXTENSION UPDATE from each).
released=()
[ "$ENGINE" != c ] || released=("$root"/sql/released/pg_outbox--*.sql)

# The names, one per line. Operators: every run of operator characters, as
# PostgreSQL's lexer splits it (a multi-character operator ends in + or -
# only if it has one of ~!@#%^&|`?), each with its substrings, plus those
# that keywords stand for (LIKE, ILIKE, BETWEEN, IN, CASE, IS DISTINCT
# FROM, NULLIF, SIMILAR TO). Functions: every identifier before "(",
# qualified or not, except the extension's own (outbox.*, @extschema@.*).
perl -0777 -ne '
	my %seen;
	while (/([-+*\/<>=~!@#%^&|`?]+)/g) {
		my $t = $1;
		my @parts = ($t);
		while (length($t) > 1 && $t =~ /[-+]$/ && $t !~ /[~!@#%^&|`?]/) { chop $t; push @parts, $t; }
		for my $p (@parts) {
			for my $i (0 .. length($p) - 1) {
				for my $l (1 .. 3) { $seen{substr($p, $i, $l)} = 1 if $i + $l <= length($p); }
			}
		}
	}
	if (/\bLIKE\b/i) { $seen{$_} = 1 for qw(~~ !~~ ~~* !~~*); }
	if (/\b(BETWEEN|IN|CASE|DISTINCT|NULLIF)\b/i) { $seen{$_} = 1 for qw(= <> < > <= >=); }
	if (/\bSIMILAR\b/i) { $seen{$_} = 1 for qw(~ !~); }
	print "$_\n" for sort keys %seen;
' "${scripts[@]}" >"$work/operators"
perl -0777 -ne '
	my %seen;
	while (/(?:(@?\w+@?)\s*\.\s*)?\b([A-Za-z_][A-Za-z0-9_]*)\s*\(/g) {
		next if defined $1 && ($1 eq "outbox" || $1 eq "\@extschema\@");
		$seen{lc $2} = 1;
	}
	print "$_\n" for sort keys %seen;
' "${scripts[@]}" >"$work/functions"
perl -0777 -ne '
	my %seen;
	$seen{lc $1} = 1 while /\b([A-Za-z_][A-Za-z0-9_]*)\b/g;
	print "$_\n" for sort keys %seen;
' "${scripts[@]}" >"$work/words"

# Roles: the attacker owns the databases; another role owns a schema it
# is refused to install in. Both can log in (trust authentication).
for db in fresh inschema plain refused $(qs postgres -c "SELECT datname FROM pg_database WHERE datname LIKE 'up\_%'"); do
	dropdb --if-exists "$db" 2>/dev/null
done
qs postgres >/dev/null <<'SQL'
DO $$ BEGIN
	IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'trapper') THEN CREATE ROLE trapper LOGIN; END IF;
	IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'bystander') THEN CREATE ROLE bystander LOGIN; END IF;
END $$;
ALTER ROLE trapper NOSUPERUSER;
SQL

# The traps, worked out once (in database postgres, from pg_catalog) as
# one statement a line, with @S@ for the schema they are planted in.
qs postgres -v ops="$(paste -sd ' ' "$work/operators")" -v funcs="$(paste -sd ' ' "$work/functions")" \
	-v words="$(paste -sd ' ' "$work/words")" >"$work/traps.sql" 2>"$work/traps.err" <<'SQL'
CREATE TEMP TABLE names AS SELECT string_to_array(:'ops', ' ') AS ops, string_to_array(:'funcs', ' ') AS funcs;

-- The types the traps take: every base type of pg_catalog that the
-- scripts name (and the usual ones), with their array types.
CREATE TEMP TABLE universe AS
	WITH named AS (
		SELECT t.oid, t.typarray FROM pg_type t
		 WHERE t.typnamespace = 'pg_catalog'::regnamespace AND t.typtype = 'b' AND t.typisdefined
		   AND t.typname !~ '^_' AND t.typname NOT IN ('unknown', 'cstring', 'internal')
		   AND (t.typname = ANY (string_to_array(:'words', ' '))
				OR format_type(t.oid, NULL) = ANY (string_to_array(:'words', ' '))
				OR t.typname IN ('int2', 'int4', 'int8', 'numeric', 'text', 'name', 'bool', 'oid', 'float8', 'varchar', 'bpchar', 'char')))
	SELECT oid, false AS isarray FROM named UNION SELECT typarray, true FROM named WHERE typarray <> 0;

-- The operators and functions of those names in pg_catalog.
CREATE TEMP TABLE ops AS
	SELECT x.oprname, x.oprkind, x.oprleft, x.oprright FROM pg_operator x
	 WHERE x.oprname::text = ANY ((SELECT ops FROM names)::text[]) AND x.oprnamespace = 'pg_catalog'::regnamespace AND x.oprkind IN ('b', 'l');
CREATE TEMP TABLE procs AS
	SELECT x.proname, x.prokind, x.proretset, x.pronargs, x.provariadic, string_to_array(x.proargtypes::text, ' ')::oid[] AS argtypes FROM pg_proc x
	 WHERE x.proname::text = ANY ((SELECT funcs FROM names)::text[]) AND x.pronamespace = 'pg_catalog'::regnamespace
	   AND x.prokind IN ('f', 'a', 'w');
-- What these functions take and return is in the universe too.
INSERT INTO universe
	SELECT DISTINCT t.oid, t.typelem <> 0 AND t.typsubscript = 'array_subscript_handler'::regproc
	  FROM procs p, pg_type t
	 WHERE (t.oid = ANY (p.argtypes) OR t.oid = (SELECT x.prorettype FROM pg_proc x WHERE x.proname = p.proname LIMIT 1))
	   AND t.typtype = 'b' AND t.typisdefined AND t.oid NOT IN (SELECT oid FROM universe)
	   AND t.typname NOT IN ('unknown', 'cstring', 'internal');

-- Which type of the universe goes to which parameter type: as is, by an
-- implicit cast, or through a polymorphic parameter.
CREATE TEMP TABLE fit AS
	WITH dst AS (
		SELECT oprleft AS dst FROM ops UNION SELECT oprright FROM ops
		UNION SELECT unnest(argtypes) FROM procs
		UNION SELECT '"any"'::regtype::oid
		UNION SELECT t.typelem FROM procs p JOIN pg_type t ON t.oid = p.argtypes[p.pronargs] WHERE p.provariadic <> 0)
	SELECT u.oid AS src, d.dst FROM universe u, dst d
	 WHERE u.oid = d.dst
		OR EXISTS (SELECT 1 FROM pg_cast c WHERE c.castsource = u.oid AND c.casttarget = d.dst AND c.castcontext = 'i')
		OR d.dst IN ('anyelement'::regtype, 'anycompatible'::regtype, '"any"'::regtype)
		OR (d.dst IN ('anyarray'::regtype, 'anycompatiblearray'::regtype) AND u.isarray)
		OR (d.dst IN ('anynonarray'::regtype, 'anycompatiblenonarray'::regtype) AND NOT u.isarray);
CREATE INDEX ON fit (dst);

CREATE TEMP TABLE trap (kind text, name text, args oid[], result oid, retset boolean);

DO $plant$
DECLARE
	c record;
	res oid;
	p record;
	tuple oid[];
	k integer;
	fixed integer;
	m integer;
	args text;
BEGIN
	-- Operators: every (left, right) pair of the universe that pg_catalog's
	-- operator of that name accepts; the result type is the one
	-- pg_catalog's resolution gives.
	FOR c IN
		SELECT DISTINCT x.oprname, CASE WHEN x.oprkind = 'l' THEN 0 ELSE a.src END AS l, b.src AS r
		  FROM ops x JOIN fit b ON b.dst = x.oprright
		  LEFT JOIN fit a ON a.dst = x.oprleft AND x.oprkind = 'b'
		 WHERE x.oprkind = 'l' OR a.src IS NOT NULL
	LOOP
		BEGIN
			IF c.l = 0 THEN
				EXECUTE format('SELECT pg_typeof(OPERATOR(pg_catalog.%s) NULL::%s)::oid', c.oprname, c.r::regtype) INTO res;
			ELSE
				EXECUTE format('SELECT pg_typeof(NULL::%s OPERATOR(pg_catalog.%s) NULL::%s)::oid', c.l::regtype, c.oprname, c.r::regtype) INTO res;
			END IF;
			INSERT INTO trap VALUES ('operator', c.oprname, CASE WHEN c.l = 0 THEN ARRAY[c.r] ELSE ARRAY[c.l, c.r] END, res, false);
		EXCEPTION WHEN OTHERS THEN
			NULL;		-- pg_catalog has none for these types: nothing to win
		END;
	END LOOP;

	-- Functions and aggregates: for each of pg_catalog's signatures of the
	-- name, every combination of the universe's types that fits it.
	FOR p IN SELECT * FROM procs LOOP
		-- Arities: as declared; a variadic one also with 1 and 2 variadic
		-- arguments of any types, and 3 or 4 of one type.
		FOR m IN 0 .. CASE WHEN p.provariadic = 0 THEN 0 ELSE 4 END LOOP
			CONTINUE WHEN m = 0 AND p.provariadic = '"any"'::regtype;
			fixed := CASE WHEN p.provariadic = 0 OR m = 0 THEN p.pronargs ELSE p.pronargs - 1 END;
			k := fixed + m;
			FOR tuple IN
				WITH RECURSIVE pos(i, dst) AS (
					SELECT i, CASE WHEN i <= fixed THEN p.argtypes[i]
								   WHEN p.provariadic = '"any"'::regtype THEN '"any"'::regtype::oid
								   ELSE (SELECT typelem FROM pg_type WHERE oid = p.argtypes[p.pronargs]) END
					  FROM generate_series(1, k) i),
				combos(i, types) AS (
					SELECT 0, '{}'::oid[]
					UNION ALL
					SELECT cb.i + 1, cb.types || f.src
					  FROM combos cb JOIN pos ON pos.i = cb.i + 1
					  JOIN fit f ON f.dst = pos.dst
					  JOIN universe u ON u.oid = f.src
					 WHERE (pos.dst <> '"any"'::regtype OR NOT u.isarray)
					   AND (m <= 1 OR pos.i <= fixed + 1 OR f.src = cb.types[fixed + 1]))
				SELECT types FROM combos WHERE i = k
			LOOP
				CONTINUE WHEN EXISTS (SELECT 1 FROM trap x WHERE x.name = p.proname AND x.args = tuple);
				SELECT string_agg(format('NULL::%s', a::regtype), ', ' ORDER BY ord) INTO args
				  FROM unnest(tuple) WITH ORDINALITY AS u(a, ord);
				BEGIN
					-- The type pg_catalog's resolution gives, from the parser
					-- alone: a dead CASE arm is never run; a set-returning
					-- function (not allowed in CASE) makes a view's column; a
					-- window function runs over one row.
					IF p.proretset THEN
						EXECUTE format('CREATE TEMP VIEW probe AS SELECT pg_catalog.%I(%s) AS x', p.proname, coalesce(args, ''));
						SELECT a.atttypid INTO res FROM pg_attribute a WHERE a.attrelid = 'probe'::regclass AND a.attname = 'x';
						DROP VIEW probe;
					ELSE
						EXECUTE format(CASE WHEN p.prokind = 'w' THEN 'SELECT pg_typeof(pg_catalog.%I(%s) OVER ())::oid'
											ELSE 'SELECT pg_typeof(CASE WHEN false THEN pg_catalog.%I(%s) END)::oid' END,
									   p.proname, coalesce(args, '')) INTO res;
					END IF;
					CONTINUE WHEN res IS NULL OR res IN ('record'::regtype, 'trigger'::regtype, 'internal'::regtype, 'unknown'::regtype);
					-- A window function's trap is an aggregate: it may be used
					-- with OVER too.
					INSERT INTO trap VALUES (CASE p.prokind WHEN 'w' THEN 'a' ELSE p.prokind END, p.proname, tuple, res, p.proretset);
				EXCEPTION WHEN OTHERS THEN
					NULL;
				END;
			END LOOP;
		END LOOP;
	END LOOP;
END
$plant$;

-- One statement a line: a function per trap that records and warns (the
-- operator's function, the aggregate's transition and final functions).
WITH t AS (
	SELECT row_number() OVER () AS n, t.*,
		   (SELECT string_agg(a::regtype::text, ', ' ORDER BY ord) FROM unnest(t.args) WITH ORDINALITY AS u(a, ord)) AS params
	  FROM trap t),
s AS (
	SELECT format('%s @S@.%s(%s)', CASE kind WHEN 'operator' THEN 'operator' WHEN 'a' THEN 'aggregate' ELSE 'function' END,
					 name, coalesce(params, '')) AS what, t.*
	  FROM t)
SELECT CASE s.kind
	WHEN 'operator' THEN
		format('CREATE FUNCTION @S@.trap_op_%s(%s) RETURNS %s LANGUAGE plpgsql IMMUTABLE AS %L; ', n, params, result::regtype,
			   format('BEGIN PERFORM trapbox.fired(%L); RETURN NULL; END', what))
		|| CASE WHEN cardinality(args) = 1
				THEN format('CREATE OPERATOR @S@.%s (RIGHTARG = %s, FUNCTION = @S@.trap_op_%s);', name, args[1]::regtype, n)
				ELSE format('CREATE OPERATOR @S@.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = @S@.trap_op_%s);',
							name, args[1]::regtype, args[2]::regtype, n) END
	WHEN 'a' THEN
		format('CREATE FUNCTION @S@.trap_sfunc_%s(%s%s) RETURNS %s LANGUAGE plpgsql IMMUTABLE AS %L; ',
			   n, result::regtype, coalesce(', ' || params, ''), result::regtype,
			   format('BEGIN PERFORM trapbox.fired(%L); RETURN NULL; END', what))
		|| format('CREATE FUNCTION @S@.trap_final_%s(%s) RETURNS %s LANGUAGE plpgsql IMMUTABLE AS %L; ',
				  n, result::regtype, result::regtype, format('BEGIN PERFORM trapbox.fired(%L); RETURN NULL; END', what))
		|| format('CREATE AGGREGATE @S@.%I(%s) (SFUNC = @S@.trap_sfunc_%s, STYPE = %s, FINALFUNC = @S@.trap_final_%s);',
				  name, coalesce(params, '*'), n, result::regtype, n)
	ELSE
		format('CREATE FUNCTION @S@.%I(%s) RETURNS %s%s LANGUAGE plpgsql IMMUTABLE AS %L;',
			   name, coalesce(params, ''), CASE WHEN retset THEN 'SETOF ' ELSE '' END, result::regtype,
			   format('BEGIN PERFORM trapbox.fired(%L); RETURN%s; END', what,
					  CASE WHEN retset OR result = 'void'::regtype THEN '' ELSE ' NULL' END))
	END
  FROM s ORDER BY n;
SQL
ntraps() { grep -c "$1" "$work/traps.sql"; }
check "traps worked out for every operator and function name the scripts use" \
	test "$(ntraps 'CREATE OPERATOR')" -gt 500 -a "$(ntraps 'CREATE FUNCTION @S@\.[a-z][a-z_]*[a-z](\|CREATE AGGREGATE')" -gt 500
echo "# $(ntraps 'CREATE OPERATOR') operators, $(ntraps 'CREATE FUNCTION @S@\.[a-z][a-z_]*[a-z](') functions and" \
	"$(ntraps 'CREATE AGGREGATE') aggregates, for $(wc -l <"$work/operators") operator and $(wc -l <"$work/functions")" \
	"names before a parenthesis"
head -3 "$work/traps.err" | sed 's/^/#   /'

# The attacker's machinery in DB (a log, and the function every trap
# calls), then the traps in each schema given: plant DB SCHEMA...
plant() {
	local db=$1 s
	shift
	as_role trapper "$db" >/dev/null <<'SQL' || return 1
CREATE SCHEMA IF NOT EXISTS trapbox;
GRANT USAGE ON SCHEMA trapbox TO PUBLIC;
CREATE TABLE IF NOT EXISTS trapbox.log (trap text, ran_as name, session_as name, query text, at timestamptz DEFAULT now());
GRANT INSERT ON trapbox.log TO PUBLIC;
CREATE OR REPLACE FUNCTION trapbox.fired(what text) RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $f$
BEGIN
	INSERT INTO trapbox.log (trap, ran_as, session_as, query) VALUES (what, current_user, session_user, current_query());
	RAISE WARNING 'TRAP FIRED: % ran as %', what, current_user;
	IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
		ALTER ROLE trapper SUPERUSER;
	END IF;
END
$f$;
SQL
	for s in "$@"; do
		sed "s/@S@/$s/g" "$work/traps.sql" | as_role trapper "$db" -1 >/dev/null || return 1
	done
}

# What fired in DB, one line per trap and role ("" when none); the
# warnings the traps raised are in the clients' output, checked apart.
fired() { qs "$1" -c "SELECT string_agg(DISTINCT trap || ' as ' || ran_as, '; ') FROM trapbox.log"; }

# Calls every function of the extension's schema in DB (extension in
# SCHEMA), as a relay, a writer, a consumer and an admin would, with
# maintenance; as the superuser, with the search_path of a session of
# the database (the planted schema on it). Arguments are typed: the
# callers' own resolution is not what this checks.
exercise() {
	local db=$1 s=$2
	psql -X -q -At -v ON_ERROR_STOP=1 -d "$db" -v s="$s" -v commit_order="$COMMIT_ORDER" <<'SQL'
SET track_functions = 'all';
SET search_path = :"s", public;
SELECT outbox_group_create('x'::text, NULL::text[], 'beginning'::text, 'xid8'::text, 1::integer);
SELECT outbox_group_create('c'::text, ARRAY['t']::text[], 'beginning'::text, :'commit_order'::text, 1::integer);
SELECT outbox_group_create('sh'::text, NULL::text[], 'now'::text, 'xid8'::text, 2::integer);
SELECT outbox_group_create('sk'::text, ARRAY['skipme']::text[], 'beginning'::text, 'xid8'::text, 1::integer);
SELECT outbox_emit('skipme'::text, 'k0'::text, '{"big": 1}'::jsonb, NULL::jsonb, NULL::uuid);
SELECT outbox_emit('t'::text, 'k1'::text, '{"a": 1}'::jsonb, NULL::jsonb, NULL::uuid);
SELECT count(*) FROM outbox_emit_many('t'::text, ARRAY['k2', 'k3']::text[], ARRAY['{}', '[1.5]']::jsonb[], NULL::jsonb[], NULL::uuid[]);
SQL
	# The relay's calls, in sessions of their own (leadership is per session).
	psql -X -q -At -v ON_ERROR_STOP=1 -d "$db" -v s="$s" <<'SQL'
SET track_functions = 'all';
SET search_path = :"s", public;
SELECT outbox_lead('x'::text);
SELECT outbox_stream_template('x'::text, 'outbox:{topic}'::text);
SELECT count(*) FROM outbox_fetch('x'::text, 10::integer, NULL::text, NULL::interval);
SELECT outbox_fetch_packed('x'::text, 10::integer, NULL::text, NULL::interval) IS NOT NULL;
SELECT outbox_advance('x'::text, (SELECT max(pos) FROM outbox_fetch('x'::text, 10::integer, NULL::text, NULL::interval)), '{"s": "1-1"}'::jsonb);
SELECT outbox_rewind('x'::text, '0-0'::text) IS NOT NULL;
SELECT count(*) FROM outbox_fetch('x'::text, 10::integer, NULL::text, NULL::interval);
SELECT outbox_reanchor('x'::text) IS NOT NULL;
SELECT outbox_relay_waiting();
SELECT outbox_resign('x'::text);
SELECT count(*) FROM outbox_fetch('c'::text, 10::integer, NULL::text, NULL::interval);
SELECT outbox_advance('c'::text, (SELECT max(pos) FROM outbox_fetch('c'::text, 10::integer, NULL::text, NULL::interval)), NULL::jsonb);
SELECT count(*) FROM outbox_fetch('sh/1'::text, 10::integer, NULL::text, NULL::interval);
SELECT outbox_resign('c'::text);
SELECT outbox_skip('sk'::text, (SELECT min(f.pos) FROM outbox_fetch('sk'::text, 1::integer, NULL::text, NULL::interval) f), 'passed by the trap test'::text) IS NOT NULL;
SELECT count(*) FROM outbox_groups(NULL::text);
SELECT count(*) FROM outbox_group_stats(NULL::text);
SELECT count(*) FROM outbox.group_stats;
SELECT count(*) FROM outbox_horizon_holders();
SELECT count(*) FROM outbox.horizon_holders;
SELECT count(*) FROM outbox.feed;
SQL
	# Moving between engines, as far as a move is the database's own: every
	# group passed to the horizon (a stale one of an updated database too),
	# the state copied, the groups and the skipped event removed, and the
	# state imported back (the shard index, the inbox partitions, a
	# commit-ordered group re-anchored).
	psql -X -q -At -v ON_ERROR_STOP=1 -d "$db" -v s="$s" <<'SQL'
SET track_functions = 'all';
SET search_path = :"s", public;
BEGIN;
SELECT outbox_rewind('x'::text, 'now'::text) IS NOT NULL;
SELECT outbox_rewind('c'::text, 'now'::text) IS NOT NULL;
SELECT outbox_rewind('sh/0'::text, 'now'::text) IS NOT NULL;
SELECT outbox_rewind('sh/1'::text, 'now'::text) IS NOT NULL;
SELECT outbox_rewind('sk'::text, 'now'::text) IS NOT NULL;
SELECT pg_catalog.count(outbox_rewind(g.name, 'now'::text)) FROM outbox.groups g WHERE g.stale;
SELECT count(*) FROM outbox_export_state('trap_copy'::name);
SELECT pg_catalog.count(outbox_group_drop(g.name, false::boolean)) FROM outbox.groups g WHERE g.stale;
SELECT outbox_group_drop('x'::text, false::boolean);
SELECT outbox_group_drop('c'::text, false::boolean);
SELECT outbox_group_drop('sh'::text, false::boolean);
SELECT outbox_group_drop('sk'::text, false::boolean);
DELETE FROM outbox.skipped_events;
SELECT count(*) FROM outbox_import_state('trap_copy'::name, NULL::boolean);
DROP SCHEMA trap_copy CASCADE;
COMMIT;
SQL
	# The inbox, its dead letters, parked keys and consumers; maintenance; the admin's
	# calls: with the search_path the database's owner set for the
	# database, the planted schema before pg_catalog (inbox_consume and
	# inbox_replay run with their caller's). These statements use no
	# operator or function of their own.
	psql -X -q -At -v ON_ERROR_STOP=1 -d "$db" -v sql_engine="$([ "$ENGINE" = sql ] && echo true || echo false)" <<'SQL'
SET track_functions = 'all';
CREATE TABLE IF NOT EXISTS trap_applied (topic text, key text);
SELECT inbox_consumer_create('ledger'::text, 'outbox_consumer'::regrole);
SELECT inbox_consumer_check('ledger'::text);
SELECT inbox_apply('ledger'::text, '00000000-0000-4000-8000-000000000001'::uuid, '{"n": 1}'::jsonb);
SELECT * FROM inbox_consume('ledger'::text, 'INSERT INTO trap_applied VALUES ($1, $2)'::text,
	ARRAY['00000000-0000-4000-8000-000000000002'::bytea, 'nope'::bytea], ARRAY['t'::bytea, 't'::bytea], NULL::bytea[],
	ARRAY['{}'::bytea, '{}'::bytea], NULL::bytea[]);
SELECT * FROM inbox_consume('ledger'::text, 'INSERT INTO trap_applied VALUES ($1, $2)'::text,
	ARRAY['00000000-0000-4000-8000-000000000004'::bytea, '00000000-0000-4000-8000-000000000002'::bytea],
	ARRAY['t'::bytea, 't'::bytea], NULL::bytea[], ARRAY['{}'::bytea, '{"n": 2}'::bytea], NULL::bytea[], true::boolean);
SELECT inbox_dead_letter('ledger'::text, 'outbox:t'::text, '1-1'::text, '00000000-0000-4000-8000-000000000003'::uuid,
	't'::text, 'k'::text, '{}'::jsonb, NULL::jsonb, 'broken'::text, '22023'::text, 2::integer);
SELECT inbox_dead_letter('ledger'::text, 'outbox:t'::text, '1-2'::text,
	ARRAY['payload'::bytea, '{'::bytea], 'malformed'::text, '22P02'::text, 1::integer);
SELECT inbox_replay((SELECT d.id FROM outbox.dead_letters d ORDER BY d.id LIMIT 1), 'INSERT INTO trap_applied VALUES ($1, $2)'::text);
-- Parked keys (a payload longer than 12 characters fails the handler):
-- k5 dead at 5-1, with 6-1, 7-1 (no JSON) and 8-1 (too long) parked; k7's
-- 10-1 fails in an isolated batch and blocks 11-1, then parks it; the
-- entries and the operator's calls, each path of a drain step.
CREATE TABLE IF NOT EXISTS trap_short (topic text, key text, payload varchar(12));
SELECT * FROM inbox_park_key('ledger'::text, 'outbox:t'::text, '5-1'::text,
	ARRAY['event_id'::bytea, '00000000-0000-4000-8000-000000000005'::bytea, 'topic'::bytea, 't'::bytea, 'key'::bytea, 'k5'::bytea,
		  'payload'::bytea, '{}'::bytea], 'handler failed'::text, 'P0001'::text, 3::integer, true::boolean);
SELECT * FROM inbox_consume_keyed('ledger'::text, 'INSERT INTO trap_short VALUES ($1, $2, $3)'::text,
	ARRAY['outbox:t', 'outbox:t', 'outbox:t', 'outbox:t']::text[], ARRAY['6-1', '7-1', '8-1', '9-1']::text[],
	ARRAY['00000000-0000-4000-8000-000000000006'::bytea, '00000000-0000-4000-8000-000000000007'::bytea,
		  '00000000-0000-4000-8000-000000000008'::bytea, '00000000-0000-4000-8000-000000000009'::bytea],
	ARRAY['t'::bytea, 't'::bytea, 't'::bytea, 't'::bytea], ARRAY['k5'::bytea, 'k5'::bytea, 'k5'::bytea, 'k6'::bytea],
	ARRAY['{}'::bytea, '{'::bytea, '{"long": true}'::bytea, '{}'::bytea], NULL::bytea[], false::boolean, true::boolean);
SELECT * FROM inbox_consume_keyed('ledger'::text, 'INSERT INTO trap_short VALUES ($1, $2, $3)'::text,
	ARRAY['outbox:t', 'outbox:t', 'outbox:t']::text[], ARRAY['10-1', '11-1', '12-1']::text[],
	ARRAY['00000000-0000-4000-8000-000000000010'::bytea, '00000000-0000-4000-8000-000000000011'::bytea,
		  '00000000-0000-4000-8000-000000000012'::bytea],
	ARRAY['t'::bytea, 't'::bytea, 't'::bytea], ARRAY['k7'::bytea, 'k7'::bytea, 'k8'::bytea],
	ARRAY['{"long": true}'::bytea, '{}'::bytea, '{}'::bytea], NULL::bytea[], true::boolean, true::boolean);
SELECT * FROM inbox_park_key('ledger'::text, 'outbox:t'::text, '10-1'::text,
	ARRAY['event_id'::bytea, '00000000-0000-4000-8000-000000000010'::bytea, 'topic'::bytea, 't'::bytea, 'key'::bytea, 'k7'::bytea,
		  'payload'::bytea, '{"long": true}'::bytea], 'too long'::text, '22001'::text, 1::integer, false::boolean);
SELECT * FROM inbox_consume_keyed('ledger'::text, 'INSERT INTO trap_short VALUES ($1, $2, $3)'::text,
	ARRAY['outbox:t', 'outbox:t']::text[], ARRAY['10-1', '11-1']::text[],
	ARRAY['00000000-0000-4000-8000-000000000010'::bytea, '00000000-0000-4000-8000-000000000011'::bytea],
	ARRAY['t'::bytea, 't'::bytea], ARRAY['k7'::bytea, 'k7'::bytea], ARRAY['{"long": true}'::bytea, '{}'::bytea], NULL::bytea[],
	true::boolean, true::boolean);
SELECT * FROM outbox.parked_match('ledger'::text, ARRAY['outbox:t']::text[], ARRAY['k7'::bytea], ARRAY['13-1']::text[]);
SELECT outbox.parked_add('ledger'::text, ARRAY['outbox:t']::text[], ARRAY['13-1']::text[],
	ARRAY['00000000-0000-4000-8000-000000000013'::bytea], ARRAY['t'::bytea], ARRAY['k7'::bytea], ARRAY['{}'::bytea], NULL::bytea[]);
SELECT * FROM outbox.parked_take('ledger'::text, 'outbox:t'::text, 'k5'::bytea, 64::integer);
SELECT * FROM inbox_parked_keys('ledger'::text, NULL::text[]);
SELECT * FROM inbox_redrive('ledger'::text, 'k5'::text, NULL::text);
SELECT * FROM inbox_redrive('ledger'::text, 'k7'::text, 'outbox:t'::text);
SELECT * FROM inbox_redrive_step('ledger'::text, 'INSERT INTO trap_short VALUES ($1, $2, $3)'::text, 'outbox:t'::text,
	'k5'::bytea, 64::integer);
SELECT * FROM inbox_redrive_step('ledger'::text, 'INSERT INTO trap_short VALUES ($1, $2, $3)'::text, 'outbox:t'::text,
	'k5'::bytea, 64::integer);
SELECT * FROM inbox_park_key('ledger'::text, 'outbox:t'::text, '8-1'::text, NULL::bytea[], 'too long'::text, '22001'::text,
	1::integer, false::boolean);
SELECT * FROM inbox_park_key('ledger'::text, 'outbox:t'::text, '8-1'::text, NULL::bytea[], 'too long'::text, '22001'::text,
	2::integer, true::boolean);
SELECT * FROM inbox_skip('ledger'::text, 'k5'::text, NULL::text);
SELECT * FROM inbox_skip('ledger'::text, 'k7'::text, NULL::text);
SELECT * FROM inbox_redrive_step('ledger'::text, 'INSERT INTO trap_short VALUES ($1, $2, $3)'::text, 'outbox:t'::text,
	'k5'::bytea, 64::integer);
SELECT outbox.parked_settle('ledger'::text, 'outbox:t'::text, 'k7'::bytea, true::boolean, ARRAY['13-1']::text[], false::boolean);
SELECT * FROM inbox_consumers();
SELECT inbox_consumer_set_owner('ledger'::text, 'outbox_admin'::regrole);
SELECT inbox_consumer_drop('ledger'::text, true::boolean);
SELECT outbox_group_set_stale('c'::text, true::boolean);
SELECT * FROM outbox_maintain();
SELECT * FROM outbox_drop_empty_partitions();
SELECT * FROM outbox_partitions();
SELECT * FROM outbox_maintenance_status();
\if :sql_engine
-- The SQL engine has no background maintenance, and says so (55000).
DO $$
BEGIN
	PERFORM outbox_maintenance_databases();
	RAISE EXCEPTION 'outbox_maintenance_databases() answered on the SQL engine';
EXCEPTION WHEN object_not_in_prerequisite_state THEN
	NULL;
END
$$;
\else
SELECT count(*) FROM outbox_maintenance_databases();
\endif
SELECT outbox_group_set_stream_template('x'::text, NULL::text);
SELECT outbox_group_drop('sh'::text, false::boolean);
SELECT outbox_group_drop('gone'::text, true::boolean);
SELECT pg_catalog.pg_sleep(1.5::double precision);	-- a run of the background worker, woken by the changes
SQL
}

# Every function of the extension's schema ran (counted with
# track_functions): a new one must be added to exercise(). A call that
# raised is not counted: on the SQL engine, outbox_maintenance_databases()
# raises (exercise() checks that it does).
all_called() {
	qs "$1" -c "SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = '$EXT') THEN 'not installed' END" -c "SELECT string_agg(p.oid::regprocedure::text, ', ' ORDER BY 1) FROM pg_proc p
		JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
		JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = '$EXT'
		WHERE p.pronamespace = e.extnamespace
		  AND NOT (p.proname = 'outbox_maintenance_databases' AND '$ENGINE' = 'sql')
		  AND NOT EXISTS (SELECT 1 FROM pg_stat_user_functions f WHERE f.funcid = p.oid AND f.calls > 0)"
}

# The extension's functions that run as its owner pin search_path, and
# none names the extension's schema in its body (its owner could rename
# it and put another function under the name).
definers_pinned() {
	qs "$1" -c "SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = '$EXT') THEN 'not installed' END" -c "SELECT string_agg(p.oid::regprocedure::text, ', ') FROM pg_proc p
		JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
		JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = '$EXT'
		WHERE p.prosecdef AND (p.proconfig IS NULL OR NOT 'search_path=pg_catalog, pg_temp' = ANY (p.proconfig)
			   OR p.prosrc ~ ('(^|[^a-z_])' || quote_ident((SELECT nspname FROM pg_namespace WHERE oid = e.extnamespace)) || '\.'))"
}

# The database's owner sets the search_path of every session of the
# database (the background worker's too): the planted schemas before
# pg_catalog. hostile_path DB SCHEMA...
hostile_path() {
	local db=$1
	shift
	as_role trapper "$db" -c "ALTER DATABASE $db SET search_path = $*, pg_catalog" >/dev/null
}

# Runs a command with its output appended to a file: into FILE COMMAND...
into() {
	local out=$1
	shift
	"$@" >>"$out" 2>&1
}

trapper_super() { qs postgres -c "SELECT rolsuper FROM pg_roles WHERE rolname = 'trapper'"; }

# Checks after a scenario in DB: nothing fired (log, warnings in the
# output OUT), the attacker is no superuser, the definers are pinned.
no_trap() {
	local what=$1 db=$2 out=$3
	check "$what: no trap fired" eq "$(fired "$db")" ""
	check "$what: no trap warned" eq "$(grep -c 'TRAP FIRED' "$out")" 0
	check "$what: the planter is no superuser" eq "$(trapper_super)" f
	qs postgres -c "ALTER ROLE trapper NOSUPERUSER" >/dev/null
}

# 1. CREATE EXTENSION into public, which the attacker owns as the
# database's owner.
createdb -O trapper fresh
check "fresh: traps planted in public" plant fresh public
hostile_path fresh public
check "fresh: CREATE EXTENSION with traps in public" into "$work/fresh" q fresh -c "CREATE EXTENSION $EXT"
check "fresh: every API function runs" into "$work/fresh" exercise fresh public
no_trap fresh fresh "$work/fresh"
check "fresh: every function of the extension's schema was called" eq "$(all_called fresh)" ""
check "fresh: SECURITY DEFINER functions pin search_path and do not name the extension's schema" \
	eq "$(definers_pinned fresh)" ""
check "fresh: the script left the session's search_path as it was" \
	eq "$(q fresh -c "BEGIN" -c "DROP EXTENSION $EXT" -c "CREATE EXTENSION $EXT" -c "SHOW search_path" -c "ROLLBACK" 2>/dev/null)" \
	'public, pg_catalog'
grep -m5 'TRAP FIRED\|ERROR' "$work/fresh" | sed 's/^/#   /'

# 2. CREATE EXTENSION ... SCHEMA owned by the database's owner (the
# attacker), with traps in that schema and in public.
createdb -O trapper inschema
as_role trapper inschema -c "CREATE SCHEMA api" >/dev/null
check "inschema: traps planted in public and in the extension's schema" plant inschema public api
hostile_path inschema api, public
check "inschema: CREATE EXTENSION ... SCHEMA owned by the database's owner, traps in it and public" \
	into "$work/inschema" q inschema -c "CREATE EXTENSION $EXT SCHEMA api"
check "inschema: every API function runs" into "$work/inschema" exercise inschema api
no_trap inschema inschema "$work/inschema"
check "inschema: every function of the extension's schema was called" eq "$(all_called inschema)" ""
check "inschema: SECURITY DEFINER functions pin search_path and do not name the extension's schema" \
	eq "$(definers_pinned inschema)" ""
grep -m5 'TRAP FIRED\|ERROR' "$work/inschema" | sed 's/^/#   /'

# 2b. The SQL engine's plain script (sql/pg_outbox_sql.sql, psql -f, no
# extension), with traps in public, before schema outbox on the
# search_path of the database's sessions.
if [ "$ENGINE" = sql ]; then
	createdb -O trapper plain
	check "plain: traps planted in public" plant plain public
	hostile_path plain public, outbox
	check "plain: psql -f of the plain script with traps in public" \
		into "$work/plain" psql -X -q -v ON_ERROR_STOP=1 -d plain -f "$root/sql/pg_outbox_sql.sql" -o /dev/null
	check "plain: every API function runs" into "$work/plain" exercise plain outbox
	no_trap plain plain "$work/plain"
	grep -m5 'TRAP FIRED\|ERROR' "$work/plain" | sed 's/^/#   /'
fi

# 3. ALTER EXTENSION UPDATE from each released version, the traps planted
# after the old version's install.
for script in "${released[@]}"; do
	from=$(basename "$script" .sql)
	from=${from#pg_outbox--}
	[[ $from != *--* ]] || continue	# a released update's script, not a version
	db="up_${from//./_}"
	createdb -O trapper "$db"
	q "$db" >/dev/null <<SQL
CREATE EXTENSION pg_outbox VERSION '$from';
SELECT outbox_group_create('old', ordering => 'xid8', start_at => 'beginning');
SQL
	# CREATE OR REPLACE in an update script only for functions the old
	# version has: anything else could be a function someone else made.
	qs "$db" -c "SELECT p.proname FROM pg_proc p JOIN pg_depend d ON d.classid = 'pg_proc'::regclass
		AND d.objid = p.oid AND d.deptype = 'e' JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = '$EXT'" \
		| sort -u >"$work/members.$db"
	sed -n 's/^CREATE OR REPLACE FUNCTION [^.]*\.\([a-z_0-9]*\)(.*/\1/p' "$root/sql/pg_outbox--$from--$current.sql" \
		| sort -u >"$work/replaced.$db"
	check "$from -> $current: the update script replaces only functions $from has" \
		eq "$(comm -23 "$work/replaced.$db" "$work/members.$db" | paste -sd ' ')" ""
	check "$from -> $current: traps planted in public after the install" plant "$db" public
	hostile_path "$db" public
	check "$from -> $current: ALTER EXTENSION UPDATE with traps in public" \
		into "$work/$db" q "$db" -c "ALTER EXTENSION pg_outbox UPDATE"
	check "$from -> $current: the old group's row is written" \
		into "$work/$db" q "$db" -c "SELECT outbox_group_set_stale('old'::text, true::boolean)"
	check "$from -> $current: every API function runs" into "$work/$db" exercise "$db" public
	no_trap "$from -> $current" "$db" "$work/$db"
	check "$from -> $current: every function of the extension's schema was called" eq "$(all_called "$db")" ""
	check "$from -> $current: SECURITY DEFINER functions pin search_path and do not name the extension's schema" \
		eq "$(definers_pinned "$db")" ""
	grep -m5 'TRAP FIRED\|ERROR' "$work/$db" | sed 's/^/#   /'
done

# 4. A schema owned by a role that is neither a superuser, the installing
# role nor the database's owner is refused, on update (the released version
# installed there before the traps were planted) and on install; no trap
# of its owner fires meanwhile.
createdb refused
qs refused -c "GRANT CREATE ON DATABASE refused TO bystander, trapper" >/dev/null
as_role bystander refused -c "CREATE SCHEMA theirs" -c "GRANT USAGE, CREATE ON SCHEMA theirs TO trapper" >/dev/null
as_role trapper refused -c "CREATE SCHEMA trapbox" >/dev/null
for script in "${released[@]}"; do
	from=$(basename "$script" .sql)
	from=${from#pg_outbox--}
	[[ $from != *--* ]] || continue	# a released update's script, not a version
	q refused -c "CREATE EXTENSION pg_outbox SCHEMA theirs VERSION '$from'" >/dev/null
	check "refused: traps planted in the schema of $from" plant refused theirs
	psql -X -q -At -d refused -c "\\set VERBOSITY verbose" -c "ALTER EXTENSION pg_outbox UPDATE" >>"$work/refused" 2>&1
	check "refused: ALTER EXTENSION UPDATE from $from in a schema another role owns is refused" \
		eq "$(qs refused -c "SELECT extversion FROM pg_extension WHERE extname = '$EXT'")" "$from"
	q refused -c "DROP EXTENSION pg_outbox" >/dev/null
	# Renamed out of the way, not dropped: dropping thousands of traps in
	# one transaction would take more locks than the lock table holds.
	as_role bystander refused -c "ALTER SCHEMA theirs RENAME TO \"theirs_$from\"" -c "CREATE SCHEMA theirs" -c "GRANT USAGE, CREATE ON SCHEMA theirs TO trapper" >/dev/null
done
check "refused: traps planted in the schema" plant refused theirs
psql -X -q -At -d refused -c "\\set VERBOSITY verbose" -c "CREATE EXTENSION $EXT SCHEMA theirs" >>"$work/refused" 2>&1
check "refused: CREATE EXTENSION into a schema another role owns fails with 42501" \
	grep -q 'ERROR:  42501: pg_outbox cannot be installed in schema "theirs": it is owned by role "bystander"' "$work/refused"
check "refused: the update's refusal and the install's say the same" \
	test "$(grep -c '42501: pg_outbox cannot be installed in schema "theirs"' "$work/refused")" -ge $((1 + ${#released[@]}))
check "refused: the error says what to do" grep -q 'HINT:  Install pg_outbox in a schema owned by one of them' "$work/refused"
check "refused: nothing is left behind" \
	eq "$(qs refused -c "SELECT count(*) FROM pg_extension WHERE extname = '$EXT'")" 0
no_trap refused refused "$work/refused"
grep -m5 'TRAP FIRED' "$work/refused" | sed 's/^/#   /'

finish
