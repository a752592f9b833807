CREATE FUNCTION outbox.shard_of(topic text, key text, shards integer)
RETURNS integer
AS 'MODULE_PATHNAME', 'outbox_shard_of'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION outbox.shard_of(text, text, integer) IS
	'pg_outbox: the shard of an event among "shards": CRC-32C of the topic, a zero byte and the key (the topic alone without a key), modulo shards';

-- Splits "<group>" or "<group>/<shard>" into the name and the shard (NULL
-- when none is named); raises 22023 for a shard that is no number. The one
-- parser of the grammar (group.c), which the SQL functions call.
CREATE FUNCTION outbox.split_group_name(group_name text, OUT name text, OUT shard integer)
AS 'MODULE_PATHNAME', 'outbox_split_group_name'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION outbox.split_group_name(text) IS 'pg_outbox: "<group>" or "<group>/<shard>" as the name and the shard';

-- The group a shard name names, whether or not its shard is a number;
-- NULL for a name without a shard. For the calls that take a whole group
-- only, to name it when they refuse a shard.
CREATE FUNCTION outbox.group_of(group_name text)
RETURNS text
AS 'MODULE_PATHNAME', 'outbox_group_of'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION outbox.group_of(text) IS 'pg_outbox: the group of a shard name "<group>/<shard>", or NULL';

-- Looks up a group, or one shard of a sharded group ("<group>/<shard>"),
-- by name, locking its row when asked; raises 42704 when it does not
-- exist, 22023 for a sharded group named without its shard (group.c).
CREATE FUNCTION outbox.get_group(group_name text, for_update boolean DEFAULT false)
RETURNS outbox.groups
AS 'MODULE_PATHNAME', 'outbox_get_group'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.get_group(text, boolean) IS 'pg_outbox: a group, or a shard of one ("<group>/<shard>"), by name, or error 42704';
