-- pg_outbox install script, part 00: schema, roles and settings.
--
-- The install script is assembled from the parts in sql/install/, which the
-- Makefile concatenates in name order into sql/pg_outbox--<version>.sql.
-- Each part may use what the parts before it define (a SQL-language
-- function's tables and types, a view's functions), and ends with the
-- privileges on its own objects: nothing for PUBLIC, then the grants to
-- outbox_writer, outbox_relay, outbox_consumer and outbox_admin.
--
-- Layout: storage and internals live in schema "outbox"; the functions that
-- applications and relays call live in the extension's schema (by default
-- the first schema of search_path, usually "public"), so that
-- outbox_emit() works with the default search_path.

-- SQLSTATEs of pg_outbox's own, class OB (the same table as
-- extension/sqlstates.h and relay/include/pg_outbox/sqlstates.hpp, which
-- test/layout.sh compares; a SQL part names a code only in a RAISE's
-- ERRCODE, and only a code of this table):
--
--   SQLSTATE  name                condition
--   OB001     identity_conflict   an event id applied before with another payload (the inbox)
--   OB002     rewound             the leader's group's cursor was moved by outbox_rewind() or outbox_skip()
--   OB003     not_leader          this session does not lead the group (any more)
--   OB004     event_too_large     the group's next event is too large to publish
--   OB005     park_limit_reached  a consumer's parked entries would exceed outbox.config.park_limit
--   OB006     trace_context_dropped  outbox_emit() dropped a trace context that is not valid (a warning)

\echo Use "CREATE EXTENSION pg_outbox" to load this file. \quit

-- (make puts sql/preamble.sql right after the \echo guard above: what the
-- script resolves, and who may own the extension's schema.)

-- One engine per database: both keep their state in schema "outbox".
DO $installed$
BEGIN
	IF pg_catalog.to_regnamespace('outbox') IS NOT NULL THEN
		RAISE EXCEPTION 'pg_outbox is installed in database "%" already, or another schema is named "outbox"',
				pg_catalog.current_database()
			USING ERRCODE = 'duplicate_schema',
				  DETAIL = 'pg_outbox keeps its events, groups and inbox in schema "outbox"; its C engine (pg_outbox) and its SQL engine (pg_outbox_sql) both do, so a database has one of them.',
				  HINT = 'SELECT * FROM outbox.engine() names the engine installed; to change engines, follow "Moving between engines" in docs/engines.md.';
	END IF;
END
$installed$;

CREATE SCHEMA outbox;
COMMENT ON SCHEMA outbox IS 'pg_outbox storage and internals';
REVOKE ALL ON SCHEMA outbox FROM PUBLIC;

-- @engine identity@

--
-- Roles. Roles are cluster-wide: the first database to install the
-- extension creates them, later ones reuse them, whoever created them. DROP
-- EXTENSION leaves them. A role that is not a superuser (the SQL engine's
-- plain script on a managed service, an extension of pg_tle) creates them
-- with CREATEROLE; without it, the roles must exist, and the install stops
-- here, saying which are missing, before CREATE ROLE would fail with less.
--
DO $roles$
DECLARE
	missing text[];
	r text;
BEGIN
	SELECT pg_catalog.array_agg(w.r ORDER BY w.n) INTO missing
	  FROM pg_catalog.unnest(ARRAY['outbox_writer', 'outbox_relay', 'outbox_consumer', 'outbox_admin']) WITH ORDINALITY AS w (r, n)
	 WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles o WHERE o.rolname OPERATOR(pg_catalog.=) w.r);
	IF missing IS NOT NULL AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles o
											WHERE o.rolname OPERATOR(pg_catalog.=) CURRENT_USER
											  AND (o.rolsuper OR o.rolcreaterole)) THEN
		RAISE EXCEPTION 'role "%" cannot install pg_outbox: it may not create the missing roles %',
				CURRENT_USER, pg_catalog.array_to_string(missing, ', ')
			USING ERRCODE = 'insufficient_privilege',
				  DETAIL = 'pg_outbox grants its privileges to the roles outbox_writer, outbox_relay, outbox_consumer and outbox_admin, which the databases of a cluster share; the first install creates those that do not exist, which takes CREATEROLE.',
				  HINT = pg_catalog.format('Install pg_outbox as a role with CREATEROLE, or have such a role create the missing roles first: %s',
										   (SELECT pg_catalog.string_agg(pg_catalog.format('CREATE ROLE %I NOLOGIN;', m), ' ')
											  FROM pg_catalog.unnest(missing) AS m));
	END IF;
	FOREACH r IN ARRAY COALESCE(missing, ARRAY[]::text[])
	LOOP
		EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', r);
	END LOOP;
END
$roles$;

