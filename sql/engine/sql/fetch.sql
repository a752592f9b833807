-- The next batch of a group's feed, in PL/pgSQL: fetch.c, feed.c and
-- pack.c of the C engine, with the same decisions in the same order.
--
-- - the arguments ("wait" between 0 and 10 s, batch_size between 1 and
--   100000, the group name not null);
-- - the group, by its name's index (outbox.get_group());
-- - the leadership: the leader whose lease is fresh (renewed less than a
--   third of a lease ago) goes on; anyone else asks outbox.lead(), which
--   takes, keeps or refuses the group (OB003 once for a session whose
--   leadership passed to another); nothing is read while another leads;
--   then the generation this session noted (OB002 once after a rewind);
-- - the horizons, read in a statement before the one that reads the
--   batch, so that the batch's snapshot is taken after them, and the
--   refusal (55000) of a cursor ahead of this server;
-- - "after", a later position of the group's order to start from;
-- - the batch: the head of outbox.backlog() or outbox.commit_backlog()
--   after the cursor, inlined into one statement that reads it by index,
--   O(batch) at any backlog (I-10).
--
-- An event whose payload and headers print as more than 256 MB of JSON
-- text can never be published: first in a batch it is refused (OB004),
-- later the batch stops before it. A packed batch also stops before an
-- event that would take it past 64 MB, unless that event comes first. The
-- size of JSON text is octet_length() of the text jsonb's output function
-- writes, the same bytes the C engine counts without writing them.
--
-- "wait": the C engine sleeps among its database's sleepers, which exist
-- only when pg_outbox.so is preloaded; the SQL engine never has them and
-- returns an empty batch at once, as the C engine does when not preloaded.
-- The relay then waits on LISTEN, and the first commit that emitted after
-- it asked (outbox_relay_waiting()) notifies.
CREATE FUNCTION @extschema@.outbox_fetch(group_name text, batch_size integer DEFAULT 1000, after text DEFAULT NULL,
										 wait interval DEFAULT NULL)
RETURNS TABLE (pos text, txid xid8, seq bigint, event_id uuid, topic text, key text,
			   payload jsonb, headers jsonb, created_at timestamptz)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER ROWS 1000
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
	g outbox.groups;
	a record;
	c_txid xid8;
	c_ticket bigint;
	c_seq bigint;
	below xid8;
	next_xid xid8;
	horizon bigint;
	r record;
	saved text[] := ARRAY[current_setting('plan_cache_mode'), current_setting('enable_sort'),
						  current_setting('enable_seqscan'), current_setting('enable_bitmapscan')];
