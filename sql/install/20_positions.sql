-- pg_outbox install script, part 20: feed positions.
-- (assembled with the other parts of sql/install/; see 00_schema_roles.sql).

--
-- Positions: "<txid>-<seq>", the same text as the Redis stream entry id a
-- relay gives the event ("<ticket>-<seq>" in commit order), plus the
-- group's epoch. One parser, in C (position.c), which outbox_fetch() uses
-- too: the same text is refused with the same message everywhere.
--
-- @engine positions@

--
-- Privileges: internal helpers, granted to nobody.
--
REVOKE ALL ON FUNCTION
	outbox.parse_position(text),
	outbox.parse_commit_position(text),
	outbox.unshift_position(text, bigint)
FROM PUBLIC;
