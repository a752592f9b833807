-- pg_outbox install script, part 37: passing an event that cannot be published.
-- (assembled with the other parts of sql/install/; see 00_schema_roles.sql).

--
-- An event whose payload and headers print as more JSON text than any
-- event may (the largest pg_outbox.max_payload_size) cannot be published:
-- a fetch that meets it first in a batch refuses it (SQLSTATE OB004), and
-- the group waits there. outbox_emit() refuses such events; one written
-- before it checked the printed size, or into the table directly, is
-- passed by an admin with outbox_skip(), which moves the cursor past that
-- one event and keeps a copy of it, with the reason, in
-- outbox.skipped_events: like a rewind, the move is logged and bumps the
-- group's generation, and unlike one it loses nothing for good.
--

-- @engine json_size@

CREATE TABLE outbox.skipped_events (
	id bigint GENERATED ALWAYS AS IDENTITY,
	group_name text NOT NULL,
	shard integer NOT NULL,
	pos text NOT NULL,
	txid xid8 NOT NULL,
	seq bigint NOT NULL,
	event_id uuid NOT NULL,
	topic text NOT NULL,
	key text,
	payload jsonb NOT NULL,
	headers jsonb,
	text_size bigint NOT NULL,
	reason text NOT NULL,
	skipped_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
	skipped_by name NOT NULL DEFAULT SESSION_USER,
	CONSTRAINT skipped_events_pkey PRIMARY KEY (id)
);
COMMENT ON TABLE outbox.skipped_events IS
	'pg_outbox: events a group passed without publishing them (outbox_skip), each with a copy of the event and the reason';
COMMENT ON COLUMN outbox.skipped_events.pos IS 'the event''s position in the group, as the fetch reported it';
COMMENT ON COLUMN outbox.skipped_events.text_size IS 'payload and headers as JSON text, in bytes (outbox.json_text_size)';
SELECT pg_catalog.pg_extension_config_dump('outbox.skipped_events', '');

-- Moves the group's cursor past its next event, which must be at "pos",
-- the position a fetch reported (OB004): one event, never more. The
-- event is copied into outbox.skipped_events with the reason; the move is
-- logged and bumps the generation, like outbox_rewind(), so that a relay
-- leading the group starts again after it. Returns the new cursor.
CREATE FUNCTION @extschema@.outbox_skip(group_name text, pos text, reason text)
RETURNS text
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	g outbox.groups;
	e record;
	p record;
	has_next boolean;
	horizon bigint;
	next_pos text;
	new_position text;
