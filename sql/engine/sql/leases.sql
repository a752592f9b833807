-- Group leadership in SQL and PL/pgSQL: which session may publish a group's
-- feed, and for how long without showing progress (lead.c and group.c in
-- the C engine, whose rules these are).
--
-- A group's leader is written in its row: a pid and a session timestamp,
-- with a lease that its fetches and advances renew. What only C can see of
-- a session, the SQL engine keeps where SQL can reach it without a
-- privilege:
--
-- - The session's name (outbox.session_started()). A role that is not a
--   member of pg_read_all_stats does not see another role's backend start
--   in pg_stat_activity (nor, inside a SECURITY DEFINER function, its own),
--   so the SQL engine names a session by the time of its first call
--   instead, kept in the session setting pg_outbox_sql.session_started (outside
--   the prefix pg_outbox.so reserves for its own settings), and
--   shows that it lives with a session-level advisory lock in share mode,
--   pg_locks.classid outbox.lock_class(), objsubid 1, objid the low 32 bits
--   of that time in microseconds. pg_locks is readable by every role. An
--   advisory lock held at session level outlives a rollback; a setting
--   does not: a session whose setting was rolled back (its first call's
--   transaction failed, or RESET ALL) takes a new name and lets its old
--   lock go. Nothing committed can carry the old name: the transaction
--   that used it rolled back.
-- - The generation this session noted per group it took the lead of
--   (outbox.note_generation(), outbox.forget_leadership()). A leader is
--   refused once when its group was rewound (OB002) or taken over (OB003),
--   and the call that refuses it fails: what it notes must outlast that
--   rollback. A sequence's value does (setval is not transactional), so
--   each group led has a temporary sequence of the session,
--   pg_temp.outbox_generation_<group id>, holding the generation noted
--   (none: is_called false). The owner of the extension's functions needs
--   the TEMPORARY privilege on the database (PUBLIC has it by default).
-- - The settings pg_outbox.lease and pg_outbox.max_group_streams, read as
--   placeholder settings, with the C engine's defaults and bounds.

-- The classid of pg_outbox's advisory locks ("obox"), for finding them in
-- pg_locks: the C engine's locks with their own objsubids, the SQL
-- engine's session locks with objsubid 1 (a bigint key whose high half is
-- this classid).
CREATE FUNCTION outbox.lock_class()
RETURNS oid
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT 1868722040::pg_catalog.oid $$;
COMMENT ON FUNCTION outbox.lock_class() IS 'pg_outbox: classid of pg_outbox''s advisory locks (pg_locks.classid)';

-- The session's name, taken at its first call: the time then, stored in
-- the setting pg_outbox_sql.session_started, and a session advisory lock that
-- shows other sessions it lives (outbox.session_alive()).
CREATE FUNCTION outbox.session_started()
RETURNS timestamptz
LANGUAGE plpgsql STABLE PARALLEL RESTRICTED
AS $$
DECLARE
	noted text := pg_catalog.current_setting('pg_outbox_sql.session_started', true);
	started timestamptz;
	marker bigint;
	stale bigint;
