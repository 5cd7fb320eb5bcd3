-- Registers a collector incarnation. A non-retired collector that holds the
-- name (case-insensitively) is retired and the name taken only when it is
-- lost: marked lost, or silent for longer than the published
-- heartbeat_lost_after (never a caller's interval), or drained and idle (a
-- clean stop); otherwise nothing is written and the holder is described
-- (collector_uuid NULL). Bounds, per login role (session_user): at most
-- scheduling_settings.registrations_per_hour registrations in any hour and
-- collectors_per_role non-retired incarnations (SQLSTATE 53400 beyond).
-- Names and hostnames: 1-200 characters, egress keys 1-200, the software
-- version up to 200, none with control characters (SQLSTATE 22023). The
-- secret is returned once; only its SHA-256 is stored.
--
-- owner: bf4ps_definer
-- execute: bf4ps_collector
CREATE OR REPLACE FUNCTION @schema@.bf4ps_collector_register(
    p_name text,
    p_hostname text,
    p_lane text,
    p_egress_key text,
    p_software_version text
) RETURNS TABLE (
    collector_uuid uuid,
    secret uuid,
    holder_hostname text,
    holder_age_s double precision
)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_name text := btrim(p_name);
    v_host text := btrim(p_hostname);
    v_key text := btrim(p_egress_key);
    v_role text := session_user;
    s record;
    h record;
    v_uuid uuid;
    v_secret uuid := gen_random_uuid();
    v_recent bigint;
    v_live bigint;
    v_owner text;
BEGIN
    IF NOT @schema@.bf4ps_name_ok(p_name, 200) THEN
        RAISE EXCEPTION 'collector name must be 1-200 characters without control characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT @schema@.bf4ps_name_ok(p_hostname, 200) THEN
        RAISE EXCEPTION 'hostname must be 1-200 characters without control characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT @schema@.bf4ps_name_ok(p_egress_key, 200) THEN
        RAISE EXCEPTION 'egress key must be 1-200 characters without control characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_lane IS NULL OR p_lane NOT IN ('background', 'interactive') THEN
        RAISE EXCEPTION 'lane must be background or interactive'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_software_version IS NOT NULL AND NOT @schema@.bf4ps_name_ok(p_software_version, 200) THEN
        RAISE EXCEPTION 'software version must be up to 200 characters without control characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT x.heartbeat_lost_after, x.registrations_per_hour, x.collectors_per_role INTO s
    FROM @schema@.scheduling_settings AS x;

    -- One registration at a time, so the bounds are exact (a row lock no
    -- other role can take; registrations are rare).
    PERFORM 1 FROM @schema@.bf4ps_locks WHERE lock_name = 'collector_registration' FOR UPDATE;
    SELECT count(*) FILTER (WHERE cs.created_at > now() - interval '1 hour'),
           count(*) FILTER (WHERE c.retired_at IS NULL)
      INTO v_recent, v_live
    FROM @schema@.collector_secrets AS cs
    JOIN @schema@.collectors AS c ON c.collector_uuid = cs.collector_uuid
    WHERE cs.registered_by = v_role
      AND (cs.created_at > now() - interval '1 hour' OR c.retired_at IS NULL);
    IF v_recent >= s.registrations_per_hour THEN
        RAISE EXCEPTION 'role % registered % collectors in the last hour; the limit is % (scheduling_settings.registrations_per_hour)',
                v_role, v_recent, s.registrations_per_hour
            USING ERRCODE = 'configuration_limit_exceeded',
                  HINT = 'a collector restarting in a loop? see its log; operators raise BF4PS_REGISTRATIONS_PER_HOUR';
    END IF;

    -- An egress key is one host's outbound address: the login role that
    -- registered a live collector on it owns it (another role could pause it
    -- for everyone by reporting throttling, or spend its rate).
    SELECT cs.registered_by INTO v_owner
    FROM @schema@.collectors AS c
    JOIN @schema@.collector_secrets AS cs ON cs.collector_uuid = c.collector_uuid
    WHERE c.egress_key = v_key AND c.retired_at IS NULL AND cs.registered_by <> v_role
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'egress key % is in use by collectors of role %', v_key, v_owner
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'each host registers its own egress key; an operator retires the other role''s collectors first (bf4ps-ops collectors retire NAME)';
    END IF;

    SELECT c.collector_uuid, c.hostname, c.heartbeat_state, c.drained, c.current_job_id,
           extract(epoch FROM now() - c.last_heartbeat_at)::float8 AS age_s,
           (SELECT cs.registered_by FROM @schema@.collector_secrets AS cs
            WHERE cs.collector_uuid = c.collector_uuid) AS registered_by
      INTO h
    FROM @schema@.collectors AS c
    WHERE lower(c.collector_name) = lower(v_name) AND c.retired_at IS NULL
    FOR UPDATE;
    IF FOUND THEN
        -- A name is taken over by the role that registered it only (or,
        -- for collectors registered before this release, by any).
        IF h.registered_by IS NOT NULL AND h.registered_by <> v_role THEN
            RAISE EXCEPTION 'collector name % belongs to role %', v_name, h.registered_by
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'pick another --name, or an operator retires it first (bf4ps-ops collectors retire NAME)';
        END IF;
        IF NOT (h.heartbeat_state = 'lost'
                OR h.age_s IS NULL
                OR h.age_s > extract(epoch FROM s.heartbeat_lost_after)
                OR (h.drained AND h.current_job_id IS NULL)) THEN
            collector_uuid := NULL;
            secret := NULL;
            holder_hostname := h.hostname;
            holder_age_s := CASE WHEN h.age_s >= 0 AND h.age_s < 'Infinity' THEN h.age_s ELSE 0 END;
            RETURN NEXT;
            RETURN;
        END IF;
        UPDATE @schema@.collectors AS c
        SET retired_at = now(), drained = true, updated_at = now()
        WHERE c.collector_uuid = h.collector_uuid;
        IF h.collector_uuid IN (SELECT cs.collector_uuid FROM @schema@.collector_secrets AS cs
                                WHERE cs.registered_by = v_role) THEN
            v_live := v_live - 1;
        END IF;
    END IF;
    IF v_live >= s.collectors_per_role THEN
        RAISE EXCEPTION 'role % has % collectors that are not retired; the limit is % (scheduling_settings.collectors_per_role)',
                v_role, v_live, s.collectors_per_role
            USING ERRCODE = 'configuration_limit_exceeded',
                  HINT = 'retire collectors that are gone (bf4ps-ops collectors retire NAME); operators raise BF4PS_COLLECTORS_PER_ROLE';
    END IF;
    BEGIN
        INSERT INTO @schema@.collectors AS c
            (collector_name, hostname, lane, egress_key, software_version,
             started_at, last_heartbeat_at, heartbeat_state)
        VALUES (v_name, v_host, p_lane, v_key, p_software_version, now(), now(), 'healthy')
        RETURNING c.collector_uuid INTO v_uuid;
    EXCEPTION WHEN unique_violation THEN
        -- A concurrent registration (of another role) took the name.
        collector_uuid := NULL;
        secret := NULL;
        holder_hostname := '(registering concurrently)';
        holder_age_s := 0;
        RETURN NEXT;
        RETURN;
    END;
    INSERT INTO @schema@.collector_secrets (collector_uuid, secret_sha256, registered_by)
    VALUES (v_uuid, sha256(convert_to(v_secret::text, 'UTF8')), v_role);
    collector_uuid := v_uuid;
    secret := v_secret;
    holder_hostname := NULL;
    holder_age_s := NULL;
    RETURN NEXT;
END;
$$;
