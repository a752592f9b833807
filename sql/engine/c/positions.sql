-- The internal helpers that run on every advance (parse_position,
-- parse_commit_position, unshift_position, get_group) pin no search_path
-- of their own: the functions that call them do, and a role that calls
-- them directly runs them with its own privileges. Each SET clause costs a
-- save and restore of settings per call.
CREATE FUNCTION outbox.parse_position(pos text, OUT txid xid8, OUT seq bigint)
AS 'MODULE_PATHNAME', 'outbox_parse_position'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION outbox.parse_position(text) IS 'pg_outbox: splits a feed position "<txid>-<seq>"';

-- Splits a commit-order position "<ticket>-<seq>".
CREATE FUNCTION outbox.parse_commit_position(pos text, OUT ticket bigint, OUT seq bigint)
AS 'MODULE_PATHNAME', 'outbox_parse_commit_position'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION outbox.parse_commit_position(text) IS 'pg_outbox: splits a commit-order position "<ticket>-<seq>"';

-- A group's position as this server's: a group re-anchored in another
-- cluster (outbox_reanchor) adds an epoch to the transaction id or ticket
-- of its positions; this takes it off. Text that is no position is
-- returned as is, for the parser to refuse.
CREATE FUNCTION outbox.unshift_position(pos text, epoch bigint)
RETURNS text
AS 'MODULE_PATHNAME', 'outbox_unshift_position'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION outbox.unshift_position(text, bigint) IS 'pg_outbox: a re-anchored group''s position as this server''s (the epoch taken off)';
