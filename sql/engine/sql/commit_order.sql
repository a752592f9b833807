-- The commit order, refused: a commit-ordered group needs a ticket taken by
-- each committing transaction in the order of commits, and a horizon that
-- never passes a ticket whose transaction is still committing. The C engine
-- keeps both in shared memory, from its commit callback (extension/commit.c);
-- SQL and PL/pgSQL have no hook at the moment of commit, so the SQL engine
-- has xid8-ordered groups only. Whatever would create or read a
-- commit-ordered group comes through commit_order_lock() or commit_horizon()
-- and gets this engine's error (0A000) naming the C engine;
-- commit_order_available() is false, so outbox_group_create() picks the
-- xid8 order by default.

-- The commit horizon: every commit ticket at or below it is final. Read it
-- before the snapshot that reads the markers, in an earlier statement.
CREATE FUNCTION outbox.commit_horizon()
RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT PARALLEL RESTRICTED
AS $$
BEGIN
	RAISE EXCEPTION 'the SQL engine of pg_outbox has no commit order'
		USING ERRCODE = 'feature_not_supported',
			  DETAIL = 'Commit-ordered groups need the commit tickets that the C engine (pg_outbox, preloaded) takes as transactions commit; the SQL engine (pg_outbox_sql) orders groups by transaction id only.',
			  HINT = 'Use the xid8 order (ordering => ''xid8''), or the C engine where C extensions may be installed.';
END
$$;
COMMENT ON FUNCTION outbox.commit_horizon() IS 'pg_outbox: commit horizon; every commit ticket at or below it is final (needs preloading)';

CREATE FUNCTION outbox.commit_order_available()
RETURNS boolean
LANGUAGE sql VOLATILE STRICT PARALLEL SAFE
AS $$ SELECT false $$;
COMMENT ON FUNCTION outbox.commit_order_available() IS 'pg_outbox: whether this server orders commits (pg_outbox preloaded, not a standby)';

-- Waits until no prepared transaction that emitted is pending, and keeps
-- new ones out until the end of the transaction: called by whatever makes
-- a commit-ordered group, which this engine refuses.
CREATE FUNCTION outbox.commit_order_lock()
RETURNS void
LANGUAGE plpgsql VOLATILE STRICT PARALLEL UNSAFE
AS $$
BEGIN
	RAISE EXCEPTION 'the SQL engine of pg_outbox has no commit order'
		USING ERRCODE = 'feature_not_supported',
			  DETAIL = 'Commit-ordered groups need the commit tickets that the C engine (pg_outbox, preloaded) takes as transactions commit; the SQL engine (pg_outbox_sql) orders groups by transaction id only.',
			  HINT = 'Use the xid8 order (ordering => ''xid8''), or the C engine where C extensions may be installed.';
END
$$;
COMMENT ON FUNCTION outbox.commit_order_lock() IS 'pg_outbox: waits for prepared transactions that emitted, and keeps new ones out';
