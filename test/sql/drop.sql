-- DROP EXTENSION removes everything the extension made (roles are
-- cluster-wide and stay for other databases).
\set VERBOSITY terse
SET client_min_messages = warning;

SELECT outbox_group_create('dropme');
SELECT outbox_emit('t', 'k', '{}') IS NOT NULL AS emitted;
DROP EXTENSION pg_outbox;

SELECT count(*) AS schemas FROM pg_namespace WHERE nspname = 'outbox';
SELECT count(*) AS functions FROM pg_proc WHERE proname LIKE 'outbox\_%' OR proname LIKE 'inbox\_%';
SELECT count(*) AS relations FROM pg_class WHERE relname LIKE 'event\_%' OR relname = 'groups';
SELECT count(*) AS types FROM pg_type WHERE typname IN ('groups', 'event', 'config');

-- And it installs again.
CREATE EXTENSION pg_outbox;
SELECT count(*) AS groups FROM outbox.groups;
