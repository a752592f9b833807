-- Errors when no consumer can have the name (C: the one definition of the
-- rules).
CREATE FUNCTION outbox.consumer_name_check(consumer text)
RETURNS void
AS 'MODULE_PATHNAME', 'outbox_consumer_name_check'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION outbox.consumer_name_check(text) IS 'pg_outbox: errors when a consumer name is NULL, empty, over 255 bytes or holds control characters';

-- Errors unless the current role may act for the consumer (C).
CREATE FUNCTION @extschema@.inbox_consumer_check(consumer text)
RETURNS void
AS 'MODULE_PATHNAME', 'outbox_inbox_consumer_check'
LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION @extschema@.inbox_consumer_check(text) IS
	'pg_outbox: errors (42501) unless the consumer is registered and the current role may act for it';
