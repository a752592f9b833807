-- The size of a jsonb value as JSON text, as the relay publishes it and
-- jsonb's output function prints it. The C engine computes it from the
-- value's entries without printing it; here it is printed (a value whose
-- text would pass 1 GB fails with 54000, "out of memory", where C returns
-- the size).
CREATE FUNCTION outbox.json_text_size(value jsonb)
RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT pg_catalog.octet_length(value::pg_catalog.text)::pg_catalog.int8 $$;
COMMENT ON FUNCTION outbox.json_text_size(jsonb) IS
	'pg_outbox: the size of a jsonb value as JSON text (as the relay publishes it), measured by printing it';
