-- 0006: least privilege and a safe website entry point.
--   * NOLOGIN group roles (cluster-wide; an existing role is kept as it is):
--       bf4ps_collector  what a collector process needs, nothing more;
--       bf4ps_website    EXECUTE on bf4ps_request_refresh only;
--       bf4ps_reader     SELECT for dashboards, `status`, `collectors list`;
--       bf4ps_definer    owner of the SECURITY DEFINER functions, with only
--                        the privileges their bodies need (nobody logs in
--                        as it).
--     Creating them needs CREATEROLE (or a superuser); an administrator who
--     will not grant that runs deploy/sql/roles.sql once instead.
--   * Every SECURITY DEFINER function pins search_path to
--     `pg_catalog, <schema>, pg_temp` (pg_temp last, so a caller's temporary
--     tables can never shadow ours), qualifies every object by schema, and
--     is owned by bf4ps_definer.
--   * Collector incarnations get a secret at registration; heartbeats and
--     the clean-stop mark go through SECURITY DEFINER functions that check
--     it, so a collector's login role cannot write another collector's
--     heartbeat or control flags (enabled, drained, retired_at).
--   * bf4ps_request_refresh refuses to admit new pending interactive jobs
--     beyond scheduling_settings.max_pending_interactive (SQLSTATE 53400).
--
-- The objects live in the schema the earlier migrations used (normally
-- public); the function bodies below name it through the @schema@ token,
-- replaced at migration time.
--
-- RELEASED once merged: never edit this file. Add a new migration instead.

-- ---------------------------------------------------------------------------
-- Roles.
-- ---------------------------------------------------------------------------

DO $roles$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['bf4ps_definer', 'bf4ps_collector', 'bf4ps_website', 'bf4ps_reader']
    LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION
                WHEN duplicate_object OR unique_violation THEN
                    NULL; -- created concurrently (another database of this cluster)
                WHEN insufficient_privilege THEN
                    RAISE EXCEPTION 'role % does not exist and % may not create roles', r, current_user
                        USING HINT = 'run deploy/sql/roles.sql once as a superuser (or a role with '
                                     'CREATEROLE), or give the migrating user CREATEROLE',
                              ERRCODE = 'insufficient_privilege';
            END;
        END IF;
    END LOOP;
    IF (SELECT rolcanlogin FROM pg_catalog.pg_roles WHERE rolname = 'bf4ps_definer') THEN
        RAISE EXCEPTION 'role bf4ps_definer can log in; it owns SECURITY DEFINER functions and must be NOLOGIN'
            USING HINT = 'ALTER ROLE bf4ps_definer NOLOGIN',
                  ERRCODE = 'invalid_role_specification';
    END IF;
    -- Handing functions to bf4ps_definer needs membership of it.
    IF NOT pg_catalog.pg_has_role(current_user, 'bf4ps_definer', 'MEMBER') THEN
        BEGIN
            EXECUTE format('GRANT bf4ps_definer TO %I', current_user);
        EXCEPTION
            WHEN insufficient_privilege THEN
                RAISE EXCEPTION '% is not a member of bf4ps_definer and may not grant it', current_user
                    USING HINT = 'run deploy/sql/roles.sql once as a superuser with OWNER set to this user',
                          ERRCODE = 'insufficient_privilege';
        END;
    END IF;
END
$roles$;

-- ---------------------------------------------------------------------------
-- Collector incarnation secrets (readable by bf4ps_definer only).
-- ---------------------------------------------------------------------------

CREATE TABLE collector_secrets (
    collector_uuid uuid PRIMARY KEY REFERENCES collectors (collector_uuid) ON DELETE CASCADE,
    secret_sha256 bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT collector_secrets_sha256_length CHECK (length(secret_sha256) = 32)
);

-- ---------------------------------------------------------------------------
-- The interactive admission cap.
-- ---------------------------------------------------------------------------

-- Published by `serve` from BF4PS_MAX_PENDING_INTERACTIVE like the ETA inputs.
ALTER TABLE scheduling_settings
    ADD COLUMN max_pending_interactive integer NOT NULL DEFAULT 1000,
    ADD CONSTRAINT scheduling_settings_max_pending_interactive_check
        CHECK (max_pending_interactive > 0);

-- ---------------------------------------------------------------------------
-- SECURITY DEFINER functions, safe by construction. Written with the
-- @schema@ token, created through EXECUTE once the schema is known.
-- ---------------------------------------------------------------------------

