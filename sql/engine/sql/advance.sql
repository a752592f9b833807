-- Moves the cursor forward to the last published position, in PL/pgSQL
-- (advance.c of the C engine, check for check). The row is locked first
-- (FOR NO KEY UPDATE): its leader is the leader until this transaction
-- ends. Then the position, in the group's order, taken off its epoch; the
-- leader (OB003) and the generation it noted (OB002), the checks fetch
-- passes too; "streams", a JSON object of stream names and positions; a
-- position behind the cursor (outbox_rewind() moves a cursor backwards)
-- or beyond the horizon (a transaction still running, or a commit ticket
-- not final yet, would be skipped) is refused. The update renews the
-- leader's lease and merges the streams into the group's bounded record
-- (outbox.recorded_streams()). An advance to the cursor without streams
-- writes nothing.
CREATE FUNCTION @extschema@.outbox_advance(group_name text, pos text, streams jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	grp outbox.groups;
	lpos text;
	new_txid xid8;
	new_ticket bigint;
	new_seq bigint;
	bad record;
	horizon_txid xid8;
	horizon_ticket bigint;
	renewed timestamptz;
BEGIN
	IF group_name IS NULL THEN
		RAISE EXCEPTION 'group name must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	grp := outbox.get_group(group_name, true);
	lpos := outbox.unshift_position(pos, grp.epoch);
	SELECT p.txid, p.seq INTO new_txid, new_seq FROM outbox.parse_position(lpos) p;

	-- The row is locked: its leader is the leader until this transaction ends.
	IF NOT (grp.leader_pid = pg_backend_pid() AND grp.leader_started = outbox.session_started()) IS TRUE THEN
		IF outbox.forget_leadership(grp.id) THEN
			RAISE EXCEPTION 'this session no longer leads group "%"', grp.name
				USING ERRCODE = 'OB003',
					  DETAIL = format('Its lease ran out and another session took the group over (generation %s).',
									  grp.generation),
					  HINT = 'Stand by: what this session published is harmless, and the new leader publishes from the cursor.';
		END IF;
		RAISE EXCEPTION 'this session does not lead group "%"', group_name
			USING ERRCODE = 'OB003',
				  HINT = 'Only the session that fetched the batch with outbox_fetch() may advance the cursor.';
	END IF;
	IF outbox.note_generation(grp.id, grp.generation) <> grp.generation THEN
		RAISE EXCEPTION 'cursor of group "%" was moved by outbox_rewind() while this session led it', grp.name
			USING ERRCODE = 'OB002',
				  DETAIL = format('The cursor is at %s now.', grp.cursor),
				  HINT = 'Fetch again without "after": the next batch starts at the moved cursor.';
	END IF;
	IF streams IS NOT NULL THEN
		IF jsonb_typeof(streams) <> 'object' THEN
			RAISE EXCEPTION 'streams must be a JSON object of stream names and positions'
				USING ERRCODE = 'invalid_parameter_value';
		END IF;
		-- The first wrong entry, in the object's order.
		SELECT s.key, s.value INTO bad
		  FROM jsonb_each(streams) s
		 WHERE jsonb_typeof(s.value) <> 'string' OR (s.value #>> '{}') !~ '^[0-9]{1,20}-[0-9]{1,19}$'
		 LIMIT 1;
		IF FOUND THEN
			RAISE EXCEPTION 'invalid position % for stream "%" in streams', bad.value::text, bad.key
				USING ERRCODE = 'invalid_parameter_value',
					  HINT = 'streams maps each stream name to the last position published there, as a string such as "1042-3".';
		END IF;
	END IF;

	-- The position in the group's order: (ticket, seq) or (txid, seq).
	IF grp.ordering = 'commit' THEN
		SELECT p.ticket, p.seq INTO new_ticket, new_seq FROM outbox.parse_commit_position(lpos) p;
		new_txid := NULL;
		IF (new_ticket, new_seq) < (grp.cursor_ticket, grp.cursor_seq) THEN
			RAISE EXCEPTION 'position % is behind the cursor of group "%"', pos, group_name
				USING ERRCODE = 'invalid_parameter_value',
					  DETAIL = format('The cursor is at %s.', grp.cursor),
					  HINT = 'Use outbox_rewind() to move a cursor backwards.';
		END IF;
		horizon_ticket := outbox.commit_horizon();
		IF new_ticket > horizon_ticket THEN
			RAISE EXCEPTION 'position % is beyond the commit horizon', pos
				USING ERRCODE = 'invalid_parameter_value',
					  DETAIL = format('Commit tickets after %s may still be committing.', horizon_ticket);
		END IF;
		IF streams IS NULL AND new_ticket = grp.cursor_ticket AND new_seq = grp.cursor_seq THEN
			RETURN;
		END IF;
	ELSE
		IF (new_txid, new_seq) < (grp.cursor_txid, grp.cursor_seq) THEN
			RAISE EXCEPTION 'position % is behind the cursor of group "%"', pos, group_name
				USING ERRCODE = 'invalid_parameter_value',
					  DETAIL = format('The cursor is at %s.', grp.cursor),
					  HINT = 'Use outbox_rewind() to move a cursor backwards.';
		END IF;
		horizon_txid := pg_snapshot_xmin(pg_current_snapshot());
		IF new_txid >= horizon_txid THEN
			RAISE EXCEPTION 'position % is beyond the feed horizon', pos
				USING ERRCODE = 'invalid_parameter_value',
					  DETAIL = format('Transactions from %s on may still be running.', horizon_txid);
		END IF;
		IF streams IS NULL AND new_txid = grp.cursor_txid AND new_seq = grp.cursor_seq THEN
			RETURN;
		END IF;
	END IF;

	renewed := clock_timestamp();
	UPDATE outbox.groups g
	   SET cursor_txid = new_txid, cursor_ticket = new_ticket, cursor_seq = new_seq,
		   advanced_at = now(), lease_renewed = renewed, lease_until = renewed + outbox.lease(),
		   streams = outbox.recorded_streams(g, outbox_advance.streams,
											 (coalesce(new_txid::text::numeric, new_ticket::numeric) + grp.epoch)::text
											 || '-' || new_seq)
	 WHERE g.id = grp.id;
END
$$;
COMMENT ON FUNCTION @extschema@.outbox_advance(text, text, jsonb) IS
	'pg_outbox: moves the group''s cursor forward to the last published position (leader only), recording the last position per stream';