BEGIN
	IF noted OPERATOR(pg_catalog.<>) ''::pg_catalog.text THEN
		RETURN noted::pg_catalog.timestamptz;
	END IF;
	-- A name taken in a transaction that rolled back: its lock goes.
	FOR stale IN
		SELECT (1868722040::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32)
			   OPERATOR(pg_catalog.|) l.objid::pg_catalog.text::pg_catalog.int8
		  FROM pg_catalog.pg_locks l
		 WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory'::pg_catalog.text
		   AND l.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()
		   AND l.classid OPERATOR(pg_catalog.=) 1868722040::pg_catalog.oid
		   AND l.objsubid OPERATOR(pg_catalog.=) 1::pg_catalog.int2
		   AND l.mode OPERATOR(pg_catalog.=) 'ShareLock'::pg_catalog.text
	LOOP
		PERFORM pg_catalog.pg_advisory_unlock_shared(stale);
	END LOOP;
	LOOP
		started := pg_catalog.date_trunc('microseconds'::pg_catalog.text, pg_catalog.clock_timestamp());
		marker := (1868722040::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32) OPERATOR(pg_catalog.|)
			((pg_catalog.extract('epoch'::pg_catalog.text, started) OPERATOR(pg_catalog.*) 1000000::pg_catalog.numeric)::pg_catalog.int8
			 OPERATOR(pg_catalog.&) 4294967295::pg_catalog.int8);
		-- Only a session holding that key exclusively refuses it: then
		-- the next microsecond.
		EXIT WHEN pg_catalog.pg_try_advisory_lock_shared(marker);
	END LOOP;
	PERFORM pg_catalog.set_config('pg_outbox_sql.session_started',
								  pg_catalog.to_char(pg_catalog.timezone('UTC'::pg_catalog.text, started),
													 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'::pg_catalog.text),
								  false);
	RETURN started;
END
$$;
COMMENT ON FUNCTION outbox.session_started() IS 'pg_outbox: when this backend started; with its pid, names the session';

-- Whether the session "pid" named "started" runs: its advisory lock is in
-- pg_locks (any database). A pid reused by a later session is not it.
CREATE FUNCTION outbox.session_alive(pid integer, started timestamptz)
RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT PARALLEL RESTRICTED
AS $$
BEGIN
	IF pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid() THEN
		RETURN started OPERATOR(pg_catalog.=) outbox.session_started();
	END IF;
	RETURN EXISTS (
		SELECT
		  FROM pg_catalog.pg_locks l
		 WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory'::pg_catalog.text
		   AND l.pid OPERATOR(pg_catalog.=) session_alive.pid
		   AND l.classid OPERATOR(pg_catalog.=) 1868722040::pg_catalog.oid
		   AND l.objid OPERATOR(pg_catalog.=)
			   ((pg_catalog.extract('epoch'::pg_catalog.text, started) OPERATOR(pg_catalog.*) 1000000::pg_catalog.numeric)::pg_catalog.int8
				OPERATOR(pg_catalog.&) 4294967295::pg_catalog.int8)::pg_catalog.oid
		   AND l.objsubid OPERATOR(pg_catalog.=) 1::pg_catalog.int2
		   AND l.granted);
END
$$;
COMMENT ON FUNCTION outbox.session_alive(integer, timestamptz) IS
	'pg_outbox: true while the backend with this pid that started then runs';

-- pg_outbox.lease as an interval: milliseconds, or a number with a unit
-- of time as PostgreSQL's settings take it; 15 s when unset, between
-- 100 ms and 1 h. Without the C library the setting is a placeholder that
-- takes any text: a wrong value is refused here, where it is used.
CREATE FUNCTION outbox.lease()
RETURNS interval
LANGUAGE plpgsql STABLE PARALLEL RESTRICTED
AS $$
DECLARE
	value text := pg_catalog.btrim(pg_catalog.current_setting('pg_outbox.lease', true));
	parts text[];
	ms numeric;
BEGIN
	IF value IS NULL OR value OPERATOR(pg_catalog.=) ''::pg_catalog.text THEN
		RETURN '15 s'::pg_catalog.interval;
	END IF;
	parts := pg_catalog.regexp_match(value, '^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(us|ms|s|min|h|d)?$'::pg_catalog.text);
	IF parts IS NULL THEN
		RAISE EXCEPTION 'invalid value for parameter "pg_outbox.lease": "%"', value
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Valid units for this parameter are "us", "ms", "s", "min", "h", and "d".';
	END IF;
	ms := pg_catalog.round(parts[1]::pg_catalog.numeric OPERATOR(pg_catalog.*)
		CASE WHEN parts[2] OPERATOR(pg_catalog.=) 'us' THEN 0.001 WHEN parts[2] OPERATOR(pg_catalog.=) 's' THEN 1000
			 WHEN parts[2] OPERATOR(pg_catalog.=) 'min' THEN 60000 WHEN parts[2] OPERATOR(pg_catalog.=) 'h' THEN 3600000
			 WHEN parts[2] OPERATOR(pg_catalog.=) 'd' THEN 86400000 ELSE 1 END::pg_catalog.numeric);
	IF ms OPERATOR(pg_catalog.<) 100::pg_catalog.numeric OR ms OPERATOR(pg_catalog.>) 3600000::pg_catalog.numeric THEN
		RAISE EXCEPTION '% ms is outside the valid range for parameter "pg_outbox.lease" (100 ms .. 3600000 ms)', ms
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	RETURN pg_catalog.make_interval(secs => (ms OPERATOR(pg_catalog./) 1000::pg_catalog.numeric)::pg_catalog.float8);
END
$$;
COMMENT ON FUNCTION outbox.lease() IS 'pg_outbox: this session''s lease of a group''s leadership (pg_outbox.lease)';

-- pg_outbox.max_group_streams: 1000 when unset, between 1 and 100000.
CREATE FUNCTION outbox.max_group_streams()
RETURNS integer
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
DECLARE
	value text := pg_catalog.btrim(pg_catalog.current_setting('pg_outbox.max_group_streams', true));
BEGIN
	IF value IS NULL OR value OPERATOR(pg_catalog.=) ''::pg_catalog.text THEN
		RETURN 1000;
	END IF;
	IF value OPERATOR(pg_catalog.!~) '^[0-9]{1,9}$'::pg_catalog.text
	   OR value::pg_catalog.int4 OPERATOR(pg_catalog.<) 1 OR value::pg_catalog.int4 OPERATOR(pg_catalog.>) 100000 THEN
		RAISE EXCEPTION 'invalid value for parameter "pg_outbox.max_group_streams": "%"', value
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'It is an integer between 1 and 100000.';
	END IF;
	RETURN value::pg_catalog.int4;
END
$$;
COMMENT ON FUNCTION outbox.max_group_streams() IS 'pg_outbox: how many streams a group records the last position of (pg_outbox.max_group_streams)';

-- Forgets the generation noted for the group (its temporary sequence no
-- longer "called"); not transactional, as setval is not.
CREATE FUNCTION outbox.forget_leadership(group_id integer)
RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT PARALLEL UNSAFE
AS $$
DECLARE
	noted regclass := pg_catalog.to_regclass(pg_catalog.format('pg_temp.%I',
		'outbox_generation_'::pg_catalog.text OPERATOR(pg_catalog.||) group_id::pg_catalog.text));
BEGIN
	IF noted IS NULL OR pg_catalog.pg_sequence_last_value(noted) IS NULL THEN
		RETURN false;
	END IF;
	PERFORM pg_catalog.setval(noted, 0::pg_catalog.int8, false);
	RETURN true;
END
$$;
COMMENT ON FUNCTION outbox.forget_leadership(integer) IS
	'pg_outbox: forgets that this session took the lead of a group; true when it had';

-- Notes the group's generation in its temporary sequence, made at the
-- session's first note of the group; returns the one noted before (the
-- given one when none was).
CREATE FUNCTION outbox.note_generation(group_id integer, generation bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT PARALLEL UNSAFE
AS $$
DECLARE
	seqname text := 'outbox_generation_'::pg_catalog.text OPERATOR(pg_catalog.||) group_id::pg_catalog.text;
	noted regclass := pg_catalog.to_regclass(pg_catalog.format('pg_temp.%I', seqname));
	before bigint;
BEGIN
	IF noted IS NULL THEN
		EXECUTE pg_catalog.format('CREATE TEMPORARY SEQUENCE pg_temp.%I AS bigint'
								  ' MINVALUE -9223372036854775808 MAXVALUE 9223372036854775807 START 0', seqname);
		noted := pg_catalog.to_regclass(pg_catalog.format('pg_temp.%I', seqname));
	ELSE
		before := pg_catalog.pg_sequence_last_value(noted);
	END IF;
	IF before IS DISTINCT FROM generation THEN
		PERFORM pg_catalog.setval(noted, generation, true);
	END IF;
	RETURN coalesce(before, generation);
END
$$;
COMMENT ON FUNCTION outbox.note_generation(integer, bigint) IS
	'pg_outbox: notes a led group''s generation for this session; returns the one noted before';

-- Takes or keeps the group's leadership for this session; true when it
-- leads (group.c's OutboxLead(), statement for statement: the renewal of
-- the leader's lease, the refusal OB003 of a session whose leadership
-- passed to another, the rule of a live leader, and the takeover that
-- compares and sets the leader and the lease in one update and bumps the
-- fencing generation).
CREATE FUNCTION outbox.lead(group_id integer)
RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT PARALLEL UNSAFE
AS $$
DECLARE
	me integer := pg_catalog.pg_backend_pid();
	started timestamptz := outbox.session_started();
	lease interval := outbox.lease();
	renewed timestamptz;
	r record;
	taken bigint;
BEGIN
	SELECT g.leader_pid, g.leader_started, g.lease_until, g.name, g.generation INTO r
	  FROM outbox.groups g WHERE g.id OPERATOR(pg_catalog.=) lead.group_id;
	IF NOT FOUND THEN
		RETURN false;
	END IF;

	-- The leader renews its lease, while the row says it leads.
	IF r.leader_pid OPERATOR(pg_catalog.=) me AND r.leader_started OPERATOR(pg_catalog.=) started THEN
		renewed := pg_catalog.clock_timestamp();
		UPDATE outbox.groups g
		   SET lease_renewed = renewed, lease_until = renewed OPERATOR(pg_catalog.+) lease
		 WHERE g.id OPERATOR(pg_catalog.=) lead.group_id AND g.leader_pid OPERATOR(pg_catalog.=) me
		   AND g.leader_started OPERATOR(pg_catalog.=) started;
		IF FOUND THEN
			RETURN true;
		END IF;
		SELECT g.leader_pid, g.leader_started, g.lease_until, g.name, g.generation INTO r
		  FROM outbox.groups g WHERE g.id OPERATOR(pg_catalog.=) lead.group_id;
		IF NOT FOUND THEN
			RAISE EXCEPTION 'pg_outbox: group % went away while this session led it', group_id
				USING ERRCODE = 'internal_error';
		END IF;
	END IF;
	IF outbox.forget_leadership(group_id) THEN
		RAISE EXCEPTION 'this session no longer leads group "%"', r.name
			USING ERRCODE = 'OB003',
				  DETAIL = pg_catalog.format('Its lease ran out and another session took the group over (generation %s).',
											 r.generation),
				  HINT = 'Stand by: what this session published is harmless, and the new leader publishes from the cursor.';
	END IF;
	IF r.leader_pid IS NOT NULL AND r.leader_started IS NOT NULL AND r.lease_until IS NOT NULL
	   AND outbox.leader_live(r.leader_pid, r.leader_started, r.lease_until) THEN
		RETURN false;
	END IF;

	-- The takeover: only from the leader and lease read.
	renewed := pg_catalog.clock_timestamp();
	UPDATE outbox.groups g
	   SET leader_pid = me, leader_started = started, lease_renewed = renewed,
		   lease_until = renewed OPERATOR(pg_catalog.+) lease, generation = g.generation OPERATOR(pg_catalog.+) 1::pg_catalog.int8
	 WHERE g.id OPERATOR(pg_catalog.=) lead.group_id AND g.leader_pid IS NOT DISTINCT FROM r.leader_pid
	   AND g.leader_started IS NOT DISTINCT FROM r.leader_started AND g.lease_until IS NOT DISTINCT FROM r.lease_until
	RETURNING g.generation INTO taken;
	IF NOT FOUND THEN
		RETURN false;
	END IF;
	PERFORM outbox.note_generation(group_id, taken);
	RETURN true;
END
$$;
COMMENT ON FUNCTION outbox.lead(integer) IS
	'pg_outbox: takes (when free, its leader gone or its lease run out) or keeps the leadership of a group for this session; true when it leads';

-- The rule of a live leader, which a standby does not take the group
-- from: its lease has not run out and its session runs.
CREATE FUNCTION outbox.leader_live(pid integer, started timestamptz, lease_until timestamptz)
RETURNS boolean
LANGUAGE sql VOLATILE STRICT PARALLEL RESTRICTED
AS $$
	SELECT lease_until OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp() AND outbox.session_alive(pid, started)
$$;
COMMENT ON FUNCTION outbox.leader_live(integer, timestamptz, timestamptz) IS
	'pg_outbox: true while a group''s leader holds a lease that has not run out, in a session that runs';
