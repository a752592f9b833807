-- W3C trace context in PL/pgSQL: why a traceparent or tracestate is not
-- valid, deciding as extension/trace.c does and in its words (the shared
-- regression test compares them), and the trace context outbox_emit()
-- takes from the settings pg_outbox.traceparent and pg_outbox.tracestate.
CREATE FUNCTION outbox.traceparent_fault(value text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
BEGIN
	IF pg_catalog.octet_length(value) OPERATOR(pg_catalog.<>) 55 THEN
		RETURN pg_catalog.format('is %s bytes, not 55', pg_catalog.octet_length(value));
	END IF;
	IF value OPERATOR(pg_catalog.!~) '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$' THEN
		RETURN 'is not of the form 00-<32 hex>-<16 hex>-<2 hex> in lowercase hex digits';
	END IF;
	IF pg_catalog.substr(value, 1, 2) OPERATOR(pg_catalog.<>) '00' THEN
		RETURN pg_catalog.format('has version %s; only version 00 is valid', pg_catalog.substr(value, 1, 2));
	END IF;
	IF pg_catalog.substr(value, 4, 32) OPERATOR(pg_catalog.=) pg_catalog.repeat('0', 32) THEN
		RETURN 'has an all-zero trace-id';
	END IF;
	IF pg_catalog.substr(value, 37, 16) OPERATOR(pg_catalog.=) pg_catalog.repeat('0', 16) THEN
		RETURN 'has an all-zero parent-id';
	END IF;
	RETURN NULL;
END
$$;
COMMENT ON FUNCTION outbox.traceparent_fault(text) IS
	'pg_outbox: why a value is not a valid W3C traceparent (version 00), or NULL when it is';

CREATE FUNCTION outbox.tracestate_fault(value text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
	members text[];
	member text;
	number integer := 0;
BEGIN
	IF pg_catalog.octet_length(value) OPERATOR(pg_catalog.>) 512 THEN
		RETURN pg_catalog.format('is %s bytes, over 512', pg_catalog.octet_length(value));
	END IF;
	IF value OPERATOR(pg_catalog.~) '[^\x20-\x7e]' THEN
		RETURN 'holds a character outside printable ASCII';
	END IF;
	-- Split as C splits: n commas make n + 1 list-members, empty ones too.
	members := pg_catalog.regexp_split_to_array(value, ',');
	IF pg_catalog.cardinality(members) OPERATOR(pg_catalog.>) 32 THEN
		RETURN pg_catalog.format('has %s list-members, over 32', pg_catalog.cardinality(members));
	END IF;
	FOREACH member IN ARRAY members LOOP
		number := number OPERATOR(pg_catalog.+) 1;
		member := pg_catalog.btrim(member, E' \t');
		IF member OPERATOR(pg_catalog.<>) ''
		   AND member OPERATOR(pg_catalog.!~) ('^([a-z0-9][_0-9a-z*/-]{0,255}|[a-z0-9][_0-9a-z*/-]{0,240}@[a-z][_0-9a-z*/-]{0,13})'
												'=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]$') THEN
			RETURN pg_catalog.format('has an invalid list-member (number %s)', number);
		END IF;
	END LOOP;
	RETURN NULL;
END
$$;
COMMENT ON FUNCTION outbox.tracestate_fault(text) IS
	'pg_outbox: why a value is not a valid W3C tracestate, or NULL when it is';

-- The events' headers with their trace context, for outbox_emit() and
-- outbox_emit_many() (called by them only, as the extension's owner, on
-- their slow path: headers with a "traceparent" or "tracestate" key, or a
-- setting set). As the C engine (extension/emit.c): the headers' values
-- when they have a "traceparent" (the ones not valid removed), else the
-- settings' when valid and the event still fits lim (the
-- pg_outbox.max_payload_size); "dropped" is the detail of the call's one
-- warning (OB006), naming the first value dropped, or NULL. "numbered":
-- the events are elements of arrays (outbox_emit_many()).
CREATE FUNCTION outbox.emit_trace(payloads jsonb[], headers jsonb[], lim bigint, numbered boolean,
								  OUT headers_out jsonb[], OUT dropped text)
RETURNS record
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
	tp text := coalesce(current_setting('pg_outbox.traceparent', true), '');
	ts text := coalesce(current_setting('pg_outbox.tracestate', true), '');
	settings jsonb;
	settings_read boolean := false;
	h jsonb;
	w jsonb;
	p jsonb;
	why text;
	what text;
BEGIN
	headers_out := coalesce(headers, array_fill(NULL::jsonb, ARRAY[cardinality(payloads)]));
	FOR i IN 1 .. cardinality(payloads) LOOP
		h := headers[i];
		p := payloads[i];
		IF h ? 'traceparent' THEN
			-- The headers are the source: the settings are not read.
			what := CASE WHEN numbered THEN format('The "traceparent" of headers %s', i) ELSE 'The "traceparent" of the headers' END;
			why := CASE WHEN jsonb_typeof(h -> 'traceparent') <> 'string' THEN 'is not a JSON string'
						ELSE outbox.traceparent_fault(h ->> 'traceparent') END;
			IF why IS NOT NULL THEN
				dropped := coalesce(dropped, format('%s %s.', what, why));
				headers_out[i] := h - 'traceparent' - 'tracestate';
				CONTINUE;
			END IF;
			IF h ? 'tracestate' THEN
				why := CASE WHEN jsonb_typeof(h -> 'tracestate') <> 'string' THEN 'is not a JSON string'
							ELSE outbox.tracestate_fault(h ->> 'tracestate') END;
				IF why IS NOT NULL THEN
					what := CASE WHEN numbered THEN format('The "tracestate" of headers %s', i) ELSE 'The "tracestate" of the headers' END;
					dropped := coalesce(dropped, format('%s %s.', what, why));
					headers_out[i] := h - 'tracestate';
				END IF;
			END IF;
			CONTINUE;
		END IF;
		IF h ? 'tracestate' THEN
			what := CASE WHEN numbered THEN format('The "tracestate" of headers %s', i) ELSE 'The "tracestate" of the headers' END;
			dropped := coalesce(dropped, format('%s comes without a "traceparent".', what));
			h := h - 'tracestate';
			headers_out[i] := h;
		END IF;
		CONTINUE WHEN tp = '' AND ts = '';
		IF NOT settings_read THEN
			settings_read := true;
			IF tp = '' THEN
				dropped := coalesce(dropped, 'The setting pg_outbox.tracestate comes without pg_outbox.traceparent.');
			ELSE
				why := outbox.traceparent_fault(tp);
				IF why IS NOT NULL THEN
					dropped := coalesce(dropped, format('The setting pg_outbox.traceparent %s.', why));
				ELSE
					IF ts <> '' THEN
						why := outbox.tracestate_fault(ts);
						IF why IS NOT NULL THEN
							dropped := coalesce(dropped, format('The setting pg_outbox.tracestate %s.', why));
							ts := '';
						END IF;
					END IF;
					settings := jsonb_build_object('traceparent', tp)
								|| CASE WHEN ts <> '' THEN jsonb_build_object('tracestate', ts) ELSE '{}'::jsonb END;
				END IF;
			END IF;
		END IF;
		CONTINUE WHEN settings IS NULL;
		w := coalesce(h, '{}'::jsonb) || settings;
		-- As emit's size check counts: as jsonb, and as JSON text.
		IF pg_column_size(p #> '{}') + pg_column_size(w #> '{}') <= lim
		   AND octet_length(p::text) + octet_length(w::text) <= lim THEN
			headers_out[i] := w;
		ELSIF pg_column_size(p #> '{}') + coalesce(pg_column_size(h #> '{}'), 0) <= lim
			  AND octet_length(p::text) + coalesce(octet_length(h::text), 0) <= lim THEN
			dropped := coalesce(dropped, 'The setting pg_outbox.traceparent would make the event larger than pg_outbox.max_payload_size.');
		END IF;
	END LOOP;
END
$$;
COMMENT ON FUNCTION outbox.emit_trace(jsonb[], jsonb[], bigint, boolean) IS
	'pg_outbox (SQL engine): the trace context outbox_emit() and outbox_emit_many() give events, and what they dropped';
REVOKE ALL ON FUNCTION outbox.emit_trace(jsonb[], jsonb[], bigint, boolean) FROM PUBLIC;
