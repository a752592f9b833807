-- Locks a dead letter of a consumer the caller may act for, marks it
-- replayed (in the caller's transaction) and returns it. It reads
-- outbox.dead_letters and calls a body granted to nobody, so in the SQL
-- engine it runs as the extension's owner; the consumer check takes the
-- role the session acts as (see inbox_consumer_check()).
CREATE FUNCTION outbox.dead_letter_take(dead_letter_id bigint)
RETURNS outbox.dead_letters
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	consumer text;
BEGIN
	IF dead_letter_id IS NULL THEN
		RAISE EXCEPTION 'dead_letter_id must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	SELECT d.consumer INTO consumer FROM outbox.dead_letters d WHERE d.id = dead_letter_id;
	IF consumer IS NULL THEN
		RAISE EXCEPTION 'dead letter % does not exist', dead_letter_id USING ERRCODE = 'undefined_object';
	END IF;
	PERFORM outbox.consumer_check(consumer);
	RETURN outbox.dead_letter_take_unchecked(dead_letter_id);
END
$$;
COMMENT ON FUNCTION outbox.dead_letter_take(bigint) IS
	'pg_outbox: locks a dead letter, marks it replayed and returns it, for inbox_replay()';
