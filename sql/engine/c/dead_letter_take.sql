-- Locks a dead letter of a consumer the caller may act for, marks it
-- replayed (in the caller's transaction) and returns it.
CREATE FUNCTION outbox.dead_letter_take(dead_letter_id bigint)
RETURNS outbox.dead_letters
AS 'MODULE_PATHNAME', 'outbox_inbox_checked'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.dead_letter_take(bigint) IS
	'pg_outbox: locks a dead letter, marks it replayed and returns it, for inbox_replay()';
