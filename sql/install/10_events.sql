-- pg_outbox install script, part 10: events, partitions, horizons, emission.
-- (assembled with the other parts of sql/install/; see 00_schema_roles.sql).

--
-- The event table: insert-only, range-partitioned on the emitting
-- transaction's top-level id. (txid, seq) is the feed position: txid orders
-- transactions, seq orders the events within one transaction.
--
CREATE TABLE outbox.event (
	txid xid8 NOT NULL,
	seq bigint NOT NULL,
	event_id uuid NOT NULL,
	topic text NOT NULL,
	key text,
	payload jsonb NOT NULL,
	headers jsonb,
	created_at timestamptz NOT NULL,
	CONSTRAINT event_pkey PRIMARY KEY (txid, seq)
) PARTITION BY RANGE (txid);
COMMENT ON TABLE outbox.event IS 'pg_outbox events: insert-only, partitioned by transaction id; write with outbox_emit()';
COMMENT ON COLUMN outbox.event.txid IS 'top-level transaction id of the emitting transaction';
COMMENT ON COLUMN outbox.event.seq IS 'order of the event within its transaction';

-- Catches any row beyond the premade partitions, so that emission never
-- fails for want of a partition.
CREATE TABLE outbox.event_default PARTITION OF outbox.event DEFAULT;
COMMENT ON TABLE outbox.event_default IS 'pg_outbox: events beyond the premade partitions (normally empty)';

--
-- Commit order: one marker per committed transaction that emitted, written
-- at its pre-commit with the ticket that orders commits (extension/commit.c;
-- only when pg_outbox is preloaded). Partitioned like outbox.event with the
-- same bounds: the markers of a range of transactions are made and retired
-- with their events.
--
-- Readers scan markers in ticket order, by the one index (txid included, so
-- that the scan reads no heap). There is no key on txid: the commit callback
-- writes one marker per transaction and nothing looks one up by its
-- transaction, and a second index would cost every emitting transaction
-- about a third of its marker's instructions.
--
CREATE TABLE outbox.commit_log (
	txid xid8 NOT NULL,
	ticket bigint NOT NULL
) PARTITION BY RANGE (txid);
CREATE INDEX commit_log_ticket_idx ON outbox.commit_log (ticket) INCLUDE (txid);
COMMENT ON TABLE outbox.commit_log IS 'pg_outbox: commit ticket of each committed transaction that emitted; orders commit-ordered groups';
COMMENT ON COLUMN outbox.commit_log.ticket IS 'commit ticket: tickets grow in the order in which transactions committed';
CREATE TABLE outbox.commit_log_default PARTITION OF outbox.commit_log DEFAULT;
COMMENT ON TABLE outbox.commit_log_default IS 'pg_outbox: commit markers beyond the premade partitions (normally empty)';

-- Name of the partition that starts at "lower".
CREATE FUNCTION outbox.partition_name(lower xid8)
RETURNS name
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT pg_catalog.format('event_%s', lower)::name $$;
COMMENT ON FUNCTION outbox.partition_name(xid8) IS 'pg_outbox: name of the event partition starting at a transaction id';

-- Name of the commit marker partition that starts at "lower".
CREATE FUNCTION outbox.commit_partition_name(lower xid8)
RETURNS name
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT pg_catalog.format('commit_log_%s', lower)::name $$;
COMMENT ON FUNCTION outbox.commit_partition_name(xid8) IS 'pg_outbox: name of the commit marker partition starting at a transaction id';

-- The range partitions of outbox.event with their bounds.
CREATE FUNCTION outbox.partition_bounds(OUT relid regclass, OUT name name, OUT lower xid8, OUT upper xid8)
RETURNS SETOF record
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
	SELECT c.oid::regclass, c.relname, b[1]::xid8, b[2]::xid8
	  FROM pg_inherits i
	  JOIN pg_class c ON c.oid = i.inhrelid
	 CROSS JOIN LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid),
									 'FROM \(''(\d+)''\) TO \(''(\d+)''\)') b
	 WHERE i.inhparent = 'outbox.event'::regclass
	   AND b IS NOT NULL
	 ORDER BY 3
$$;
COMMENT ON FUNCTION outbox.partition_bounds() IS 'pg_outbox: the range partitions of outbox.event and their bounds';

-- The range a new partition for transaction id "x" gets: partition_width
-- wide and aligned, clipped so as not to overlap the partitions around it
-- (they may have another width). NULL when a partition holds "x" already.
CREATE FUNCTION outbox.free_range(x xid8, OUT lower xid8, OUT upper xid8)
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	width numeric := (SELECT partition_width FROM outbox.config);
	lo numeric := div(x::text::numeric, width) * width;
	hi numeric := lo + width;
	b record;