DO $functions$
DECLARE
    s text := (SELECT quote_ident(n.nspname)
               FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
               WHERE c.oid = 'collection_jobs'::regclass);
BEGIN
-- Interactive refresh of one soldier, for the website (inside its own
-- transaction) and `bf4ps-ops request`. Behaviour as in 0004, plus the
-- admission cap:
--   * a call that added pending interactive jobs (created or promoted)
--     takes the transaction-scoped advisory lock 7090412320918168685
--     (0x62663470_7361646d, "bf4psadm", src/locks.rs) and counts the
--     pending interactive jobs; admissions are thus serialized from that
--     count until the caller commits: call it in a short transaction;
--   * if more than scheduling_settings.max_pending_interactive are pending
--     then, it raises SQLSTATE 53400 (configuration_limit_exceeded) and
--     nothing it wrote survives. A call that adds nothing is never refused
--     (retries of admitted jobs may exceed the cap; they are not new demand).
EXECUTE replace($body$
CREATE OR REPLACE FUNCTION @schema@.bf4ps_request_refresh(
    platform text,
    persona_id bigint,
    resources text[] DEFAULT ARRAY['detailed', 'profile', 'weapons', 'vehicles'],
    eta_window interval DEFAULT NULL,
    egress_rate double precision DEFAULT NULL
) RETURNS TABLE (
    resource text,
    job_id bigint,
    state text,
    "position" bigint,
    eta_seconds double precision
)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    all_resources constant text[] := ARRAY['detailed', 'profile', 'weapons', 'vehicles'];
    v_platform text := bf4ps_request_refresh.platform;
    v_persona bigint := bf4ps_request_refresh.persona_id;
    v_window interval;
    v_rate double precision;
    v_cap integer;
    v_wanted text[];
    v_bad text;
    v_soldier bigint;
    v_resource text;
    v_job bigint;
    v_status text;
    v_lane text;
    v_class text;
    v_attempts integer;
    v_state text;
    v_settled boolean;
    v_jobs bigint[] := ARRAY[]::bigint[];
    v_states text[] := ARRAY[]::text[];
    v_admitted integer := 0;
    v_pending bigint;
    v_collectors integer;
    v_egress_keys integer;
    v_mean double precision;
    i integer;
BEGIN
    IF v_platform IS NULL OR NOT (v_platform = ANY (ARRAY['pc', 'ps4', 'xboxone'])) THEN
        RAISE EXCEPTION 'unknown platform % (expected one of: pc, ps4, xboxone)',
                coalesce('"' || v_platform || '"', 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_persona IS NULL OR v_persona <= 0 THEN
        RAISE EXCEPTION 'persona_id must be a positive integer (got %)',
                coalesce(v_persona::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF bf4ps_request_refresh.resources IS NULL
       OR cardinality(bf4ps_request_refresh.resources) = 0 THEN
        RAISE EXCEPTION 'no resources requested (expected one or more of: detailed, profile, weapons, vehicles)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT r INTO v_bad
    FROM unnest(bf4ps_request_refresh.resources) AS r
    WHERE r IS NULL OR NOT (r = ANY (all_resources))
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'unknown resource % (expected one of: detailed, profile, weapons, vehicles)',
                coalesce('"' || v_bad || '"', 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT array_agg(r ORDER BY array_position(all_resources, r)) INTO v_wanted
    FROM (SELECT DISTINCT r FROM unnest(bf4ps_request_refresh.resources) AS r) AS d;

    SELECT coalesce(bf4ps_request_refresh.eta_window, s.eta_window),
           coalesce(bf4ps_request_refresh.egress_rate, s.egress_rate),
           s.max_pending_interactive
      INTO v_window, v_rate, v_cap
    FROM @schema@.scheduling_settings AS s;
    v_window := coalesce(v_window, interval '15 minutes');
    v_rate := coalesce(v_rate, 5);
    v_cap := coalesce(v_cap, 1000);
    IF v_window <= interval '0' THEN
        RAISE EXCEPTION 'eta_window must be positive (got %)', v_window
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT (v_rate > 0 AND v_rate < 'Infinity'::double precision) THEN
        RAISE EXCEPTION 'egress_rate must be a finite number > 0 (got %)', v_rate
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- The soldier and its backlog rows.
    INSERT INTO @schema@.soldiers AS s (platform, persona_id)
    VALUES (v_platform, v_persona)
    ON CONFLICT (platform, persona_id) DO NOTHING
    RETURNING s.soldier_id INTO v_soldier;
    IF v_soldier IS NULL THEN
        SELECT s.soldier_id INTO v_soldier
        FROM @schema@.soldiers AS s
        WHERE s.platform = v_platform AND s.persona_id = v_persona;
    END IF;
    INSERT INTO @schema@.collection_state (soldier_id, resource)
    SELECT v_soldier, r FROM unnest(all_resources) AS r
    ON CONFLICT DO NOTHING;

    -- One job per resource. A job can be finalized (deleted) or fed between
    -- our statements; each pass re-reads and settles within a few tries.
    FOREACH v_resource IN ARRAY v_wanted LOOP
        v_settled := false;
        FOR attempt IN 1..5 LOOP
            SELECT j.job_id, j.status, j.lane, j.priority_class, j.attempt_count
              INTO v_job, v_status, v_lane, v_class, v_attempts
            FROM @schema@.collection_jobs AS j
            WHERE j.soldier_id = v_soldier AND j.resource = v_resource;

            IF NOT FOUND THEN
                INSERT INTO @schema@.collection_jobs AS j
                    (soldier_id, resource, lane, priority_class, reason, priority_value)
                VALUES (v_soldier, v_resource, 'interactive', 'interactive', 'requested', 0)
                ON CONFLICT (soldier_id, resource) DO NOTHING
                RETURNING j.job_id, j.attempt_count INTO v_job, v_attempts;
                IF v_job IS NOT NULL THEN
                    INSERT INTO @schema@.collection_events
                        (job_id, soldier_id, persona_id, platform, resource, lane,
                         event_type, attempt_number, metadata)
                    VALUES (v_job, v_soldier, v_persona, v_platform, v_resource, 'interactive',
                            'created', v_attempts,
                            jsonb_build_object('priority_class', 'interactive',
                                               'reason', 'requested'));
                    v_state := 'created';
                    v_admitted := v_admitted + 1;
                    v_settled := true;
                END IF;
            ELSIF v_status = 'pending' AND v_lane = 'background' THEN
                UPDATE @schema@.collection_jobs AS j
                SET lane = 'interactive',
                    priority_class = 'interactive',
                    reason = 'requested',
                    priority_value = 0,
                    eligible_at = now(),
                    updated_at = now()
                WHERE j.job_id = v_job AND j.status = 'pending' AND j.lane = 'background'
                RETURNING j.attempt_count INTO v_attempts;
                IF FOUND THEN
                    INSERT INTO @schema@.collection_events
                        (job_id, soldier_id, persona_id, platform, resource, lane,
                         event_type, attempt_number, metadata)
                    VALUES (v_job, v_soldier, v_persona, v_platform, v_resource, 'interactive',
                            'promoted', v_attempts,
                            jsonb_build_object('from_lane', 'background',
                                               'from_priority_class', v_class,
                                               'reason', 'requested'));
                    v_state := 'promoted';
                    v_admitted := v_admitted + 1;
                    v_settled := true;
                END IF;
            ELSE
                -- pending interactive, or claimed/running in either lane.
                v_state := v_status;
                v_settled := true;
            END IF;
            EXIT WHEN v_settled;
        END LOOP;
        IF NOT v_settled THEN
            RAISE EXCEPTION 'the % job of soldier % kept changing under the request; retry',
                    v_resource, v_soldier
                USING ERRCODE = 'serialization_failure';
        END IF;
        v_jobs := v_jobs || v_job;
        v_states := v_states || v_state;
    END LOOP;

    -- Admission: every call that added pending interactive jobs counts them
    -- under one lock held until its caller commits, so concurrent callers
    -- see each other's admissions and the cap is exact.
    IF v_admitted > 0 THEN
        PERFORM pg_advisory_xact_lock(7090412320918168685);
        SELECT count(*) INTO v_pending
        FROM (SELECT 1 FROM @schema@.collection_jobs AS j
              WHERE j.lane = 'interactive' AND j.status = 'pending'
              LIMIT v_cap::bigint + 1) AS p;
        IF v_pending > v_cap THEN
            RAISE EXCEPTION 'too many pending interactive refreshes: the limit is % (scheduling_settings.max_pending_interactive); nothing was queued',
                    v_cap
                USING ERRCODE = 'configuration_limit_exceeded',
                      HINT = 'retry after a while; operators raise the limit with BF4PS_MAX_PENDING_INTERACTIVE';
        END IF;
    END IF;

    -- ETA inputs, once per call.
    SELECT count(*)::integer, count(DISTINCT c.egress_key)::integer
      INTO v_collectors, v_egress_keys
    FROM @schema@.collectors AS c
    WHERE c.lane = 'interactive'
      AND c.retired_at IS NULL
      AND c.enabled
      AND NOT c.drained
      AND c.heartbeat_state = 'healthy';
    SELECT avg(e.duration_ms) / 1000.0 INTO v_mean
    FROM (
        SELECT e.duration_ms
        FROM @schema@.collection_events AS e
        WHERE e.lane = 'interactive'
          AND e.event_type IN ('succeeded', 'failed')
          AND e.occurred_at > now() - v_window
          AND e.duration_ms IS NOT NULL
        ORDER BY e.occurred_at DESC
        LIMIT 1000
    ) AS e;

    FOR i IN 1 .. cardinality(v_wanted) LOOP
        resource := v_wanted[i];
        job_id := v_jobs[i];
        state := v_states[i];
        IF state IN ('claimed', 'running') THEN
            "position" := 0;
            eta_seconds := @schema@.bf4ps_eta_seconds(0, 1, v_mean, NULL);
        ELSE
            SELECT count(*) INTO "position"
            FROM @schema@.collection_jobs AS me, @schema@.collection_jobs AS o
            WHERE me.job_id = v_jobs[i]
              AND o.lane = 'interactive'
              AND o.status = 'pending'
              AND (o.claim_rank < me.claim_rank
                   OR (o.claim_rank = me.claim_rank
                       AND (o.priority_value > me.priority_value
                            OR (o.priority_value = me.priority_value
                                AND (o.eligible_at, o.created_at, o.job_id)
                                    <= (me.eligible_at, me.created_at, me.job_id)))));
            eta_seconds := @schema@.bf4ps_eta_seconds("position", v_collectors, v_mean,
                                                      v_rate * greatest(v_egress_keys, 1));
            IF eta_seconds IS NOT NULL THEN
                SELECT greatest(eta_seconds,
                                extract(epoch FROM (j.eligible_at - now()))::double precision)
                  INTO eta_seconds
                FROM @schema@.collection_jobs AS j
                WHERE j.job_id = v_jobs[i];
            END IF;
        END IF;
        RETURN NEXT;
    END LOOP;
END;
$fn$;
$body$, '@schema@', s);

-- Registers a collector incarnation (the rules of src/registry.rs): when a
-- non-retired collector already has the name, it is retired and the name
-- taken if it is lost, silent for longer than `lost_after`, or drained and
-- idle; otherwise nothing is written and the holder is described
-- (collector_uuid NULL). The secret is returned once; only its SHA-256 is
-- stored.
EXECUTE replace($body$
CREATE FUNCTION @schema@.bf4ps_collector_register(
    p_name text,
    p_hostname text,
    p_lane text,
    p_egress_key text,
    p_software_version text,
    p_lost_after interval
) RETURNS TABLE (
    collector_uuid uuid,
    secret uuid,
    holder_hostname text,
    holder_age_s double precision
)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    v_name text := btrim(p_name);
    h record;
    v_uuid uuid;
    v_secret uuid := gen_random_uuid();
BEGIN
    SELECT c.collector_uuid, c.hostname, c.heartbeat_state, c.drained, c.current_job_id,
           extract(epoch FROM now() - c.last_heartbeat_at)::float8 AS age_s
      INTO h
    FROM @schema@.collectors AS c
    WHERE lower(c.collector_name) = lower(v_name) AND c.retired_at IS NULL
    FOR UPDATE;
    IF FOUND THEN
        IF NOT (h.heartbeat_state = 'lost'
                OR h.age_s IS NULL OR h.age_s > extract(epoch FROM p_lost_after)
                OR (h.drained AND h.current_job_id IS NULL)) THEN
            collector_uuid := NULL;
            secret := NULL;
            holder_hostname := h.hostname;
            holder_age_s := coalesce(h.age_s, 0);
            RETURN NEXT;
            RETURN;
        END IF;
        UPDATE @schema@.collectors AS c
        SET retired_at = now(), drained = true, updated_at = now()
        WHERE c.collector_uuid = h.collector_uuid;
    END IF;
    BEGIN
        INSERT INTO @schema@.collectors AS c
            (collector_name, hostname, lane, egress_key, software_version,
             started_at, last_heartbeat_at, heartbeat_state)
        VALUES (v_name, btrim(p_hostname), p_lane, btrim(p_egress_key), p_software_version,
                now(), now(), 'healthy')
        RETURNING c.collector_uuid INTO v_uuid;
    EXCEPTION WHEN unique_violation THEN
        -- A concurrent registration took the name between our check and insert.
        collector_uuid := NULL;
        secret := NULL;
        holder_hostname := '(registering concurrently)';
        holder_age_s := 0;
        RETURN NEXT;
        RETURN;
    END;
    INSERT INTO @schema@.collector_secrets (collector_uuid, secret_sha256)
    VALUES (v_uuid, sha256(convert_to(v_secret::text, 'UTF8')));
    collector_uuid := v_uuid;
    secret := v_secret;
    holder_hostname := NULL;
    holder_age_s := NULL;
    RETURN NEXT;
END;
$fn$;
$body$, '@schema@', s);

-- One heartbeat of the incarnation holding `p_secret`. Routine: updates
-- last_heartbeat_at only. After an outage (lost): writes exactly one
-- heartbeat_restored with the outage boundary, then clears
-- heartbeat_lost_at. Returns the operator's verdict: retired (or removed),
-- or claimable (enabled and not drained). A wrong secret is refused
-- (SQLSTATE 42501) and writes nothing.
EXECUTE replace($body$
CREATE FUNCTION @schema@.bf4ps_collector_heartbeat(p_uuid uuid, p_secret uuid)
RETURNS TABLE (retired boolean, claimable boolean, restored boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    c record;
BEGIN
    PERFORM @schema@.bf4ps_collector_check_secret(p_uuid, p_secret);
    SELECT x.heartbeat_state, x.enabled, x.drained INTO c
    FROM @schema@.collectors AS x
    WHERE x.collector_uuid = p_uuid AND x.retired_at IS NULL
    FOR UPDATE;
    IF NOT FOUND THEN
        retired := true;
        claimable := false;
        restored := false;
        RETURN NEXT;
        RETURN;
    END IF;
    IF c.heartbeat_state = 'lost' THEN
        INSERT INTO @schema@.collection_events
            (collector_uuid, collector_name_snapshot, hostname_snapshot, egress_key_snapshot,
             lane, event_type, metadata)
        SELECT x.collector_uuid, x.collector_name, x.hostname, x.egress_key, x.lane,
               'heartbeat_restored',
               jsonb_build_object(
                   'lost_at', x.heartbeat_lost_at,
                   'last_heartbeat_at', x.last_heartbeat_at,
                   'outage_ms', floor(extract(epoch FROM now() - x.heartbeat_lost_at) * 1000))
        FROM @schema@.collectors AS x WHERE x.collector_uuid = p_uuid;
    END IF;
    UPDATE @schema@.collectors AS x
    SET last_heartbeat_at = now(), heartbeat_state = 'healthy', heartbeat_lost_at = NULL,
        updated_at = now()
    WHERE x.collector_uuid = p_uuid;
    retired := false;
    claimable := c.enabled AND NOT c.drained;
    restored := c.heartbeat_state = 'lost';
    RETURN NEXT;
END;
$fn$;
$body$, '@schema@', s);

-- The clean-stop mark of the incarnation holding `p_secret`: drained, so it
-- is neither swept to lost nor blocks a restart under its name.
EXECUTE replace($body$
CREATE FUNCTION @schema@.bf4ps_collector_stopped(p_uuid uuid, p_secret uuid)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $fn$
BEGIN
    PERFORM @schema@.bf4ps_collector_check_secret(p_uuid, p_secret);
    UPDATE @schema@.collectors AS x
    SET drained = true, updated_at = now()
    WHERE x.collector_uuid = p_uuid;
END;
$fn$;
$body$, '@schema@', s);

-- Raises 42501 unless `p_secret` is the secret of incarnation `p_uuid`.
-- (Called by the two functions above; never granted to anyone.)
EXECUTE replace($body$
CREATE FUNCTION @schema@.bf4ps_collector_check_secret(p_uuid uuid, p_secret uuid)
RETURNS void
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $fn$
BEGIN
    IF p_uuid IS NULL OR p_secret IS NULL OR NOT EXISTS (
        SELECT 1 FROM @schema@.collector_secrets AS cs
        WHERE cs.collector_uuid = p_uuid
          AND cs.secret_sha256 = sha256(convert_to(p_secret::text, 'UTF8')))
    THEN
        RAISE EXCEPTION 'collector % did not prove it is this incarnation (wrong secret)', p_uuid
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END;
$fn$;
$body$, '@schema@', s);

-- Ownership: bf4ps_definer, which needs CREATE on the schema only while it
-- is handed the functions.
EXECUTE format('GRANT USAGE, CREATE ON SCHEMA %s TO bf4ps_definer', s);
EXECUTE format('ALTER FUNCTION %s.bf4ps_request_refresh(text, bigint, text[], interval, double precision) OWNER TO bf4ps_definer', s);
EXECUTE format('ALTER FUNCTION %s.bf4ps_collector_register(text, text, text, text, text, interval) OWNER TO bf4ps_definer', s);
EXECUTE format('ALTER FUNCTION %s.bf4ps_collector_heartbeat(uuid, uuid) OWNER TO bf4ps_definer', s);
EXECUTE format('ALTER FUNCTION %s.bf4ps_collector_stopped(uuid, uuid) OWNER TO bf4ps_definer', s);
EXECUTE format('ALTER FUNCTION %s.bf4ps_collector_check_secret(uuid, uuid) OWNER TO bf4ps_definer', s);
EXECUTE format('REVOKE CREATE ON SCHEMA %s FROM bf4ps_definer', s);
EXECUTE format('GRANT USAGE ON SCHEMA %s TO bf4ps_collector, bf4ps_website, bf4ps_reader', s);
END
$functions$;

REVOKE ALL ON FUNCTION bf4ps_request_refresh(text, bigint, text[], interval, double precision) FROM PUBLIC;
REVOKE ALL ON FUNCTION bf4ps_collector_register(text, text, text, text, text, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION bf4ps_collector_heartbeat(uuid, uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION bf4ps_collector_stopped(uuid, uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION bf4ps_collector_check_secret(uuid, uuid) FROM PUBLIC;

-- ---------------------------------------------------------------------------
-- What each role may do.
-- ---------------------------------------------------------------------------

-- bf4ps_definer: exactly what the function bodies above touch.
GRANT SELECT, INSERT ON soldiers TO bf4ps_definer;
GRANT SELECT, INSERT ON collection_state TO bf4ps_definer;
GRANT SELECT, INSERT, UPDATE ON collection_jobs TO bf4ps_definer;
GRANT SELECT, INSERT ON collection_events TO bf4ps_definer;
GRANT SELECT, INSERT, UPDATE ON collectors TO bf4ps_definer;
GRANT SELECT, INSERT ON collector_secrets TO bf4ps_definer;
GRANT SELECT ON scheduling_settings TO bf4ps_definer;
GRANT EXECUTE ON FUNCTION bf4ps_collector_check_secret(uuid, uuid) TO bf4ps_definer;

-- bf4ps_website: the entry point, nothing else.
GRANT EXECUTE ON FUNCTION bf4ps_request_refresh(text, bigint, text[], interval, double precision)
    TO bf4ps_website;

-- bf4ps_collector: register/heartbeat/stop through the functions; the egress
-- gate; claim, start, renew, finalize. No DELETE/UPDATE of events, no DDL,
-- no control flags (collectors: current_job_id only).
GRANT EXECUTE ON FUNCTION bf4ps_collector_register(text, text, text, text, text, interval),
                          bf4ps_collector_heartbeat(uuid, uuid),
                          bf4ps_collector_stopped(uuid, uuid)
    TO bf4ps_collector;
GRANT SELECT ON _sqlx_migrations, soldiers, collectors TO bf4ps_collector;
GRANT UPDATE (current_job_id, updated_at) ON collectors TO bf4ps_collector;
GRANT SELECT, DELETE ON collection_jobs TO bf4ps_collector;
GRANT UPDATE (status, collector_uuid, lease_token, claimed_at, started_at, lease_expires_at,
              attempt_count, eligible_at, last_error_class, last_error_at, updated_at)
    ON collection_jobs TO bf4ps_collector;
GRANT SELECT, INSERT, UPDATE ON collection_state TO bf4ps_collector;
GRANT INSERT ON collection_events TO bf4ps_collector;
GRANT SELECT, INSERT, UPDATE ON soldier_resource_current TO bf4ps_collector;
GRANT SELECT, INSERT ON soldier_detailed_history TO bf4ps_collector;
GRANT SELECT, INSERT, UPDATE ON egress_gates TO bf4ps_collector;

-- bf4ps_reader: every table but the secrets, read only.
GRANT SELECT ON _sqlx_migrations, soldiers, collection_state, soldier_resource_current,
                soldier_detailed_history, collectors, collection_jobs, collection_events,
                egress_gates, projector_checkpoint, event_rollup_hourly, retention_runs,
                scheduling_settings
    TO bf4ps_reader;
