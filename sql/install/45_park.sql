-- pg_outbox install script, part 45: parked keys (consume --on-failure park-key).
-- (assembled with the other parts of sql/install/; see 00_schema_roles.sql).

--
-- A key parks at the first entry fault of one of its entries (its head):
-- from then on every later entry of that (consumer, stream, key) that any
-- worker reads is stored here instead of applied, in the transaction of
-- its batch, and acknowledged in the stream only once that committed
-- (I-9). The head is retried as before (state retrying); when it applies
-- the key drains (draining) and un-parks; when it is dead-lettered the key
-- waits (dead) for inbox_redrive() or inbox_skip(). So no later entry of a
-- key is applied while an earlier one waits for a retry or lies in the
-- dead letters (I-20).
--
-- A key is the key field's bytes, per consumer and stream: two entries
-- with the same bytes have the same key, however they decode. The tables
-- are indexed by the key's SHA-256, so that a key of any length fits a
-- btree. They have no identity column (pg_dump needs no sequence value)
-- and maintenance never touches them: a parked entry was acknowledged in
-- the stream, so it lives here only, past any trimming of the stream.
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

--
-- Privileges: the tables are read by outbox_admin; consumers act on them
-- only through the functions, for the consumers their roles own.
--
REVOKE ALL ON TABLE outbox.parked_keys, outbox.parked_entries FROM PUBLIC;

GRANT SELECT ON outbox.parked_keys, outbox.parked_entries TO outbox_admin;