--
-- Settings, one row. Registered for pg_dump.
--
CREATE TABLE outbox.config (
	only_row boolean NOT NULL DEFAULT true,
	partition_width bigint NOT NULL DEFAULT 10000000,
	premake integer NOT NULL DEFAULT 4,
	retention interval NOT NULL DEFAULT '3 days',
	retire_mode text NOT NULL DEFAULT 'drop',
	lock_timeout interval NOT NULL DEFAULT '200 milliseconds',
	max_group_lag interval NOT NULL DEFAULT '1 day',
	inbox_retention interval NOT NULL DEFAULT '7 days',
	park_limit bigint NOT NULL DEFAULT 1000000,
	CONSTRAINT config_pkey PRIMARY KEY (only_row),
	CONSTRAINT config_only_row CHECK (only_row),
	CONSTRAINT config_partition_width_range CHECK (partition_width BETWEEN 100 AND 1000000000000),
	CONSTRAINT config_premake_range CHECK (premake BETWEEN 1 AND 1000),
	CONSTRAINT config_retention_check CHECK (retention >= interval '0'),
	CONSTRAINT config_retire_mode_check CHECK (retire_mode IN ('drop', 'detach')),
	CONSTRAINT config_lock_timeout_check CHECK (lock_timeout BETWEEN interval '1 millisecond' AND interval '1 minute'),
	CONSTRAINT config_max_group_lag_check CHECK (max_group_lag > interval '0'),
	CONSTRAINT config_inbox_retention_check CHECK (inbox_retention >= interval '1 day'),
	CONSTRAINT config_park_limit_check CHECK (park_limit >= 1)
);
COMMENT ON TABLE outbox.config IS 'pg_outbox settings (one row)';
COMMENT ON COLUMN outbox.config.partition_width IS 'transaction ids covered by one event partition';
COMMENT ON COLUMN outbox.config.premake IS 'partitions kept ready ahead of the current transaction id';
COMMENT ON COLUMN outbox.config.retention IS 'how long events are kept after every live group passed them';
COMMENT ON COLUMN outbox.config.retire_mode IS 'drop: retired partitions are dropped; detach: kept as tables outside the feed';
COMMENT ON COLUMN outbox.config.lock_timeout IS 'longest wait of maintenance DDL for a lock before it retries on a later run';
COMMENT ON COLUMN outbox.config.max_group_lag IS 'a group whose oldest waiting event is older than this is reported as lagging';
COMMENT ON COLUMN outbox.config.inbox_retention IS 'how long the inbox remembers applied events; must cover the broker''s retention and any replay window';
COMMENT ON COLUMN outbox.config.park_limit IS 'most entries a consumer may have parked (outbox.parked_entries); parking more fails with SQLSTATE OB005';
INSERT INTO outbox.config DEFAULT VALUES;
SELECT pg_catalog.pg_extension_config_dump('outbox.config', '');

-- pg_dump copies the settings row; CREATE EXTENSION in the restored
-- database has inserted the defaults already. The restored row replaces
-- them (an insert replaces the row: there is only one).
CREATE FUNCTION outbox.config_replace()
RETURNS trigger
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	DELETE FROM outbox.config;
	RETURN NEW;
END
$$;
COMMENT ON FUNCTION outbox.config_replace() IS 'pg_outbox: an inserted settings row replaces the existing one (restores)';
CREATE TRIGGER config_replace BEFORE INSERT ON outbox.config
	FOR EACH ROW EXECUTE FUNCTION outbox.config_replace();

-- A setting that only a superuser may set, as the session has it.
-- pg_outbox.so defines pg_outbox.today so (the day inbox maintenance takes
-- as today): PostgreSQL refuses it to other roles, in a session and at
-- connection. Without the library, on the SQL engine, the name is a
-- placeholder that any role may set for its own session (PostgreSQL does
-- not say who set a placeholder, nor where from), and a relay's role that
-- set it ahead would have maintenance drop inbox days still retained, and
-- with them what keeps redelivered events from applying twice. A
-- placeholder is therefore taken in the session of a superuser or of a
-- member of outbox_admin (who sets the retention anyway), and refused in
-- any other, wherever it was set.
CREATE FUNCTION outbox.superuser_setting(parameter text)
RETURNS text
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	value text := current_setting(parameter, true);
BEGIN
	IF value IS NOT NULL AND value <> ''
	   AND NOT EXISTS (SELECT FROM pg_settings s WHERE s.name = parameter)
	   AND NOT coalesce((SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = session_user), false)
	   AND NOT pg_has_role(session_user, 'outbox_admin', 'MEMBER') THEN
		RAISE EXCEPTION 'permission denied to set parameter "%"', parameter
			USING ERRCODE = 'insufficient_privilege',
				  DETAIL = format('Without pg_outbox.so it is taken in the sessions of superusers and of members of outbox_admin only; role %I is neither.',
								  session_user),
				  HINT = format('Reset it for this session (RESET %s), and for the database or the role if it was set there.',
								parameter);
	END IF;
	RETURN value;
END
$$;
COMMENT ON FUNCTION outbox.superuser_setting(text) IS 'pg_outbox: a setting only a superuser may set, refused as a placeholder outside the sessions of superusers and outbox_admin';

--
-- Privileges: the settings are read and changed by outbox_admin only.
--
REVOKE ALL ON TABLE outbox.config FROM PUBLIC;
REVOKE ALL ON FUNCTION
	outbox.engine(),
	outbox.superuser_setting(text),
	outbox.config_replace()
FROM PUBLIC;

GRANT USAGE ON SCHEMA outbox TO outbox_writer, outbox_relay, outbox_consumer, outbox_admin;
GRANT EXECUTE ON FUNCTION outbox.engine() TO outbox_writer, outbox_relay, outbox_consumer, outbox_admin;
GRANT SELECT, UPDATE ON outbox.config TO outbox_admin;