BEGIN
	FOR b IN SELECT * FROM outbox.partition_bounds() LOOP
		IF b.lower <= x AND x < b.upper THEN
			RETURN;
		END IF;
		IF b.upper <= x AND b.upper::text::numeric > lo THEN
			lo := b.upper::text::numeric;
		END IF;
		IF b.lower > x AND b.lower::text::numeric < hi THEN
			hi := b.lower::text::numeric;
		END IF;
	END LOOP;
	lower := lo::text::xid8;
	upper := hi::text::xid8;
END
$$;
COMMENT ON FUNCTION outbox.free_range(xid8) IS 'pg_outbox: the bounds a new event partition holding a transaction id gets';

-- Creates the partitions [lower, upper) of outbox.event and of
-- outbox.commit_log and attaches them, moving into each the rows of its
-- default partition that belong to it, all in the caller's
-- (sub)transaction: readers see the rows in the default partition or in
-- the new one, never in neither. The default partition is locked first:
-- the attach scans it. Returns the events moved.
-- Makes a table pg_outbox created a member of the extension, or no longer
-- one, whichever it is not yet (during CREATE EXTENSION tables are members
-- already). Event and marker partitions are members: pg_dump leaves them
-- out, with their events, which another cluster's transaction ids could not
-- order. Inbox partitions are not: they are dumped, rows and all.
CREATE FUNCTION outbox.set_member(rel regclass, member boolean)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	ext name;
BEGIN
	-- pg_outbox, pg_outbox_sql, or none: the SQL engine installed by a plain
	-- script (sql/pg_outbox_sql.sql) has no extension to be a member of.
	SELECT x.extname INTO ext
	  FROM pg_depend d JOIN pg_extension x ON x.oid = d.refobjid
	 WHERE d.classid = 'pg_class'::regclass AND d.objid = 'outbox.config'::regclass
	   AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e';
	IF ext IS NOT NULL AND member <> EXISTS (SELECT 1 FROM pg_depend d
											  WHERE d.classid = 'pg_class'::regclass AND d.objid = rel
												AND d.deptype = 'e') THEN
		EXECUTE format('ALTER EXTENSION %I %s TABLE %s', ext, CASE WHEN member THEN 'ADD' ELSE 'DROP' END, rel);
	END IF;
END
$$;
COMMENT ON FUNCTION outbox.set_member(regclass, boolean) IS 'pg_outbox: makes a table a member of the extension, or no longer one';

CREATE FUNCTION outbox.attach_range(lower xid8, upper xid8)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	parent text;
	part name;
	n bigint;
	moved bigint;