BEGIN
	IF pos IS NULL THEN
		RAISE EXCEPTION 'position must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF reason IS NULL OR pg_catalog.btrim(reason) OPERATOR(pg_catalog.=) '' THEN
		RAISE EXCEPTION 'a reason must be given to skip an event'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Say why the event is not published: outbox.skipped_events keeps the reason with a copy of the event.';
	END IF;
	g := outbox.get_group(group_name, true);
	-- The group's next event, as its next fetch would read it.
	IF g.ordering OPERATOR(pg_catalog.=) 'commit' THEN
		-- As a fetch: the commit horizon first, then the snapshot that reads
		-- the events up to it (a new one per statement at READ COMMITTED).
		IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed' THEN
			RAISE EXCEPTION 'a commit-ordered group is read at READ COMMITTED only'
				USING ERRCODE = 'invalid_transaction_state',
					  DETAIL = 'This transaction''s snapshot may predate the commit horizon: the group''s next event could be hidden from it.';
		END IF;
		SELECT c.ticket, c.seq INTO p FROM outbox.parse_commit_position(outbox.unshift_position(pos, g.epoch)) c;
		horizon := outbox.commit_horizon();
		SELECT b.ticket::numeric AS major, b.seq, b.txid, b.event_id, b.topic, b.key, b.payload, b.headers INTO e
		  FROM outbox.commit_backlog(g.cursor_ticket, g.cursor_seq, g.topics, horizon, NULL::xid8, g.shard, g.shards) b
		 LIMIT 1;
		has_next := FOUND;
		IF has_next AND e.major OPERATOR(pg_catalog.=) p.ticket::numeric AND e.seq OPERATOR(pg_catalog.=) p.seq THEN
			UPDATE outbox.groups
			   SET cursor_ticket = p.ticket, cursor_seq = p.seq, advanced_at = pg_catalog.now(),
				   generation = generation OPERATOR(pg_catalog.+) 1::bigint
			 WHERE id OPERATOR(pg_catalog.=) g.id
			RETURNING cursor INTO new_position;
		END IF;
	ELSE
		SELECT x.txid, x.seq INTO p FROM outbox.parse_position(outbox.unshift_position(pos, g.epoch)) x;
		SELECT b.txid::text::numeric AS major, b.seq, b.txid, b.event_id, b.topic, b.key, b.payload, b.headers INTO e
		  FROM outbox.backlog(g.cursor_txid, g.cursor_seq, g.topics, NULL::xid8, g.shard, g.shards) b
		 ORDER BY b.txid, b.seq
		 LIMIT 1;
		has_next := FOUND;
		IF has_next AND e.txid OPERATOR(pg_catalog.=) p.txid AND e.seq OPERATOR(pg_catalog.=) p.seq THEN
			UPDATE outbox.groups
			   SET cursor_txid = p.txid, cursor_seq = p.seq, advanced_at = pg_catalog.now(),
				   generation = generation OPERATOR(pg_catalog.+) 1::bigint
			 WHERE id OPERATOR(pg_catalog.=) g.id
			RETURNING cursor INTO new_position;
		END IF;
	END IF;
	IF new_position IS NULL THEN
		IF has_next THEN
			next_pos := pg_catalog.concat(e.major OPERATOR(pg_catalog.+) g.epoch::numeric, '-', e.seq);
		END IF;
		RAISE EXCEPTION 'position % is not the next event of group "%"', pos, group_name
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = CASE WHEN has_next
								THEN pg_catalog.format('The group''s next event is at %s (its cursor is at %s).', next_pos, g.cursor)
								ELSE pg_catalog.format('The group has no event waiting after its cursor, %s.', g.cursor) END,
				  HINT = 'outbox_skip() passes only the event a fetch of the group refused as too large to publish (SQLSTATE OB004), once the events before it were published.';
	END IF;
	-- A relay of this session that led the group goes on from the moved
	-- cursor without being refused once.
	IF outbox.is_leader(g.id) THEN
		PERFORM outbox.note_generation(g.id, g.generation OPERATOR(pg_catalog.+) 1::bigint);
	END IF;
	INSERT INTO outbox.skipped_events (group_name, shard, pos, txid, seq, event_id, topic, key, payload, headers,
									   text_size, reason)
	VALUES (g.name, g.shard, pos, e.txid, e.seq, e.event_id, e.topic, e.key, e.payload, e.headers,
			outbox.json_text_size(e.payload) OPERATOR(pg_catalog.+) coalesce(outbox.json_text_size(e.headers), 0::bigint),
			reason);
	RAISE LOG 'pg_outbox: group "%" skipped the event at % (event id %, topic "%"): %; cursor moved from % to %',
		group_name, pos, e.event_id, e.topic, reason, g.cursor, new_position;
	RETURN new_position;
END
$$;
COMMENT ON FUNCTION @extschema@.outbox_skip(text, text, text) IS
	'pg_outbox: moves the group''s cursor past its next event, at the position given (one a fetch refused as too large to publish), recording it in outbox.skipped_events';

--
-- Privileges: admins skip, and read what was skipped.
--
REVOKE ALL ON TABLE outbox.skipped_events FROM PUBLIC;
REVOKE ALL ON FUNCTION
	outbox.json_text_size(jsonb),
	@extschema@.outbox_skip(text, text, text)
FROM PUBLIC;

GRANT SELECT ON outbox.skipped_events TO outbox_admin;
GRANT EXECUTE ON FUNCTION
	outbox.json_text_size(jsonb),
	@extschema@.outbox_skip(text, text, text)
TO outbox_admin;