BEGIN
	IF wait IS NOT NULL AND (extract(year FROM wait) <> 0 OR extract(month FROM wait) <> 0 OR extract(day FROM wait) <> 0
							 OR extract(epoch FROM wait) < 0 OR extract(epoch FROM wait) > 10) THEN
		RAISE EXCEPTION 'wait must be between 0 and 10 seconds'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'While it waits, the statement''s snapshot holds back the cleanup horizon of VACUUM.',
				  HINT = 'Call outbox_fetch() again to wait longer.';
	END IF;
	IF batch_size IS NULL THEN
		RAISE EXCEPTION 'batch_size must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF batch_size < 1 OR batch_size > 100000 THEN
		RAISE EXCEPTION 'batch_size % is out of range', batch_size
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'batch_size must be between 1 and 100000.';
	END IF;
	IF group_name IS NULL THEN
		RAISE EXCEPTION 'group name must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	g := outbox.get_group(group_name);

	-- The leader goes on while its lease is fresh; anyone else asks.
	IF NOT (g.leader_pid IS NOT DISTINCT FROM pg_backend_pid()
			AND g.leader_started IS NOT DISTINCT FROM outbox.session_started()
			AND clock_timestamp() < g.lease_renewed + outbox.lease() / 3) IS TRUE THEN
		IF NOT outbox.lead(g.id) THEN
			RETURN;
		END IF;
		g := outbox.get_group(group_name);
	END IF;
	IF outbox.note_generation(g.id, g.generation) <> g.generation THEN
		RAISE EXCEPTION 'cursor of group "%" was moved by outbox_rewind() while this session led it', group_name
			USING ERRCODE = 'OB002',
				  DETAIL = format('The cursor is at %s now.', g.cursor),
				  HINT = 'Fetch again without "after": the next batch starts at the moved cursor.';
	END IF;
	after := outbox.unshift_position(after, g.epoch);
	c_seq := g.cursor_seq;

	IF g.ordering = 'commit' THEN
		IF current_setting('transaction_isolation') <> 'read committed' THEN
			RAISE EXCEPTION 'a commit-ordered group is read at READ COMMITTED only'
				USING ERRCODE = 'invalid_transaction_state',
					  DETAIL = format('This transaction is %s: its snapshot may predate the commit horizon, and events would be skipped.',
									  upper(current_setting('transaction_isolation')));
		END IF;
		c_ticket := g.cursor_ticket;
		horizon := outbox.commit_horizon();
		IF c_ticket > horizon + 1 THEN
			RAISE EXCEPTION 'cursor of group "%" is ahead of this server''s commit tickets', group_name
				USING ERRCODE = 'object_not_in_prerequisite_state',
					  DETAIL = format('The cursor is at ticket %s, the commit horizon is at %s.', c_ticket, horizon),
					  HINT = format('After a restore into another cluster or a failover, re-anchor the group with outbox_reanchor(%L).',
									group_name);
		END IF;
		-- Every transaction with a ticket up to the horizon has ended: its
		-- id is below the next one, read after the horizon.
		below := pg_snapshot_xmax(pg_current_snapshot());
		IF after IS NOT NULL THEN
			SELECT p.ticket, p.seq INTO a FROM outbox.parse_commit_position(after) p;
			IF (a.ticket, a.seq) > (c_ticket, c_seq) THEN
				c_ticket := a.ticket;
				c_seq := a.seq;
			END IF;
		END IF;
		IF g.shards > 1 AND to_regclass(format('outbox.%I', outbox.shard_index_name(g.shards))) IS NULL THEN
			RAISE EXCEPTION 'the index that reads the shards of groups with % shards is missing', g.shards
				USING ERRCODE = 'object_not_in_prerequisite_state',
					  DETAIL = format('Index "outbox.%s" does not exist; a restore makes the extension''s tables without it.',
									  outbox.shard_index_name(g.shards)),
					  HINT = 'Run outbox_maintain(), which makes it.';
		END IF;
		-- Planned with its values, by index only (see outbox_fetch_packed()).
		PERFORM set_config('plan_cache_mode', 'force_custom_plan', true), set_config('enable_sort', 'off', true),
				set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true);
		FOR r IN
			SELECT (CASE WHEN g.epoch = 0 THEN b.ticket::text ELSE (b.ticket::numeric + g.epoch)::text END)
					   || '-' || b.seq AS pos, b.txid, b.seq, b.event_id, b.topic, b.key, b.payload, b.headers,
				   b.created_at, octet_length(b.payload::text) + coalesce(octet_length(b.headers::text), 0) AS size
			  FROM outbox.commit_backlog(c_ticket, c_seq, g.topics, horizon, below, g.shard, g.shards) b
			 LIMIT batch_size
		LOOP
			IF r.size > 268435456 THEN
				EXIT WHEN pos IS NOT NULL;
				RAISE EXCEPTION 'event at position % of group "%" is too large to publish', r.pos, group_name
					USING ERRCODE = 'OB004',
						  DETAIL = format('Its payload and headers print as %s bytes of JSON text, more than the 268435456 bytes any event may print as (the largest pg_outbox.max_payload_size): it was written before outbox_emit() checked the size of JSON text, or not by outbox_emit().',
										  r.size),
						  HINT = format('Pass it with SELECT outbox_skip(%L, %L, ''<reason>''): the group goes on after it, and outbox.skipped_events records it.',
										group_name, r.pos);
			END IF;
			pos := r.pos; txid := r.txid; seq := r.seq; event_id := r.event_id; topic := r.topic; key := r.key;
			payload := r.payload; headers := r.headers; created_at := r.created_at;
			RETURN NEXT;
		END LOOP;
		PERFORM set_config('plan_cache_mode', saved[1], true), set_config('enable_sort', saved[2], true),
				set_config('enable_seqscan', saved[3], true), set_config('enable_bitmapscan', saved[4], true);
		RETURN;
	END IF;

	c_txid := g.cursor_txid;
	SELECT pg_snapshot_xmin(s.s), pg_snapshot_xmax(s.s) INTO below, next_xid FROM pg_current_snapshot() s(s);
	IF c_txid > next_xid THEN
		RAISE EXCEPTION 'cursor of group "%" is ahead of this server''s transaction ids', group_name
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  DETAIL = format('The cursor is at transaction %s, the next transaction id is %s. This happens after a dump and restore into another cluster, or a failover to a server with an older history.',
								  c_txid, next_xid),
				  HINT = format('Re-anchor the group with outbox_reanchor(%L): it goes on from this server''s horizon, with stream ids above those it published.',
								group_name);
	END IF;
	-- A relay that fetches the next batch while the broker still writes
	-- the previous one reads after that batch, not after the cursor.
	IF after IS NOT NULL THEN
		SELECT p.txid, p.seq INTO a FROM outbox.parse_position(after) p;
		IF (a.txid, a.seq) > (c_txid, c_seq) THEN
			c_txid := a.txid;
			c_seq := a.seq;
		END IF;
	END IF;
	IF g.shards > 1 AND to_regclass(format('outbox.%I', outbox.shard_index_name(g.shards))) IS NULL THEN
		RAISE EXCEPTION 'the index that reads the shards of groups with % shards is missing', g.shards
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  DETAIL = format('Index "outbox.%s" does not exist; a restore makes the extension''s tables without it.',
								  outbox.shard_index_name(g.shards)),
				  HINT = 'Run outbox_maintain(), which makes it.';
	END IF;
	-- One generic plan, by index only (see outbox_fetch_packed()).
	PERFORM set_config('plan_cache_mode', CASE WHEN g.shards > 1 THEN 'force_custom_plan' ELSE 'force_generic_plan' END, true),
			set_config('enable_sort', 'off', true), set_config('enable_seqscan', 'off', true),
			set_config('enable_bitmapscan', 'off', true);
	FOR r IN
		SELECT (CASE WHEN g.epoch = 0 THEN b.txid::text ELSE (b.txid::text::numeric + g.epoch)::text END)
				   || '-' || b.seq AS pos, b.txid, b.seq, b.event_id, b.topic, b.key, b.payload, b.headers,
			   b.created_at, octet_length(b.payload::text) + coalesce(octet_length(b.headers::text), 0) AS size
		  FROM outbox.backlog(c_txid, c_seq, g.topics, below, g.shard, g.shards) b
		 ORDER BY b.txid, b.seq
		 LIMIT batch_size
	LOOP
		IF r.size > 268435456 THEN
			EXIT WHEN pos IS NOT NULL;
			RAISE EXCEPTION 'event at position % of group "%" is too large to publish', r.pos, group_name
				USING ERRCODE = 'OB004',
					  DETAIL = format('Its payload and headers print as %s bytes of JSON text, more than the 268435456 bytes any event may print as (the largest pg_outbox.max_payload_size): it was written before outbox_emit() checked the size of JSON text, or not by outbox_emit().',
									  r.size),
					  HINT = format('Pass it with SELECT outbox_skip(%L, %L, ''<reason>''): the group goes on after it, and outbox.skipped_events records it.',
									group_name, r.pos);
		END IF;
		pos := r.pos; txid := r.txid; seq := r.seq; event_id := r.event_id; topic := r.topic; key := r.key;
		payload := r.payload; headers := r.headers; created_at := r.created_at;
		RETURN NEXT;
	END LOOP;
	PERFORM set_config('plan_cache_mode', saved[1], true), set_config('enable_sort', saved[2], true),
			set_config('enable_seqscan', saved[3], true), set_config('enable_bitmapscan', saved[4], true);
