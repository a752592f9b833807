CREATE FUNCTION outbox.lock_class()
RETURNS oid
AS 'MODULE_PATHNAME', 'outbox_lock_class'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION outbox.lock_class() IS 'pg_outbox: classid of pg_outbox''s advisory locks (pg_locks.classid)';

CREATE FUNCTION outbox.session_started()
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'outbox_session_started'
LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION outbox.session_started() IS 'pg_outbox: when this backend started; with its pid, names the session';

CREATE FUNCTION outbox.session_alive(pid integer, started timestamptz)
RETURNS boolean
AS 'MODULE_PATHNAME', 'outbox_session_alive'
LANGUAGE C VOLATILE STRICT PARALLEL RESTRICTED;
COMMENT ON FUNCTION outbox.session_alive(integer, timestamptz) IS
	'pg_outbox: true while the backend with this pid that started then runs';

CREATE FUNCTION outbox.lease()
RETURNS interval
AS 'MODULE_PATHNAME', 'outbox_lease'
LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION outbox.lease() IS 'pg_outbox: this session''s lease of a group''s leadership (pg_outbox.lease)';

CREATE FUNCTION outbox.max_group_streams()
RETURNS integer
AS 'MODULE_PATHNAME', 'outbox_max_group_streams'
LANGUAGE C STABLE PARALLEL SAFE;
COMMENT ON FUNCTION outbox.max_group_streams() IS 'pg_outbox: how many streams a group records the last position of (pg_outbox.max_group_streams)';

CREATE FUNCTION outbox.forget_leadership(group_id integer)
RETURNS boolean
AS 'MODULE_PATHNAME', 'outbox_forget_leadership'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.forget_leadership(integer) IS
	'pg_outbox: forgets that this session took the lead of a group; true when it had';

CREATE FUNCTION outbox.note_generation(group_id integer, generation bigint)
RETURNS bigint
AS 'MODULE_PATHNAME', 'outbox_note_generation'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.note_generation(integer, bigint) IS
	'pg_outbox: notes a led group''s generation for this session; returns the one noted before';

-- Takes or keeps the group's leadership for this session; true when it
-- leads (group.c: the rule of a live leader, the takeover with its
-- fencing generation, the refusal OB003 of a session whose leadership
-- passed to another).
CREATE FUNCTION outbox.lead(group_id integer)
RETURNS boolean
AS 'MODULE_PATHNAME', 'outbox_lead_group'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.lead(integer) IS
	'pg_outbox: takes (when free, its leader gone or its lease run out) or keeps the leadership of a group for this session; true when it leads';

-- The rule of a live leader, which a standby does not take the group
-- from: its lease has not run out and its session runs.
CREATE FUNCTION outbox.leader_live(pid integer, started timestamptz, lease_until timestamptz)
RETURNS boolean
AS 'MODULE_PATHNAME', 'outbox_leader_live'
LANGUAGE C VOLATILE STRICT PARALLEL RESTRICTED;
COMMENT ON FUNCTION outbox.leader_live(integer, timestamptz, timestamptz) IS
	'pg_outbox: true while a group''s leader holds a lease that has not run out, in a session that runs';
