-- The preamble of every script of pg_outbox, the install script and each
-- upgrade script: make puts it right after the script's \echo guard
-- (Makefile). It is written once, here. ALTER EXTENSION UPDATE runs with
-- the search_path CREATE EXTENSION would use, so what follows holds for
-- both.
--
-- What the script resolves (I-17). It runs as a superuser, with
-- search_path set by CREATE EXTENSION to the extension's schema and
-- pg_temp: an operator or function planted there (or in any schema named
-- later) that matches an expression's argument types better than
-- pg_catalog's own would be bound into a generated column, a default, a
-- check or a view, or run at once by a DO block. So the script resolves
-- names in pg_catalog alone, until its end (CREATE EXTENSION then restores
-- the search_path it set), and creates every object with its schema
-- named. On top of that, every function is called qualified, and an
-- operator applied to operands of two types is written
-- OPERATOR(pg_catalog.op) with the operands cast to the types of the
-- operator meant. test/ops/install_traps.sh plants a trap for each
-- operator and function name the scripts use and checks that none fires.
--
SET LOCAL search_path = pg_catalog, pg_temp;

-- The owner of the extension's schema can drop and rename what is in it:
-- it could move the extension's functions aside and put its own under
-- their names, which other roles and the extension's own code then call,
-- or drop the extension with the schema (and every event with it). Only a
-- role that could do as much anyway may own it: a superuser, the
-- installing role, or the database's owner (who can drop the database).
-- The same check runs on ALTER EXTENSION UPDATE.
DO $owner$
DECLARE
	s record;
BEGIN
	SELECT n.nspname, o.rolname, o.rolsuper OR o.rolname = CURRENT_USER
			   OR o.oid IN ('pg_database_owner'::pg_catalog.regrole::pg_catalog.oid, d.datdba) AS trusted
	  INTO s
	  FROM pg_catalog.pg_extension e
	  JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
	  JOIN pg_catalog.pg_roles o ON o.oid = n.nspowner
	  JOIN pg_catalog.pg_database d ON d.datname = pg_catalog.current_database()
	 WHERE e.extname IN ('pg_outbox', 'pg_outbox_sql');
	IF NOT s.trusted THEN
		RAISE EXCEPTION 'pg_outbox cannot be installed in schema "%": it is owned by role "%"', s.nspname, s.rolname
			USING ERRCODE = 'insufficient_privilege',
				  DETAIL = 'The owner of the extension''s schema could drop or rename the extension''s functions and put its own in their place, which the extension and its roles would then call; only a superuser, the installing role or the database''s owner may own it.',
				  HINT = pg_catalog.format('Install pg_outbox in a schema owned by one of them, or change the owner of schema %I first (ALTER SCHEMA %I OWNER TO ...).', s.nspname, s.nspname);
	END IF;
END
$owner$;