BEGIN
	-- The events' partition, then the commit markers' partition of the same
	-- transactions.
	FOREACH parent IN ARRAY ARRAY['event', 'commit_log'] LOOP
		part := CASE parent WHEN 'event' THEN outbox.partition_name(lower) ELSE outbox.commit_partition_name(lower) END;
		EXECUTE format('LOCK TABLE outbox.%I IN ACCESS EXCLUSIVE MODE', parent || '_default');
		EXECUTE format('CREATE TABLE outbox.%I (LIKE outbox.%I INCLUDING DEFAULTS)', part, parent);
		PERFORM outbox.set_member(format('outbox.%I', part)::regclass, true);
		EXECUTE format('WITH moved AS (DELETE FROM outbox.%I WHERE txid >= %L AND txid < %L RETURNING *)
						INSERT INTO outbox.%I SELECT * FROM moved', parent || '_default', lower, upper, part);
		GET DIAGNOSTICS n = ROW_COUNT;
		moved := coalesce(moved, n);
		-- A valid constraint spares the attach a scan of the new table.
		EXECUTE format('ALTER TABLE outbox.%I ADD CONSTRAINT %I CHECK (txid >= %L AND txid < %L)',
					   part, part || '_bounds', lower, upper);
		EXECUTE format('ALTER TABLE outbox.%I ATTACH PARTITION outbox.%I FOR VALUES FROM (%L) TO (%L)',
					   parent, part, lower, upper);
		EXECUTE format('ALTER TABLE outbox.%I DROP CONSTRAINT %I', part, part || '_bounds');
	END LOOP;
	RETURN moved;
END
$$;
COMMENT ON FUNCTION outbox.attach_range(xid8, xid8) IS 'pg_outbox: creates and attaches an event partition and its commit marker partition, moving their rows out of the default partitions';

-- Install: the partitions from the current transaction id to the headroom.
DO $install$
DECLARE
	x numeric := pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text::numeric;
	width numeric := (SELECT c.partition_width::numeric FROM outbox.config c);
	r record;
BEGIN
	FOR i IN 0 .. (SELECT c.premake FROM outbox.config c) LOOP
		SELECT * INTO r
		  FROM outbox.free_range((x OPERATOR(pg_catalog.+) (i::numeric OPERATOR(pg_catalog.*) width))::text::xid8);
		IF r.lower IS NOT NULL THEN
			PERFORM outbox.attach_range(r.lower, r.upper);
		END IF;
	END LOOP;
END
$install$;

--
-- The feed horizon: every transaction id below it has finished, so the
-- committed events below it are final and no event can still appear there.
-- This is the single definition of the xid8 feed's horizon; the view and the
-- fetch function inline it.
--
CREATE FUNCTION outbox.horizon()
RETURNS xid8
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT pg_catalog.pg_snapshot_xmin(pg_catalog.pg_current_snapshot()) $$;
COMMENT ON FUNCTION outbox.horizon() IS 'pg_outbox: xid8 feed horizon; all events of transactions below it are final';

CREATE VIEW outbox.feed AS
	SELECT e.txid, e.seq, e.event_id, e.topic, e.key, e.payload, e.headers, e.created_at
	  FROM outbox.event e
	 WHERE e.txid < outbox.horizon()
	 ORDER BY e.txid, e.seq;
COMMENT ON VIEW outbox.feed IS 'pg_outbox: committed events below the horizon, in feed order';

-- @engine commit_order@

--
-- W3C trace context: the validation of traceparent and tracestate (the
-- engine's), and the valid trace context of an event's headers, which
-- every path that runs a handler passes to it.
--
-- @engine trace@

CREATE FUNCTION outbox.trace_context(headers jsonb, OUT traceparent text, OUT tracestate text)
RETURNS record
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
	SELECT t.p,
		   CASE WHEN t.p IS NOT NULL
					 AND pg_catalog.jsonb_typeof(headers OPERATOR(pg_catalog.->) 'tracestate') OPERATOR(pg_catalog.=) 'string'
					 AND outbox.tracestate_fault(headers OPERATOR(pg_catalog.->>) 'tracestate') IS NULL
				THEN headers OPERATOR(pg_catalog.->>) 'tracestate' END
	  FROM (SELECT CASE WHEN pg_catalog.jsonb_typeof(headers OPERATOR(pg_catalog.->) 'traceparent') OPERATOR(pg_catalog.=) 'string'
							 AND outbox.traceparent_fault(headers OPERATOR(pg_catalog.->>) 'traceparent') IS NULL
						THEN headers OPERATOR(pg_catalog.->>) 'traceparent' END AS p) t
$$;
COMMENT ON FUNCTION outbox.trace_context(jsonb) IS
	'pg_outbox: the valid W3C traceparent of an event''s headers, and its tracestate when valid too; NULL for what is absent or not valid';

--
-- Emission (C).
--
-- @engine emit@

--
-- Privileges: writers emit; relays read the feed and its horizons.
--
REVOKE ALL ON TABLE outbox.event, outbox.event_default, outbox.commit_log, outbox.commit_log_default, outbox.feed
FROM PUBLIC;
-- The partitions made at install, like the tables they belong to.
DO $revoke$
DECLARE
	p regclass;
BEGIN
	FOR p IN SELECT inhrelid::regclass FROM pg_catalog.pg_inherits
			  WHERE inhparent IN ('outbox.event'::regclass, 'outbox.commit_log'::regclass)
	LOOP
		EXECUTE pg_catalog.format('REVOKE ALL ON TABLE %s FROM PUBLIC', p);
	END LOOP;
END
$revoke$;
REVOKE ALL ON FUNCTION
	outbox.partition_name(xid8),
	outbox.commit_partition_name(xid8),
	outbox.partition_bounds(),
	outbox.free_range(xid8),
	outbox.set_member(regclass, boolean),
	outbox.attach_range(xid8, xid8),
	outbox.horizon(),
	outbox.commit_horizon(),
	outbox.commit_order_available(),
	outbox.commit_order_lock(),
	@extschema@.outbox_emit(text, text, jsonb, jsonb, uuid),
	@extschema@.outbox_emit_many(text, text[], jsonb[], jsonb[], uuid[])
FROM PUBLIC;

GRANT EXECUTE ON FUNCTION
	@extschema@.outbox_emit(text, text, jsonb, jsonb, uuid),
	@extschema@.outbox_emit_many(text, text[], jsonb[], jsonb[], uuid[])
TO outbox_writer, outbox_admin;
GRANT EXECUTE ON FUNCTION outbox.horizon(), outbox.commit_horizon() TO outbox_relay, outbox_admin;
GRANT SELECT ON outbox.feed TO outbox_relay, outbox_admin;
GRANT SELECT ON outbox.event, outbox.commit_log TO outbox_admin;