END
$$;
COMMENT ON FUNCTION @extschema@.outbox_fetch(text, integer, text, interval) IS
	'pg_outbox: the next batch of the group''s feed after its cursor (or after a later position); empty while another session leads the group';

-- The same batch packed in one bytea for the relay, in the format of
-- extension/pack.c, built by one statement: "OBP1", the count and the
-- first event's age (µs, -1: none) as int4send/int8send write them, then
-- per event seven fields, each its length (int4send, -1: NULL) and its
-- bytes: the position, the uuid's text, the topic, the key, the payload's
-- and the headers' JSON text, created_at in RFC 3339, UTC, microseconds.
-- Texts are taken in the database's encoding, as the C engine copies them.
-- The window sum of the events before each one decides where the 64 MB
-- cap stops the batch, as feed.c's check before each event does.
-- What outbox_fetch_packed() remembers of the last event it refused as too
-- large (see there).
CREATE SEQUENCE outbox.fetch_refused_key AS bigint MINVALUE -9223372036854775808 MAXVALUE 9223372036854775807;
CREATE SEQUENCE outbox.fetch_refused_size AS bigint MINVALUE 0 MAXVALUE 9223372036854775807;
COMMENT ON SEQUENCE outbox.fetch_refused_key IS 'pg_outbox (SQL engine): the identity of the last event a fetch refused as too large';
COMMENT ON SEQUENCE outbox.fetch_refused_size IS 'pg_outbox (SQL engine): the group and size of the last event a fetch refused as too large';
REVOKE ALL ON SEQUENCE outbox.fetch_refused_key, outbox.fetch_refused_size FROM PUBLIC;

