-- Records in the inbox the events a consumer applies now, once: for each
-- event, the payload applied before under its id (by an earlier
-- transaction or an earlier event of the same batch), NULL when it is new
-- and recorded now. Takes each event's inbox lock first, in the order of
-- their keys; at REPEATABLE READ and SERIALIZABLE, 40001 when an apply
-- committed after the transaction's snapshot (C, extension/consume.c).
-- Its lookups read the inbox by its unique indexes: a partition analyzed
-- while empty must not get a plan that scans it whole for every event of
-- every batch as it fills.
CREATE FUNCTION outbox.inbox_record(consumer text, event_ids uuid[], payloads jsonb[])
RETURNS jsonb[]
AS 'MODULE_PATHNAME', 'outbox_inbox_record'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off;
COMMENT ON FUNCTION outbox.inbox_record(text, uuid[], jsonb[]) IS
	'pg_outbox: records the events a consumer applies in the inbox, once; returns for each the payload applied before (NULL when new); granted to nobody';
