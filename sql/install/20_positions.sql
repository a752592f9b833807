-- pg_outbox install script, part 20: feed positions.
-- (assembled with the other parts of sql/install/; see 00_schema_roles.sql).

--
-- Positions: "<txid>-<seq>", the same text as the Redis stream entry id a
-- relay gives the event.
--
-- The internal helpers that run on every fetch and advance
-- (parse_position, parse_commit_position, get_group, fetch_args) pin no
-- search_path of their own: the functions that call them do, and a role
-- that calls them directly runs them with its own privileges. Each SET
-- clause costs a save and restore of settings per call.
CREATE FUNCTION outbox.parse_position(pos text, OUT txid xid8, OUT seq bigint)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
	IF pos IS NULL THEN
		RAISE EXCEPTION 'position must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF pos !~ '^[0-9]{1,20}-[0-9]{1,19}$' THEN
		RAISE EXCEPTION 'invalid feed position "%"', pos
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'A position is written "<transaction id>-<sequence>", for example "1042-3".';
	END IF;
	-- Range checks without an exception block (a subtransaction per call).
	IF split_part(pos, '-', 1)::numeric > 18446744073709551615
	   OR split_part(pos, '-', 2)::numeric > 9223372036854775807 THEN
		RAISE EXCEPTION 'invalid feed position "%"', pos
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'A part of the position is out of range.';
	END IF;
	txid := split_part(pos, '-', 1)::xid8;
	seq := split_part(pos, '-', 2)::bigint;
END
$$;
COMMENT ON FUNCTION outbox.parse_position(text) IS 'pg_outbox: splits a feed position "<txid>-<seq>"';

-- Splits a commit-order position "<ticket>-<seq>".
CREATE FUNCTION outbox.parse_commit_position(pos text, OUT ticket bigint, OUT seq bigint)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
	p record;
BEGIN
	SELECT * INTO p FROM outbox.parse_position(pos);
	IF p.txid > '9223372036854775807'::xid8 THEN
		RAISE EXCEPTION 'invalid feed position "%"', pos
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'The commit ticket is out of range.';
	END IF;
	ticket := p.txid::text::bigint;
	seq := p.seq;
END
$$;
COMMENT ON FUNCTION outbox.parse_commit_position(text) IS 'pg_outbox: splits a commit-order position "<ticket>-<seq>"';

-- A group's position as this server's: a group re-anchored in another
-- cluster (outbox_reanchor) adds an epoch to the transaction id or ticket
-- of its positions; this takes it off. Text that is no position is
-- returned as is, for the parser to refuse.
CREATE FUNCTION outbox.unshift_position(pos text, epoch bigint)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
	major numeric;
BEGIN
	IF epoch = 0 OR pos !~ '^[0-9]{1,20}-[0-9]{1,19}$' THEN
		RETURN pos;
	END IF;
	major := split_part(pos, '-', 1)::numeric;
	IF major < epoch THEN
		RAISE EXCEPTION 'position % is from before the group was re-anchored', pos
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = format('The group''s positions start at %s since outbox_reanchor().', epoch);
	END IF;
	RETURN (major - epoch) || '-' || split_part(pos, '-', 2);
END
$$;
COMMENT ON FUNCTION outbox.unshift_position(text, bigint) IS 'pg_outbox: a re-anchored group''s position as this server''s (the epoch taken off)';

--
-- Privileges: internal helpers, granted to nobody.
--
REVOKE ALL ON FUNCTION
	outbox.parse_position(text),
	outbox.parse_commit_position(text),
	outbox.unshift_position(text, bigint)
FROM PUBLIC;
