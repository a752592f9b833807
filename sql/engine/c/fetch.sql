-- The next batch after the group's cursor. Takes the group's leadership for
-- this session when it is free (outbox.lead()); returns nothing while
-- another session leads. fetch.c decides where the batch lies from the
-- group's row (leadership, generation, horizons, "after") and feed.c reads
-- it by index, without planning a query: the head of outbox.backlog() (xid8
-- order) or outbox.commit_backlog() (commit order), in feed order. A batch costs
-- O(batch) at any backlog (I-10), and a relay that keeps up with a trickle
-- of commits, fetching many small batches a second, does not pay for a
-- plan each time. With "wait", an empty batch waits for a commit that
-- emitted (pg_outbox preloaded, READ COMMITTED), up to that long.
CREATE FUNCTION @extschema@.outbox_fetch(group_name text, batch_size integer DEFAULT 1000, after text DEFAULT NULL,
										 wait interval DEFAULT NULL)
RETURNS TABLE (pos text, txid xid8, seq bigint, event_id uuid, topic text, key text,
			   payload jsonb, headers jsonb, created_at timestamptz)
AS 'MODULE_PATHNAME', 'outbox_fetch'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER ROWS 1000
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION @extschema@.outbox_fetch(text, integer, text, interval) IS
	'pg_outbox: the next batch of the group''s feed after its cursor (or after a later position); empty while another session leads the group';

-- The same batch packed in one bytea for the relay: the fields it writes to
-- its streams, as text, each with its length (the format is described in
-- extension/pack.c and docs/sql-reference.md). Sending one value costs the server a
-- fraction of sending the rows.
CREATE FUNCTION @extschema@.outbox_fetch_packed(group_name text, batch_size integer DEFAULT 1000,
												after text DEFAULT NULL, wait interval DEFAULT NULL)
RETURNS bytea
AS 'MODULE_PATHNAME', 'outbox_fetch_packed'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION @extschema@.outbox_fetch_packed(text, integer, text, interval) IS
	'pg_outbox: outbox_fetch()''s batch packed in one value, for the relay';
