-- The size of a jsonb value as JSON text, as the relay publishes it and
-- jsonb's output function prints it, computed without printing it.
CREATE FUNCTION outbox.json_text_size(value jsonb)
RETURNS bigint
AS 'MODULE_PATHNAME', 'outbox_json_text_size'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION outbox.json_text_size(jsonb) IS
	'pg_outbox: the size of a jsonb value as JSON text (as the relay publishes it), computed without printing it';