CREATE FUNCTION @extschema@.outbox_fetch_packed(group_name text, batch_size integer DEFAULT 1000,
												after text DEFAULT NULL, wait interval DEFAULT NULL)
RETURNS bytea
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	g outbox.groups;
	a record;
	c_txid xid8;
	c_ticket bigint;
	c_seq bigint;
	below xid8;
	next_xid xid8;
	horizon bigint;
	enc name := getdatabaseencoding();
	n bigint;
	events bytea;
	first_created timestamptz;
	big_pos text;
	big_size bigint;
	sizes bigint[];
	lens bigint[];
	overheads bigint[];
	first_pos text;
	first_id uuid;
	k integer;
	used bigint;
	head record;
	remembered bigint;
	n_packed bigint;
	total bigint;
	age bigint;
	commit_order boolean;
	epoch bigint;
	saved text[];
	-- Texts go out as the database stores them (pack.c copies their
	-- bytes): textsend() leaves them so when the client's encoding is the
	-- database's or SQL_ASCII, convert_to() otherwise. The position, the
	-- uuid and the timestamp are ASCII without a backslash: decode(...,
	-- 'escape') copies them into a value of their size, where textsend()
	-- allocates a kilobyte.
	raw boolean := pg_client_encoding() IN (getdatabaseencoding(), 'SQL_ASCII');
	-- created_at in RFC 3339 costs a fifth of a batch with to_char(): the
	-- output of timestamp in the ISO DateStyle, "T" for its space and its
	-- fraction padded to microseconds (bytea functions: no multibyte
	-- character counting), is the same text for years 1 to 9999.
	iso boolean := current_setting('DateStyle') LIKE 'ISO%';
