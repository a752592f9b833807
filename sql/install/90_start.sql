-- pg_outbox install script, part 90: maintenance starts.
-- (assembled with the other parts of sql/install/; see 00_schema_roles.sql).

--
-- Maintenance of this database starts as soon as the install commits
-- (when pg_outbox is preloaded; see worker.c).
--
-- @engine maintenance_wake@
REVOKE ALL ON FUNCTION outbox.maintenance_wake() FROM PUBLIC;
SELECT outbox.maintenance_wake();
