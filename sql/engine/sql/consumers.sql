-- Errors when no consumer can have the name (SQL engine: the one
-- definition of the rules; outbox.consumers' check constraint repeats
-- them). No SET clause, as the C declaration: every name is qualified.
CREATE FUNCTION outbox.consumer_name_check(consumer text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
	bytes bytea;
	len integer;
	b integer;
BEGIN
	IF consumer IS NULL THEN
		RAISE EXCEPTION 'consumer must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	len := pg_catalog.octet_length(consumer);
	IF len OPERATOR(pg_catalog.=) 0 THEN
		RAISE EXCEPTION 'consumer must not be empty' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF len OPERATOR(pg_catalog.>) 255 THEN
		RAISE EXCEPTION 'consumer name is too long'
			USING ERRCODE = 'program_limit_exceeded',
				  DETAIL = pg_catalog.format('The name is %s bytes; the limit is %s bytes.', len, 255);
	END IF;
	IF consumer OPERATOR(pg_catalog.~) '[\x01-\x1f\x7f]' THEN
		-- The first such byte, counted in the database's encoding.
		bytes := pg_catalog.convert_to(consumer, pg_catalog.getdatabaseencoding());
		FOR i IN 0 .. len OPERATOR(pg_catalog.-) 1 LOOP
			b := pg_catalog.get_byte(bytes, i);
			IF b OPERATOR(pg_catalog.<) 32 OR b OPERATOR(pg_catalog.=) 127 THEN
				RAISE EXCEPTION 'consumer name must not contain control characters'
					USING ERRCODE = 'invalid_parameter_value',
						  DETAIL = pg_catalog.format('Byte %s of the name is 0x%s.', i OPERATOR(pg_catalog.+) 1,
													 pg_catalog.lpad(pg_catalog.to_hex(b), 2, '0'));
			END IF;
		END LOOP;
	END IF;
END
$$;
COMMENT ON FUNCTION outbox.consumer_name_check(text) IS 'pg_outbox: errors when a consumer name is NULL, empty, over 255 bytes or holds control characters';

-- Errors unless the role may act for the consumer: a member of the role
-- that owns it, or of outbox_admin (superusers are members of every role).
-- It reads outbox.consumers, which consumers may not read, so in the SQL
-- engine it runs as the extension's owner, and the role it checks is the
-- one the session acts as: the role set with SET ROLE, else the session
-- user (inside another SECURITY DEFINER function, that function's owner is
-- not the one checked, as it is in the C engine).
CREATE FUNCTION outbox.consumer_check(consumer text)
RETURNS void
LANGUAGE plpgsql STABLE PARALLEL RESTRICTED SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	acting name := CASE WHEN current_setting('role') = 'none' THEN session_user
						ELSE current_setting('role')::name END;
	caller oid := (SELECT r.oid FROM pg_roles r WHERE r.rolname = acting);
	admin oid := (SELECT r.oid FROM pg_roles r WHERE r.rolname = 'outbox_admin');
	owner oid;
BEGIN
	PERFORM outbox.consumer_name_check(consumer);
	SELECT c.owner INTO owner FROM outbox.consumers c WHERE c.name = consumer;
	IF NOT FOUND OR owner IS NULL THEN
		RAISE EXCEPTION 'consumer "%" is not registered', consumer
			USING ERRCODE = 'insufficient_privilege',
				  HINT = 'An outbox_admin registers it with inbox_consumer_create(), naming the role whose members may act for it.';
	END IF;
	IF admin IS NOT NULL AND pg_has_role(caller, admin, 'MEMBER') THEN
		RETURN;
	END IF;
	IF NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.oid = owner) THEN
		RAISE EXCEPTION 'consumer "%" has no owner', consumer
			USING ERRCODE = 'insufficient_privilege',
				  DETAIL = format('The role that owned it (OID %s) was dropped.', owner),
				  HINT = 'An outbox_admin gives it an owner with inbox_consumer_set_owner().';
	END IF;
	IF pg_has_role(caller, owner, 'MEMBER') IS NOT TRUE THEN
		RAISE EXCEPTION 'permission denied for consumer "%"', consumer
			USING ERRCODE = 'insufficient_privilege',
				  DETAIL = format('Role "%s" is not a member of the role that owns the consumer.', acting),
				  HINT = 'Act for it as a member of its owner, or have an outbox_admin register a consumer of your own with inbox_consumer_create().';
	END IF;
END
$$;
COMMENT ON FUNCTION outbox.consumer_check(text) IS
	'pg_outbox (SQL engine): inbox_consumer_check()''s body, which its other functions call in schema outbox';
REVOKE ALL ON FUNCTION outbox.consumer_check(text) FROM PUBLIC;

-- The API's check, for the application and the relay.
CREATE FUNCTION @extschema@.inbox_consumer_check(consumer text)
RETURNS void
LANGUAGE plpgsql STABLE PARALLEL RESTRICTED SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM outbox.consumer_check(consumer);
END
$$;
COMMENT ON FUNCTION @extschema@.inbox_consumer_check(text) IS
	'pg_outbox: errors (42501) unless the consumer is registered and the current role may act for it';