BEGIN
	IF wait IS NOT NULL AND (extract(year FROM wait) <> 0 OR extract(month FROM wait) <> 0 OR extract(day FROM wait) <> 0
							 OR extract(epoch FROM wait) < 0 OR extract(epoch FROM wait) > 10) THEN
		RAISE EXCEPTION 'wait must be between 0 and 10 seconds'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'While it waits, the statement''s snapshot holds back the cleanup horizon of VACUUM.',
				  HINT = 'Call outbox_fetch() again to wait longer.';
	END IF;
	IF batch_size IS NULL THEN
		RAISE EXCEPTION 'batch_size must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF batch_size < 1 OR batch_size > 100000 THEN
		RAISE EXCEPTION 'batch_size % is out of range', batch_size
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'batch_size must be between 1 and 100000.';
	END IF;
	IF group_name IS NULL THEN
		RAISE EXCEPTION 'group name must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	g := outbox.get_group(group_name);

	-- The leader goes on while its lease is fresh; anyone else asks.
	IF NOT (g.leader_pid IS NOT DISTINCT FROM pg_backend_pid()
			AND g.leader_started IS NOT DISTINCT FROM outbox.session_started()
			AND clock_timestamp() < g.lease_renewed + outbox.lease() / 3) IS TRUE THEN
		IF NOT outbox.lead(g.id) THEN
			RETURN '\x4f42503100000000ffffffffffffffff'::bytea;
		END IF;
		g := outbox.get_group(group_name);
	END IF;
	IF outbox.note_generation(g.id, g.generation) <> g.generation THEN
		RAISE EXCEPTION 'cursor of group "%" was moved by outbox_rewind() while this session led it', group_name
			USING ERRCODE = 'OB002',
				  DETAIL = format('The cursor is at %s now.', g.cursor),
				  HINT = 'Fetch again without "after": the next batch starts at the moved cursor.';
	END IF;
	after := outbox.unshift_position(after, g.epoch);
	c_seq := g.cursor_seq;

	commit_order := g.ordering = 'commit';
	epoch := g.epoch;
	IF commit_order THEN
		IF current_setting('transaction_isolation') <> 'read committed' THEN
			RAISE EXCEPTION 'a commit-ordered group is read at READ COMMITTED only'
				USING ERRCODE = 'invalid_transaction_state',
					  DETAIL = format('This transaction is %s: its snapshot may predate the commit horizon, and events would be skipped.',
									  upper(current_setting('transaction_isolation')));
		END IF;
		c_ticket := g.cursor_ticket;
		horizon := outbox.commit_horizon();
		IF c_ticket > horizon + 1 THEN
			RAISE EXCEPTION 'cursor of group "%" is ahead of this server''s commit tickets', group_name
				USING ERRCODE = 'object_not_in_prerequisite_state',
					  DETAIL = format('The cursor is at ticket %s, the commit horizon is at %s.', c_ticket, horizon),
					  HINT = format('After a restore into another cluster or a failover, re-anchor the group with outbox_reanchor(%L).',
									group_name);
		END IF;
		below := pg_snapshot_xmax(pg_current_snapshot());
		IF after IS NOT NULL THEN
			SELECT p.ticket, p.seq INTO a FROM outbox.parse_commit_position(after) p;
			IF (a.ticket, a.seq) > (c_ticket, c_seq) THEN
				c_ticket := a.ticket;
				c_seq := a.seq;
			END IF;
		END IF;
	ELSE
		c_txid := g.cursor_txid;
		SELECT pg_snapshot_xmin(s.s), pg_snapshot_xmax(s.s) INTO below, next_xid FROM pg_current_snapshot() s(s);
		IF c_txid > next_xid THEN
			RAISE EXCEPTION 'cursor of group "%" is ahead of this server''s transaction ids', group_name
				USING ERRCODE = 'object_not_in_prerequisite_state',
					  DETAIL = format('The cursor is at transaction %s, the next transaction id is %s. This happens after a dump and restore into another cluster, or a failover to a server with an older history.',
									  c_txid, next_xid),
					  HINT = format('Re-anchor the group with outbox_reanchor(%L): it goes on from this server''s horizon, with stream ids above those it published.',
									group_name);
		END IF;
		IF after IS NOT NULL THEN
			SELECT p.txid, p.seq INTO a FROM outbox.parse_position(after) p;
			IF (a.txid, a.seq) > (c_txid, c_seq) THEN
				c_txid := a.txid;
				c_seq := a.seq;
			END IF;
		END IF;
	END IF;

	-- A shard is read by its index on outbox.shard_of() (feed.c refuses to
	-- read one without it).
	IF g.shards > 1 AND to_regclass(format('outbox.%I', outbox.shard_index_name(g.shards))) IS NULL THEN
		RAISE EXCEPTION 'the index that reads the shards of groups with % shards is missing', g.shards
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  DETAIL = format('Index "outbox.%s" does not exist; a restore makes the extension''s tables without it.',
								  outbox.shard_index_name(g.shards)),
				  HINT = 'Run outbox_maintain(), which makes it.';
	END IF;

	-- The plan of the batch reads it by index, O(batch) at any backlog
	-- (I-10), whatever the estimates: the planner is left ordered index
	-- scans under a Merge Append only (a row comparison is estimated from
	-- its first column alone, and a backlog of few transaction ids would
	-- look like a handful of rows worth a sort). xid8 order keeps one
	-- generic plan, which prunes partitions at run time and costs no
	-- planning per batch; commit order and shards are planned with their
	-- values (the commit horizon bounds the markers read; a shard's index
	-- is on outbox.shard_of() of its number of shards).
	saved := ARRAY[current_setting('plan_cache_mode'), current_setting('enable_sort'),
				   current_setting('enable_seqscan'), current_setting('enable_bitmapscan')];
	PERFORM set_config('plan_cache_mode', CASE WHEN commit_order OR g.shards > 1 THEN 'force_custom_plan'
											   ELSE 'force_generic_plan' END, true),
			set_config('enable_sort', 'off', true), set_config('enable_seqscan', 'off', true),
			set_config('enable_bitmapscan', 'off', true);

	-- An event refused as too large (OB004) is remembered, by its group,
	-- position and id: a relay that holds at it fetches again every few
	-- seconds, and printing it each time (seconds for hundreds of
	-- megabytes) would keep the server busy for nothing. The refusal aborts
	-- the fetch's transaction, so the memory is kept where a rollback does
	-- not reach, in two sequences: a hash of the event's identity, and the
	-- group's id with the event's size. One event is remembered at a time;
	-- its group forgets it once past it. A fetch reads one sequence when
	-- nothing is remembered, and the group's next event's identity when
	-- something is.
	IF NOT commit_order AND pg_sequence_last_value('outbox.fetch_refused_key'::regclass) IS NOT NULL THEN
		SELECT bl.txid, bl.seq, bl.event_id INTO head
		  FROM outbox.backlog(c_txid, c_seq, g.topics, below, g.shard, g.shards) bl
		 ORDER BY bl.txid, bl.seq
		 LIMIT 1;
		IF FOUND THEN
			first_pos := (CASE WHEN epoch = 0 THEN head.txid::text ELSE (head.txid::text::numeric + epoch)::text END)
						 || '-' || head.seq;
			remembered := pg_sequence_last_value('outbox.fetch_refused_size'::regclass);
			IF hashtextextended(format('%s %s %s', g.id, first_pos, head.event_id), 0)
				 = pg_sequence_last_value('outbox.fetch_refused_key'::regclass) THEN
				big_pos := first_pos;
				big_size := remembered & 4294967295;
			ELSIF remembered >> 32 = g.id THEN
				PERFORM setval('outbox.fetch_refused_key'::regclass, 0, false);
			END IF;
		END IF;
	END IF;

	IF big_pos IS NULL THEN
		-- The batch in one pass. When all of it, and an event's overhead on
		-- top, fits in the cap, no event can have stopped it (before an event,
		-- the bytes of those before it, plus its overhead and JSON text, are at
		-- most the total plus the 27 bytes of a timestamp counted for one
		-- that is NULL): the usual case. An event above 64 MB of JSON text
		-- is left out here, for the exact pass below.
		SELECT count(*), count(x.bytes), sum(octet_length(x.bytes)), string_agg(x.bytes, ''::bytea),
			   (array_agg(x.created_at))[1], array_agg(x.size), array_agg(coalesce(octet_length(x.bytes), -1)),
			   array_agg(x.overhead), (array_agg(x.pos))[1], (array_agg(x.event_id))[1]
		  INTO n, n_packed, total, events, first_created, sizes, lens, overheads, first_pos, first_id
		  FROM (SELECT b.pos, b.event_id, b.size, b.created_at,
									   CASE WHEN b.size > 67108844 THEN NULL ELSE
									   int4send(octet_length(b.pos)) || decode(b.pos, 'escape')
									   || '\x00000024'::bytea || decode(b.event_id::text, 'escape')
									   || int4send(octet_length(b.topic))
									   || CASE WHEN raw THEN textsend(b.topic) ELSE convert_to(b.topic, enc) END
									   || CASE WHEN b.key IS NULL THEN '\xffffffff'::bytea
											   WHEN raw THEN int4send(octet_length(b.key)) || textsend(b.key)
											   ELSE int4send(octet_length(b.key)) || convert_to(b.key, enc) END
									   || CASE WHEN b.p IS NULL THEN '\xffffffff'::bytea
											   WHEN raw THEN int4send(octet_length(b.p)) || textsend(b.p)
											   ELSE int4send(octet_length(b.p)) || convert_to(b.p, enc) END
									   || CASE WHEN b.h IS NULL THEN '\xffffffff'::bytea
											   WHEN raw THEN int4send(octet_length(b.h)) || textsend(b.h)
											   ELSE int4send(octet_length(b.h)) || convert_to(b.h, enc) END
									   || CASE WHEN b.created_at >= '0001-01-01 00:00:00+00' AND b.created_at < '10000-01-01 00:00:00+00'
											   THEN '\x0000001b'::bytea
													|| CASE WHEN iso
															THEN set_byte(decode(b.t, 'escape'), 10, 84)
																 || substring('\x2e303030303030'::bytea
																			  FROM CASE WHEN octet_length(b.t) = 19 THEN 1 ELSE 2 END
																			  FOR 26 - octet_length(b.t))
																 || '\x5a'::bytea
															ELSE textsend(to_char(timezone('UTC', b.created_at),
																				  'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')) END
											   ELSE '\xffffffff'::bytea END
									   END AS bytes,
									   91 + octet_length(b.pos) + octet_length(b.topic) + coalesce(octet_length(b.key), 0) AS overhead
								  FROM (SELECT c.pos, c.event_id, c.topic, c.key, c.p, c.h, c.created_at,
											   CASE WHEN iso THEN timezone('0'::interval, c.created_at)::text END AS t,
											   octet_length(c.p) + coalesce(octet_length(c.h), 0) AS size
										  FROM ((SELECT (CASE WHEN epoch = 0 THEN bl.txid::text
															  ELSE (bl.txid::text::numeric + epoch)::text END) || '-' || bl.seq AS pos,
														bl.event_id, bl.topic, bl.key, bl.payload::text AS p, bl.headers::text AS h, bl.created_at
												   FROM outbox.backlog(c_txid, c_seq, g.topics, below, g.shard, g.shards) bl
												  WHERE NOT commit_order
												  ORDER BY bl.txid, bl.seq
												  LIMIT batch_size)
												UNION ALL
												(SELECT (CASE WHEN epoch = 0 THEN cb.ticket::text
															  ELSE (cb.ticket::numeric + epoch)::text END) || '-' || cb.seq,
														cb.event_id, cb.topic, cb.key, cb.payload::text, cb.headers::text, cb.created_at
												   FROM outbox.commit_backlog(c_ticket, c_seq, g.topics, horizon, below, g.shard, g.shards) cb
												  WHERE commit_order
												  LIMIT batch_size)) c) b) x;
		IF n_packed < n OR total > 67108844 - 27 THEN
			-- The batch stops before the first event that does not fit, as
			-- feed.c checks each event: the bytes of the events before it,
			-- with its overhead and its JSON text, within the cap (the first
			-- event fits if its JSON text is within 256 MB, else OB004). The
			-- first pass's sizes say where, without printing any event again.
			IF sizes[1] > 268435456 THEN
				big_pos := first_pos;
				big_size := sizes[1];
			ELSIF lens[1] < 0 THEN
				-- The first event prints as 64 to 256 MB: it goes alone, packed
				-- here with the cap of a first event.
				batch_size := 1;
				SELECT count(*), string_agg(x.bytes, ''::bytea), min(x.created_at) FILTER (WHERE x.n = 1),
					   min(x.pos) FILTER (WHERE x.too_large), min(x.size) FILTER (WHERE x.too_large)
				  INTO n, events, first_created, big_pos, big_size
				  FROM (SELECT f.*, bool_or(NOT f.fits) OVER (ROWS UNBOUNDED PRECEDING) AS stopped
						  FROM (SELECT e.n, e.pos, e.size, e.created_at, e.bytes,
									   e.n = 1 AND e.size > 268435456 AS too_large,
									   e.n = 1 OR e.size IS NULL
									   OR coalesce(sum(octet_length(e.bytes)) OVER (ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)
										  + e.overhead + e.size <= 67108844 AS fits
								  FROM (SELECT b.n, b.pos, b.size, b.created_at,
										   CASE WHEN b.size > CASE WHEN b.n = 1 THEN 268435456 ELSE 67108844 END THEN NULL ELSE
										   int4send(octet_length(b.pos)) || decode(b.pos, 'escape')
										   || '\x00000024'::bytea || decode(b.event_id::text, 'escape')
										   || int4send(octet_length(b.topic))
										   || CASE WHEN raw THEN textsend(b.topic) ELSE convert_to(b.topic, enc) END
										   || CASE WHEN b.key IS NULL THEN '\xffffffff'::bytea
												   WHEN raw THEN int4send(octet_length(b.key)) || textsend(b.key)
												   ELSE int4send(octet_length(b.key)) || convert_to(b.key, enc) END
										   || CASE WHEN b.p IS NULL THEN '\xffffffff'::bytea
												   WHEN raw THEN int4send(octet_length(b.p)) || textsend(b.p)
												   ELSE int4send(octet_length(b.p)) || convert_to(b.p, enc) END
										   || CASE WHEN b.h IS NULL THEN '\xffffffff'::bytea
												   WHEN raw THEN int4send(octet_length(b.h)) || textsend(b.h)
												   ELSE int4send(octet_length(b.h)) || convert_to(b.h, enc) END
										   || CASE WHEN b.created_at >= '0001-01-01 00:00:00+00' AND b.created_at < '10000-01-01 00:00:00+00'
												   THEN '\x0000001b'::bytea
														|| CASE WHEN iso
																THEN set_byte(decode(b.t, 'escape'), 10, 84)
																	 || substring('\x2e303030303030'::bytea
																				  FROM CASE WHEN octet_length(b.t) = 19 THEN 1 ELSE 2 END
																				  FOR 26 - octet_length(b.t))
																	 || '\x5a'::bytea
																ELSE textsend(to_char(timezone('UTC', b.created_at),
																					  'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')) END
												   ELSE '\xffffffff'::bytea END
										   END AS bytes,
										   91 + octet_length(b.pos) + octet_length(b.topic) + coalesce(octet_length(b.key), 0) AS overhead
									  FROM (SELECT row_number() OVER () AS n, c.pos, c.event_id, c.topic, c.key, c.p, c.h, c.created_at,
												   CASE WHEN iso THEN timezone('0'::interval, c.created_at)::text END AS t,
												   octet_length(c.p) + coalesce(octet_length(c.h), 0) AS size
											  FROM ((SELECT (CASE WHEN epoch = 0 THEN bl.txid::text
																  ELSE (bl.txid::text::numeric + epoch)::text END) || '-' || bl.seq AS pos,
															bl.event_id, bl.topic, bl.key, bl.payload::text AS p, bl.headers::text AS h, bl.created_at
													   FROM outbox.backlog(c_txid, c_seq, g.topics, below, g.shard, g.shards) bl
													  WHERE NOT commit_order
													  ORDER BY bl.txid, bl.seq
													  LIMIT batch_size)
													UNION ALL
													(SELECT (CASE WHEN epoch = 0 THEN cb.ticket::text
																  ELSE (cb.ticket::numeric + epoch)::text END) || '-' || cb.seq,
															cb.event_id, cb.topic, cb.key, cb.payload::text, cb.headers::text, cb.created_at
													   FROM outbox.commit_backlog(c_ticket, c_seq, g.topics, horizon, below, g.shard, g.shards) cb
													  WHERE commit_order
													  LIMIT batch_size)) c) b) e) f) x
				 WHERE NOT x.stopped;
			ELSE
				k := 1;
				used := lens[1];
				WHILE k < n AND (sizes[k + 1] IS NULL
								 OR (lens[k + 1] >= 0 AND used + overheads[k + 1] + sizes[k + 1] <= 67108844)) LOOP
					k := k + 1;
					used := used + lens[k];
				END LOOP;
				n := k;
				events := substring(events FROM 1 FOR used::integer);
			END IF;
		END IF;
		IF big_pos IS NOT NULL AND NOT commit_order THEN
			PERFORM setval('outbox.fetch_refused_key'::regclass,
						   hashtextextended(format('%s %s %s', g.id, first_pos, first_id), 0), true),
					setval('outbox.fetch_refused_size'::regclass,
						   (g.id::bigint << 32) | least(big_size, 4294967295), true);
		END IF;
	END IF;
	PERFORM set_config('plan_cache_mode', saved[1], true), set_config('enable_sort', saved[2], true),
			set_config('enable_seqscan', saved[3], true), set_config('enable_bitmapscan', saved[4], true);
	IF big_pos IS NOT NULL THEN
		RAISE EXCEPTION 'event at position % of group "%" is too large to publish', big_pos, group_name
			USING ERRCODE = 'OB004',
				  DETAIL = format('Its payload and headers print as %s bytes of JSON text, more than the 268435456 bytes any event may print as (the largest pg_outbox.max_payload_size): it was written before outbox_emit() checked the size of JSON text, or not by outbox_emit().',
								  big_size),
				  HINT = format('Pass it with SELECT outbox_skip(%L, %L, ''<reason>''): the group goes on after it, and outbox.skipped_events records it.',
								group_name, big_pos);
	END IF;
	IF n = 0 THEN
		age := -1;
	ELSIF isfinite(first_created) THEN
		age := greatest(((extract(epoch FROM clock_timestamp()) - extract(epoch FROM first_created)) * 1000000)::bigint, 0);
	ELSE
		age := 0;
	END IF;
	RETURN '\x4f425031'::bytea || int4send(n::integer) || int8send(age) || coalesce(events, ''::bytea);
END
$$;
COMMENT ON FUNCTION @extschema@.outbox_fetch_packed(text, integer, text, interval) IS
	'pg_outbox: outbox_fetch()''s batch packed in one value, for the relay';

-- A relay is about to wait for a notification. PostgreSQL serializes the
-- commits of transactions that queued a NOTIFY (a cluster-wide lock from
-- pre-commit until the commit record is flushed), so notifying at every
-- emitting commit would cost concurrent emitters their group commit. As
-- the C engine does in shared memory (extension/wakeup.c), this arms a
-- flag, here the sequence outbox.relays_waiting (which a rollback does not
-- undo), and the first emitting transaction to commit after it disarms it
-- and notifies (outbox.notify_relays()). The relay fetches once more after
-- arming, so a commit can be missed only in the instant between its
-- pre-commit and that fetch, and then the next notification or the
-- relay's poll interval finds it. It returns false: there are no sleepers
-- in outbox_fetch() to wait among, and the relay waits on LISTEN.
CREATE SEQUENCE outbox.relays_waiting AS bigint MINVALUE 0 MAXVALUE 1;
COMMENT ON SEQUENCE outbox.relays_waiting IS 'pg_outbox (SQL engine): 1 while a relay waits for a notification, 0 once one was sent';
REVOKE ALL ON SEQUENCE outbox.relays_waiting FROM PUBLIC;

CREATE FUNCTION @extschema@.outbox_relay_waiting()
RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF pg_sequence_last_value('outbox.relays_waiting'::regclass) IS DISTINCT FROM 1 THEN
		PERFORM setval('outbox.relays_waiting'::regclass, 1, true);
	END IF;
	RETURN false;
END
$$;
COMMENT ON FUNCTION @extschema@.outbox_relay_waiting() IS
	'pg_outbox: a relay waits for a notification; the next committing transaction that emitted sends one';
