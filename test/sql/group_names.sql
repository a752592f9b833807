-- The extension's parser of group names against the shared vectors of
-- test/vectors/group_names.txt, which the relay's unit test
-- GroupName.Vectors reads too. Prints the cases whose result differs from
-- the vector (none), then how many were checked.
CREATE TEMP TABLE vector_lines (n serial, line text);
\copy vector_lines (line) FROM 'test/vectors/group_names.txt'
CREATE TEMP TABLE vectors AS
SELECT n, f[1] AS input, f[2] AS expect_group, f[3] AS expect_shard
  FROM (SELECT n, string_to_array(line, ' | ') AS f FROM vector_lines
         WHERE line <> '' AND line NOT LIKE '#%') v;
CREATE FUNCTION pg_temp.parsed(input text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
	r record;
BEGIN
	r := outbox.split_group_name(input);
	RETURN r.name || ' | ' || coalesce(r.shard::text, 'none');
EXCEPTION WHEN invalid_parameter_value THEN
	RETURN 'error';
END
$$;
SELECT n, input, pg_temp.parsed(input) AS parsed,
       CASE WHEN expect_group = 'error' THEN 'error' ELSE expect_group || ' | ' || expect_shard END AS expected
  FROM vectors
 WHERE pg_temp.parsed(input) IS DISTINCT FROM
       CASE WHEN expect_group = 'error' THEN 'error' ELSE expect_group || ' | ' || expect_shard END
 ORDER BY n;
SELECT count(*) >= 20 AS enough_cases, count(*) FILTER (WHERE expect_group = 'error') >= 10 AS enough_errors
  FROM vectors;
-- The refusals, as callers see them.
\set VERBOSITY terse
SELECT outbox.split_group_name('orders/01');
SELECT outbox.split_group_name(NULL);
SELECT outbox.group_of('orders/x'), outbox.group_of('orders') IS NULL AS no_shard;
SELECT outbox.group_of(''), outbox.group_of('/') = '' AS empty_group, outbox.group_of(NULL) IS NULL AS null_name;
-- The row read behind every call that takes a group name.
SELECT outbox_group_create('gn', shards => 2);
SELECT (outbox.get_group('gn/1')).shard, (outbox.get_group('gn/0', NULL)).shard AS unlocked;
SELECT outbox.get_group('gn');
SELECT outbox.get_group('gn/2');
SELECT outbox.get_group('gn/01');
SELECT outbox.get_group('nope/0', true);
SELECT outbox.get_group(NULL);
-- The rule of a live leader: a lease that has not run out, of a session that runs.
SELECT outbox.leader_live(pg_backend_pid(), outbox.session_started(), clock_timestamp() + interval '1 minute') AS me,
       outbox.leader_live(pg_backend_pid(), outbox.session_started(), clock_timestamp() - interval '1 second') AS ran_out,
       outbox.leader_live(pg_backend_pid(), outbox.session_started() - interval '1 second', 'infinity') AS other_session,
       outbox.leader_live(NULL, NULL, NULL) IS NULL AS no_leader;
SELECT outbox_group_drop('gn');
