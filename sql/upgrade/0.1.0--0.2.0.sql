-- pg_outbox 0.1.0 -> 0.2.0 (ALTER EXTENSION pg_outbox UPDATE): the schema
-- changes, by hand. make builds the upgrade script from this file and the
-- install parts (sql/upgrade.awk), into sql/pg_outbox--0.1.0--0.2.0.sql:
--
-- - everything above the line "-- @functions@" runs first: new tables,
--   columns and constraints, data moved, and the DROP FUNCTION of each
--   function whose result type, argument names or defaults changed, or
--   that 0.2.0 no longer has (CREATE OR REPLACE cannot change those), with
--   the DROP VIEW of a view over one of them;
-- - make puts every function of sql/install/*.sql in place of that line,
--   with its comment and privileges, as the install parts define it (a
--   function changed there is changed here by the next make: never write
--   a function, or its COMMENT ON FUNCTION, in this file);
-- - everything below runs last: what needs the new functions (views over
--   them, triggers, calls).
--
-- test/ops/upgrade.sh compares an updated database with a fresh install of
-- 0.2.0 (every function, table, column, constraint, index, privilege and
-- comment), so a schema change made in sql/install/ and not here fails it.
-- On release, the built script is frozen in sql/released/ and this file
-- goes (CONTRIBUTING.md: "Releasing version B").

\echo Use "ALTER EXTENSION pg_outbox UPDATE TO '0.2.0'" to load this file. \quit

-- (make puts sql/preamble.sql right after the \echo guard above: what the
-- script resolves, and who may own the extension's schema, as in the
-- install script. ALTER EXTENSION UPDATE runs with the search_path
-- CREATE EXTENSION would use.)

REVOKE ALL ON SCHEMA outbox FROM PUBLIC;

--
-- Settings.
--

-- The most entries a consumer may have parked (OB005 past it).
ALTER TABLE outbox.config
	ADD COLUMN park_limit bigint NOT NULL DEFAULT 1000000,
	ADD CONSTRAINT config_park_limit_check CHECK (park_limit >= 1);
COMMENT ON COLUMN outbox.config.park_limit IS 'most entries a consumer may have parked (outbox.parked_entries); parking more fails with SQLSTATE OB005';

--
-- Groups.
--

-- The generation (bumped by rewinds and changes of leader), the leader and
-- its lease (leadership was a session advisory lock), and the epoch of
-- positions (outbox_reanchor); the cursor's text adds the epoch.
ALTER TABLE outbox.groups DROP COLUMN cursor;
ALTER TABLE outbox.groups
	ADD COLUMN epoch bigint NOT NULL DEFAULT 0,
	ADD COLUMN cursor text GENERATED ALWAYS AS (
		(coalesce(cursor_txid::text::numeric, cursor_ticket::numeric) OPERATOR(pg_catalog.+) epoch::numeric)::text
		OPERATOR(pg_catalog.||) '-'::text OPERATOR(pg_catalog.||) cursor_seq::text) STORED,
	ADD COLUMN generation bigint NOT NULL DEFAULT 1,
	ADD COLUMN leader_pid integer,
	ADD COLUMN leader_started timestamptz,
	ADD COLUMN lease_renewed timestamptz,
	ADD COLUMN lease_until timestamptz,
	ADD CONSTRAINT groups_epoch_check CHECK (epoch >= 0);
COMMENT ON COLUMN outbox.groups.cursor IS 'the cursor as a position: "<txid>-<seq>" (xid8 order) or "<ticket>-<seq>" (commit order), plus the epoch';
COMMENT ON COLUMN outbox.groups.epoch IS 'added to the transaction id or ticket of the group''s positions (stream entry ids); set by outbox_reanchor() so that ids keep increasing in another cluster';
COMMENT ON COLUMN outbox.groups.generation IS 'fencing generation, bumped by every change of leader and every outbox_rewind(): a leader that sees another one stops or starts again from the cursor';
COMMENT ON COLUMN outbox.groups.leader_pid IS 'backend pid of the session that leads the group (with leader_started), or null';
COMMENT ON COLUMN outbox.groups.leader_started IS 'start time of the leading backend: with leader_pid, names the session';
COMMENT ON COLUMN outbox.groups.lease_renewed IS 'when the leader last renewed its lease (by fetching or advancing)';
COMMENT ON COLUMN outbox.groups.lease_until IS 'until when the leader holds the group without renewing; a standby may take it over after';

-- Shards (a row, cursor and leader each); the name is unique per shard.
ALTER TABLE outbox.groups
	ADD COLUMN shard integer NOT NULL DEFAULT 0,
	ADD COLUMN shards integer NOT NULL DEFAULT 1,
	DROP CONSTRAINT groups_name_key,
	ADD CONSTRAINT groups_name_key UNIQUE (name, shard),
	ADD CONSTRAINT groups_shard_check CHECK (shards BETWEEN 1 AND 256 AND shard >= 0 AND shard < shards);
COMMENT ON COLUMN outbox.groups.shard IS 'which shard of the group this row is: events with outbox.shard_of(topic, key, shards) = shard (0 when the group has one)';
COMMENT ON COLUMN outbox.groups.shards IS 'how many shards the group has: a row, a cursor and a leader each';

-- The --stream template their relays publish with (recorded by the first
-- leader); the last positions per stream are bounded.
ALTER TABLE outbox.groups
	ADD COLUMN stream_template text,
	ADD CONSTRAINT groups_stream_template_check CHECK (pg_catalog.length(stream_template) BETWEEN 1 AND 1024);
COMMENT ON COLUMN outbox.groups.streams IS 'last position the group''s relay published to each stream, as reported to outbox_advance(): the most recently written ones (pg_outbox.max_group_streams)';
COMMENT ON COLUMN outbox.groups.stream_template IS 'the relay''s --stream template the group publishes with, recorded by its first leader (outbox_stream_template()); changed with outbox_group_set_stream_template()';

-- Relays read the groups and maintenance through outbox_groups() and
-- outbox_maintenance_status(), no longer the tables.
REVOKE SELECT ON outbox.groups, outbox.maintenance FROM outbox_relay;
GRANT SELECT ON outbox.groups, outbox.maintenance TO outbox_admin;

--
-- Events.
--

-- Commit markers: no key on txid (nothing looks a marker up by its
-- transaction); the ticket index is the one readers scan.
ALTER TABLE outbox.commit_log DROP CONSTRAINT commit_log_pkey;

-- Events that cannot be published, passed by outbox_skip().
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
REVOKE ALL ON TABLE outbox.skipped_events FROM PUBLIC;
GRANT SELECT ON outbox.skipped_events TO outbox_admin;

--
-- Inbox.
--

-- Dead letters keep an entry's raw fields.
ALTER TABLE outbox.dead_letters ADD COLUMN fields bytea[];
COMMENT ON COLUMN outbox.dead_letters.fields IS 'the stream entry''s fields exactly as received, names and values in turn (NULL when recorded from typed values)';
COMMENT ON COLUMN outbox.dead_letters.event_id IS 'the entry''s event_id field when it decodes';
COMMENT ON COLUMN outbox.dead_letters.payload IS 'the entry''s payload field when it decodes';

-- Who gave a dead letter up with inbox_skip(), and when (appended last,
-- as in the install part).
ALTER TABLE outbox.dead_letters
	ADD COLUMN skipped_at timestamptz,
	ADD COLUMN skipped_by name;
COMMENT ON COLUMN outbox.dead_letters.skipped_at IS 'when inbox_skip() gave the dead letter up, so that the later entries of its key could drain';
COMMENT ON COLUMN outbox.dead_letters.skipped_by IS 'the session user who gave the dead letter up with inbox_skip()';

-- Replay is the consumers' own business now (inbox_replay checks the
-- consumer); the column grant of 0.1.0 is gone.
REVOKE UPDATE (replayed_at) ON outbox.dead_letters FROM outbox_admin;

-- The registry of consumers.
CREATE TABLE outbox.consumers (
	name text COLLATE "C" NOT NULL,
	owner regrole NOT NULL,
	created_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT consumers_pkey PRIMARY KEY (name),
	CONSTRAINT consumers_name_check CHECK (name <> '' AND pg_catalog.octet_length(name) <= 255
										   AND name !~ '[\x01-\x1f\x7f]')
);
COMMENT ON TABLE outbox.consumers IS 'pg_outbox: registered inbox consumers and the role whose members may act for each';
COMMENT ON COLUMN outbox.consumers.owner IS 'members of this role (and of outbox_admin) may apply, consume, dead-letter and replay for the consumer';
SELECT pg_catalog.pg_extension_config_dump('outbox.consumers', '');
REVOKE ALL ON TABLE outbox.consumers FROM PUBLIC;
GRANT SELECT ON outbox.consumers TO outbox_admin;

-- Every consumer name in use keeps working as in 0.1.0, where any member
-- of outbox_consumer could act for it: it is registered to that role. An
-- admin narrows it with inbox_consumer_set_owner().
INSERT INTO outbox.consumers (name, owner)
SELECT DISTINCT c, 'outbox_consumer'::regrole
  FROM (SELECT consumer FROM outbox.inbox UNION SELECT consumer FROM outbox.dead_letters) u(c)
 WHERE c <> '' AND octet_length(c) <= 255 AND c !~ '[\x01-\x1f\x7f]'
ON CONFLICT DO NOTHING;

-- Consumer names compare byte by byte in the inbox too, as in
-- outbox.consumers: its unique indexes are probed for every event applied.
ALTER TABLE outbox.inbox ALTER COLUMN consumer TYPE text COLLATE pg_catalog."C";

--
-- Parked keys (consume --on-failure park-key): new tables, as in
-- sql/install/45_park.sql.
--

CREATE TABLE outbox.parked_keys (
	consumer text COLLATE pg_catalog."C" NOT NULL,
	stream text COLLATE pg_catalog."C" NOT NULL,
	key bytea NOT NULL,
	key_hash bytea GENERATED ALWAYS AS (pg_catalog.sha256(key)) STORED,
	state text NOT NULL,
	head_entry_id text NOT NULL,
	head_fields bytea[],
	dead_letter_id bigint,
	parked bigint NOT NULL DEFAULT 0,
	deliveries integer NOT NULL DEFAULT 1,
	reason text NOT NULL,
	sqlstate text,
	first_failed_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
	last_failed_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
	redrive_requested_at timestamptz,
	redrive_requested_by name,
	CONSTRAINT parked_keys_pkey PRIMARY KEY (consumer, stream, key_hash),
	CONSTRAINT parked_keys_state_check CHECK (state IN ('retrying', 'draining', 'dead')),
	CONSTRAINT parked_keys_dead_check CHECK (state <> 'dead' OR dead_letter_id IS NOT NULL)
);
COMMENT ON TABLE outbox.parked_keys IS
	'pg_outbox: keys of a consumer''s streams whose later entries are parked, one row per (consumer, stream, key), with the state of the entry that failed first';
COMMENT ON COLUMN outbox.parked_keys.key IS 'the entry''s key field, as received (bytes)';
COMMENT ON COLUMN outbox.parked_keys.key_hash IS 'SHA-256 of the key: the key''s identity in the indexes, whatever its length';
COMMENT ON COLUMN outbox.parked_keys.state IS 'retrying: the head is pending in the stream and retried; draining: the parked entries are being applied in order; dead: the head is dead-lettered and waits for inbox_redrive() or inbox_skip()';
COMMENT ON COLUMN outbox.parked_keys.head_entry_id IS 'the stream entry of the key that failed first';
COMMENT ON COLUMN outbox.parked_keys.head_fields IS 'the head''s fields exactly as received while it is retrying (its dead letter is made from them if the stream loses it)';
COMMENT ON COLUMN outbox.parked_keys.dead_letter_id IS 'the head''s dead letter in outbox.dead_letters (no foreign key: the settings tables are dumped in no order)';
COMMENT ON COLUMN outbox.parked_keys.parked IS 'how many entries of the key are in outbox.parked_entries';
COMMENT ON COLUMN outbox.parked_keys.deliveries IS 'how many times the head was delivered and failed';
COMMENT ON COLUMN outbox.parked_keys.reason IS 'why the head failed last';
COMMENT ON COLUMN outbox.parked_keys.redrive_requested_at IS 'when inbox_redrive() or inbox_skip() last set the key draining';
COMMENT ON COLUMN outbox.parked_keys.redrive_requested_by IS 'the session user who called inbox_redrive() or inbox_skip() last';
SELECT pg_catalog.pg_extension_config_dump('outbox.parked_keys', '');

CREATE TABLE outbox.parked_entries (
	consumer text COLLATE pg_catalog."C" NOT NULL,
	stream text COLLATE pg_catalog."C" NOT NULL,
	entry_id text NOT NULL,
	pos_ms numeric GENERATED ALWAYS AS (pg_catalog.split_part(entry_id, '-'::pg_catalog.text, 1)::pg_catalog.numeric) STORED,
	pos_seq numeric GENERATED ALWAYS AS (pg_catalog.split_part(entry_id, '-'::pg_catalog.text, 2)::pg_catalog.numeric) STORED,
	event_id bytea,
	topic bytea,
	key bytea NOT NULL,
	payload bytea,
	headers bytea,
	key_hash bytea GENERATED ALWAYS AS (pg_catalog.sha256(key)) STORED,
	deliveries integer NOT NULL DEFAULT 0,
	reason text,
	sqlstate text,
	parked_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT parked_entries_pkey PRIMARY KEY (consumer, stream, entry_id)
);
CREATE INDEX parked_entries_order ON outbox.parked_entries (consumer, stream, key_hash, pos_ms, pos_seq);
COMMENT ON TABLE outbox.parked_entries IS
	'pg_outbox: stream entries held back because an earlier entry of their key failed, kept as received until their key drains';
COMMENT ON COLUMN outbox.parked_entries.entry_id IS 'the stream entry id, "<ms>-<seq>"';
COMMENT ON COLUMN outbox.parked_entries.pos_ms IS 'the entry id''s first number: with pos_seq, the entry''s order in its stream';
COMMENT ON COLUMN outbox.parked_entries.pos_seq IS 'the entry id''s second number';
COMMENT ON COLUMN outbox.parked_entries.event_id IS 'the entry''s event_id field, as received (bytes)';
COMMENT ON COLUMN outbox.parked_entries.topic IS 'the entry''s topic field, as received (bytes)';
COMMENT ON COLUMN outbox.parked_entries.key IS 'the entry''s key field, as received (bytes)';
COMMENT ON COLUMN outbox.parked_entries.payload IS 'the entry''s payload field, as received (bytes)';
COMMENT ON COLUMN outbox.parked_entries.headers IS 'the entry''s headers field, as received (bytes)';
COMMENT ON COLUMN outbox.parked_entries.deliveries IS 'how many times a drain applied the entry and it failed';
COMMENT ON COLUMN outbox.parked_entries.reason IS 'why the entry failed last in a drain';
SELECT pg_catalog.pg_extension_config_dump('outbox.parked_entries', '');
REVOKE ALL ON TABLE outbox.parked_keys, outbox.parked_entries FROM PUBLIC;
GRANT SELECT ON outbox.parked_keys, outbox.parked_entries TO outbox_admin;

--
-- Maintenance.
--

-- The last event retention removed (rewinds before it warn). Retirements
-- before this update are not known.
ALTER TABLE outbox.maintenance
	ADD COLUMN retired_txid xid8 NOT NULL DEFAULT '0',
	ADD COLUMN retired_seq bigint NOT NULL DEFAULT 0;
COMMENT ON COLUMN outbox.maintenance.retired_txid IS 'with retired_seq: position of the last event retention removed';

--
-- Functions that cannot be replaced.
--

-- Sharded groups: outbox_group_create() takes the shard count, the
-- backlogs a shard.
DROP FUNCTION @extschema@.outbox_group_create(text, text[], text, text);
DROP FUNCTION outbox.backlog(xid8, bigint, text[], xid8);
DROP FUNCTION outbox.commit_backlog(bigint, bigint, text[], bigint, xid8);
-- The decision of outbox_fetch() where a batch lies moved into C.
DROP FUNCTION outbox.fetch_args(text, integer, text);
DROP FUNCTION outbox.check_commit_read();
-- outbox_group_stats() has more columns: its view goes with it (and comes
-- back below).
DROP VIEW outbox.group_stats;
DROP FUNCTION @extschema@.outbox_group_stats(text);
-- inbox_consume() takes the entries' fields as they come (bytea).
DROP FUNCTION @extschema@.inbox_consume(text, text, text[], text[], text[], text[], text[]);
-- inbox_record() takes the inbox locks of a whole batch itself.
DROP FUNCTION outbox.inbox_lock(bigint);

-- @functions@

-- Settings: a restored row replaces the defaults.
CREATE TRIGGER config_replace BEFORE INSERT ON outbox.config
	FOR EACH ROW EXECUTE FUNCTION outbox.config_replace();

CREATE VIEW outbox.group_stats AS SELECT * FROM @extschema@.outbox_group_stats();
COMMENT ON VIEW outbox.group_stats IS 'pg_outbox: per-group statistics (see outbox_group_stats())';
REVOKE ALL ON TABLE outbox.group_stats FROM PUBLIC;
GRANT SELECT ON outbox.group_stats TO outbox_relay, outbox_admin;

-- Event and commit marker partitions are members of the extension
-- (pg_dump leaves them out); inbox day partitions are not (pg_dump keeps
-- them and their rows).
DO $members$
DECLARE
	r record;
BEGIN
	FOR r IN
		SELECT c.oid::pg_catalog.regclass AS rel, p.relname AS parent
		  FROM pg_catalog.pg_inherits i
		  JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
		  JOIN pg_catalog.pg_class p ON p.oid = i.inhparent
		 WHERE i.inhparent IN ('outbox.event'::pg_catalog.regclass, 'outbox.commit_log'::pg_catalog.regclass,
							   'outbox.inbox'::pg_catalog.regclass)
		   AND c.relname::text OPERATOR(pg_catalog.!~~) '%\_default'::text
	LOOP
		PERFORM outbox.set_member(r.rel, r.parent <> 'inbox'::name);
	END LOOP;
END
$members$;
