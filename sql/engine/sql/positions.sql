-- Feed positions in PL/pgSQL (the C engine: extension/position.c).
--
-- The internal helpers that run on every advance (parse_position,
-- parse_commit_position, unshift_position, get_group) pin no search_path
-- of their own: the functions that call them do, and a role that calls
-- them directly runs them with its own privileges. Each SET clause costs a
-- save and restore of settings per call. So their bodies resolve nothing
-- through search_path: every function, type and operator is qualified.
--
-- A position is "<order>-<seq>": 1 to 20 digits, "-", 1 to 19 digits; the
-- order is at most 2^64 - 1 (2^63 - 1 for a commit ticket), the sequence
-- at most 2^63 - 1.
CREATE FUNCTION outbox.parse_position(pos text, OUT txid xid8, OUT seq bigint)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
	m pg_catalog.text[];
BEGIN
	IF pos IS NULL THEN
		RAISE EXCEPTION 'position must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	m := pg_catalog.regexp_match(pos, '^([0-9]{1,20})-([0-9]{1,19})$');
	IF m IS NULL THEN
		RAISE EXCEPTION 'invalid feed position "%"', pos
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'A position is written "<transaction id>-<sequence>", for example "1042-3".';
	END IF;
	IF m[1]::pg_catalog.numeric OPERATOR(pg_catalog.>) 18446744073709551615::pg_catalog.numeric
	   OR m[2]::pg_catalog.numeric OPERATOR(pg_catalog.>) 9223372036854775807::pg_catalog.numeric THEN
		RAISE EXCEPTION 'invalid feed position "%"', pos
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'A part of the position is out of range.';
	END IF;
	txid := m[1]::pg_catalog.xid8;
	seq := m[2]::pg_catalog.int8;
END
$$;
COMMENT ON FUNCTION outbox.parse_position(text) IS 'pg_outbox: splits a feed position "<txid>-<seq>"';

-- Splits a commit-order position "<ticket>-<seq>".
CREATE FUNCTION outbox.parse_commit_position(pos text, OUT ticket bigint, OUT seq bigint)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
	m pg_catalog.text[];
BEGIN
	IF pos IS NULL THEN
		RAISE EXCEPTION 'position must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	m := pg_catalog.regexp_match(pos, '^([0-9]{1,20})-([0-9]{1,19})$');
	IF m IS NULL THEN
		RAISE EXCEPTION 'invalid feed position "%"', pos
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'A position is written "<transaction id>-<sequence>", for example "1042-3".';
	END IF;
	IF m[1]::pg_catalog.numeric OPERATOR(pg_catalog.>) 18446744073709551615::pg_catalog.numeric
	   OR m[2]::pg_catalog.numeric OPERATOR(pg_catalog.>) 9223372036854775807::pg_catalog.numeric THEN
		RAISE EXCEPTION 'invalid feed position "%"', pos
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'A part of the position is out of range.';
	END IF;
	IF m[1]::pg_catalog.numeric OPERATOR(pg_catalog.>) 9223372036854775807::pg_catalog.numeric THEN
		RAISE EXCEPTION 'invalid feed position "%"', pos
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'The commit ticket is out of range.';
	END IF;
	ticket := m[1]::pg_catalog.int8;
	seq := m[2]::pg_catalog.int8;
END
$$;
COMMENT ON FUNCTION outbox.parse_commit_position(text) IS 'pg_outbox: splits a commit-order position "<ticket>-<seq>"';

-- A group's position as this server's: a group re-anchored in another
-- cluster (outbox_reanchor) adds an epoch to the transaction id or ticket
-- of its positions; this takes it off. Text that is no position is
-- returned as is, for the parser to refuse.
CREATE FUNCTION outbox.unshift_position(pos text, epoch bigint)
RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
	m pg_catalog.text[];
	ord pg_catalog.numeric;
BEGIN
	IF epoch OPERATOR(pg_catalog.<) 0::pg_catalog.int8 THEN
		RAISE EXCEPTION 'epoch must not be negative' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF epoch OPERATOR(pg_catalog.=) 0::pg_catalog.int8 THEN
		RETURN pos;
	END IF;
	m := pg_catalog.regexp_match(pos, '^([0-9]{1,20})(-[0-9]{1,19})$');
	IF m IS NULL THEN
		RETURN pos;
	END IF;
	ord := m[1]::pg_catalog.numeric;
	IF ord OPERATOR(pg_catalog.<) epoch::pg_catalog.numeric THEN
		RAISE EXCEPTION 'position % is from before the group was re-anchored', pos
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = pg_catalog.format('The group''s positions start at %s since outbox_reanchor().', epoch);
	END IF;
	-- In decimal; above 2^64 - 1 it is left for the parser to refuse.
	RETURN (ord OPERATOR(pg_catalog.-) epoch::pg_catalog.numeric)::pg_catalog.text OPERATOR(pg_catalog.||) m[2];
END
$$;
COMMENT ON FUNCTION outbox.unshift_position(text, bigint) IS 'pg_outbox: a re-anchored group''s position as this server''s (the epoch taken off)';
