-- Group and shard names in PL/pgSQL (the C engine: extension/group.c,
-- shard.c).

-- The shard of an event: CRC-32C (Castagnoli, as PostgreSQL's own
-- pg_crc32c and the C engine compute it) of the topic's bytes, a zero byte
-- and the key's bytes (the topic alone without a key), modulo the shards.
-- The bytes are the text's in the database encoding (convert_to() into
-- that encoding converts nothing). It is IMMUTABLE and indexed (the shard
-- indexes on outbox.event), so it must give the C engine's value for
-- every input, and it pins no search_path (an index expression is
-- evaluated under any): everything is qualified.
CREATE FUNCTION outbox.shard_of(topic text, key text, shards integer)
RETURNS integer
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
	crc pg_catalog.int8 := 4294967295;
	b pg_catalog.bytea;
	i pg_catalog.int4;
BEGIN
	IF topic IS NULL OR shards IS NULL THEN
		RETURN NULL;
	END IF;
	IF shards OPERATOR(pg_catalog.<) 1 OR shards OPERATOR(pg_catalog.>) 256 THEN
		RAISE EXCEPTION 'a group has 1 to 256 shards, not %', shards USING ERRCODE = 'invalid_parameter_value';
	END IF;
	b := pg_catalog.convert_to(topic, pg_catalog.getdatabaseencoding());
	IF key IS NOT NULL THEN
		b := b OPERATOR(pg_catalog.||) pg_catalog.decode('00', 'hex')
			   OPERATOR(pg_catalog.||) pg_catalog.convert_to(key, pg_catalog.getdatabaseencoding());
	END IF;
	-- The table of the reflected polynomial 0x82F63B78 is a constant of
	-- the loop's expression: made once per plan, not per call.
	FOR i IN 0 .. pg_catalog.length(b) OPERATOR(pg_catalog.-) 1 LOOP
		crc := (crc OPERATOR(pg_catalog.>>) 8)
			   OPERATOR(pg_catalog.#) ('{
		0, 4067132163, 3778769143, 324072436, 3348797215, 904991772, 648144872, 3570033899,
				2329499855, 2024987596, 1809983544, 2575936315, 1296289744, 3207089363, 2893594407, 1578318884,
				274646895, 3795141740, 4049975192, 51262619, 3619967088, 632279923, 922689671, 3298075524,
				2592579488, 1760304291, 2075979607, 2312596564, 1562183871, 2943781820, 3156637768, 1313733451,
				549293790, 3537243613, 3246849577, 871202090, 3878099393, 357341890, 102525238, 4101499445,
				2858735121, 1477399826, 1264559846, 3107202533, 1845379342, 2677391885, 2361733625, 2125378298,
				820201905, 3263744690, 3520608582, 598981189, 4151959214, 85089709, 373468761, 3827903834,
				3124367742, 1213305469, 1526817161, 2842354314, 2107672161, 2412447074, 2627466902, 1861252501,
				1098587580, 3004210879, 2688576843, 1378610760, 2262928035, 1955203488, 1742404180, 2511436119,
				3416409459, 969524848, 714683780, 3639785095, 205050476, 4266873199, 3976438427, 526918040,
				1361435347, 2739821008, 2954799652, 1114974503, 2529119692, 1691668175, 2005155131, 2247081528,
				3690758684, 697762079, 986182379, 3366744552, 476452099, 3993867776, 4250756596, 255256311,
				1640403810, 2477592673, 2164122517, 1922457750, 2791048317, 1412925310, 1197962378, 3037525897,
				3944729517, 427051182, 170179418, 4165941337, 746937522, 3740196785, 3451792453, 1070968646,
				1905808397, 2213795598, 2426610938, 1657317369, 3053634322, 1147748369, 1463399397, 2773627110,
				4215344322, 153784257, 444234805, 3893493558, 1021025245, 3467647198, 3722505002, 797665321,
				2197175160, 1889384571, 1674398607, 2443626636, 1164749927, 3070701412, 2757221520, 1446797203,
				137323447, 4198817972, 3910406976, 461344835, 3484808360, 1037989803, 781091935, 3705997148,
				2460548119, 1623424788, 1939049696, 2180517859, 1429367560, 2807687179, 3020495871, 1180866812,
				410100952, 3927582683, 4182430767, 186734380, 3756733383, 763408580, 1053836080, 3434856499,
				2722870694, 1344288421, 1131464017, 2971354706, 1708204729, 2545590714, 2229949006, 1988219213,
				680717673, 3673779818, 3383336350, 1002577565, 4010310262, 493091189, 238226049, 4233660802,
				2987750089, 1082061258, 1395524158, 2705686845, 1972364758, 2279892693, 2494862625, 1725896226,
				952904198, 3399985413, 3656866545, 731699698, 4283874585, 222117402, 510512622, 3959836397,
				3280807620, 837199303, 582374963, 3504198960, 68661723, 4135334616, 3844915500, 390545967,
				1230274059, 3141532936, 2825850620, 1510247935, 2395924756, 2091215383, 1878366691, 2644384480,
				3553878443, 565732008, 854102364, 3229815391, 340358836, 3861050807, 4117890627, 119113024,
				1493875044, 2875275879, 3090270611, 1247431312, 2660249211, 1828433272, 2141937292, 2378227087,
				3811616794, 291187481, 34330861, 4032846830, 615137029, 3603020806, 3314634738, 939183345,
				1776939221, 2609017814, 2295496738, 2058945313, 2926798794, 1545135305, 1330124605, 3173225534,
				4084100981, 17165430, 307568514, 3762199681, 888469610, 3332340585, 3587147933, 665062302,
				2042050490, 2346497209, 2559330125, 1793573966, 3190661285, 1279665062, 1595330642, 2910671697
			   }'::pg_catalog.int8[])[((crc OPERATOR(pg_catalog.#) pg_catalog.get_byte(b, i)::pg_catalog.int8)
									   OPERATOR(pg_catalog.&) 255::pg_catalog.int8)::pg_catalog.int4 OPERATOR(pg_catalog.+) 1];
	END LOOP;
	RETURN ((crc OPERATOR(pg_catalog.#) 4294967295::pg_catalog.int8)
			OPERATOR(pg_catalog.%) shards::pg_catalog.int8)::pg_catalog.int4;
END
$$;
COMMENT ON FUNCTION outbox.shard_of(text, text, integer) IS
	'pg_outbox: the shard of an event among "shards": CRC-32C of the topic, a zero byte and the key (the topic alone without a key), modulo shards';

-- Splits "<group>" or "<group>/<shard>" into the name and the shard (NULL
-- when none is named); raises 22023 for a shard that is no number. The one
-- parser of the grammar, which the SQL functions call: the name is what
-- comes before the first "/", the shard 1 to 3 digits after it, without a
-- leading zero.
CREATE FUNCTION outbox.split_group_name(group_name text, OUT name text, OUT shard integer)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
	m pg_catalog.text[];
BEGIN
	IF group_name IS NULL THEN
		RAISE EXCEPTION 'group name must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF pg_catalog.strpos(group_name, '/') OPERATOR(pg_catalog.=) 0 THEN
		name := group_name;
		RETURN;
	END IF;
	m := pg_catalog.regexp_match(group_name, '^([^/]*)/(0|[1-9][0-9]{0,2})$');
	IF m IS NULL THEN
		RAISE EXCEPTION 'invalid shard name "%"', group_name
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'A shard is named by its group''s name, "/" and its number, from 0: "orders/0".';
	END IF;
	name := m[1];
	shard := m[2]::pg_catalog.int4;
END
$$;
COMMENT ON FUNCTION outbox.split_group_name(text) IS 'pg_outbox: "<group>" or "<group>/<shard>" as the name and the shard';

-- The group a shard name names, whether or not its shard is a number;
-- NULL for a name without a shard. For the calls that take a whole group
-- only, to name it when they refuse a shard.
CREATE FUNCTION outbox.group_of(group_name text)
RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
	SELECT CASE WHEN pg_catalog.strpos(group_name, '/') OPERATOR(pg_catalog.>) 0
				THEN pg_catalog.split_part(group_name, '/', 1) END
$$;
COMMENT ON FUNCTION outbox.group_of(text) IS 'pg_outbox: the group of a shard name "<group>/<shard>", or NULL';

-- Looks up a group, or one shard of a sharded group ("<group>/<shard>"),
-- by name, locking its row when asked; raises 42704 when it does not
-- exist, 22023 for a sharded group named without its shard. The lock
-- first (FOR NO KEY UPDATE, as an UPDATE would take it), which reads the
-- version locked; each statement reads with a new snapshot at READ
-- COMMITTED, as the C engine does.
CREATE FUNCTION outbox.get_group(group_name text, for_update boolean DEFAULT false)
RETURNS outbox.groups
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
	g outbox.groups;
	s record;
	shard_count pg_catalog.int4;
BEGIN
	SELECT * INTO s FROM outbox.split_group_name(group_name);
	IF for_update THEN
		SELECT * INTO g FROM outbox.groups r
		 WHERE r.name OPERATOR(pg_catalog.=) s.name
		   AND r.shard OPERATOR(pg_catalog.=) coalesce(s.shard, 0)
		   FOR NO KEY UPDATE;
	ELSE
		SELECT * INTO g FROM outbox.groups r
		 WHERE r.name OPERATOR(pg_catalog.=) s.name
		   AND r.shard OPERATOR(pg_catalog.=) coalesce(s.shard, 0);
	END IF;
	IF NOT FOUND THEN
		IF s.shard OPERATOR(pg_catalog.>) 0 THEN
			SELECT r.shards INTO shard_count FROM outbox.groups r
			 WHERE r.name OPERATOR(pg_catalog.=) s.name AND r.shard OPERATOR(pg_catalog.=) 0;
			IF FOUND THEN
				RAISE EXCEPTION 'group "%" has no shard %', s.name, s.shard
					USING ERRCODE = 'undefined_object',
						  HINT = CASE WHEN shard_count OPERATOR(pg_catalog.>) 1
									  THEN pg_catalog.format('Its shards are %s/0 to %s/%s.', s.name, s.name,
															 shard_count OPERATOR(pg_catalog.-) 1)
									  ELSE pg_catalog.format('It has one shard: "%s", also named "%s/0".', s.name, s.name) END;
			END IF;
		END IF;
		RAISE EXCEPTION 'group "%" does not exist', s.name
			USING ERRCODE = 'undefined_object',
				  HINT = 'Create it with outbox_group_create().';
	END IF;
	IF s.shard IS NULL AND g.shards OPERATOR(pg_catalog.>) 1 THEN
		RAISE EXCEPTION 'group "%" has % shards: name one', s.name, g.shards
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = pg_catalog.format('Its shards are %s/0 to %s/%s; each has its own cursor and leader.',
										   s.name, s.name, g.shards OPERATOR(pg_catalog.-) 1);
	END IF;
	RETURN g;
END
$$;
COMMENT ON FUNCTION outbox.get_group(text, boolean) IS 'pg_outbox: a group, or a shard of one ("<group>/<shard>"), by name, or error 42704';
