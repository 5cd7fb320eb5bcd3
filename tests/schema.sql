--
-- PostgreSQL database dump
--



SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

--
-- Name: pgcrypto; Type: EXTENSION; Schema: -; Owner: -
--

CREATE EXTENSION IF NOT EXISTS pgcrypto WITH SCHEMA public;


--
-- Name: EXTENSION pgcrypto; Type: COMMENT; Schema: -; Owner: 
--

COMMENT ON EXTENSION pgcrypto IS 'cryptographic functions';


--
-- Name: bf4ps_budget_class(text, timestamp with time zone); Type: FUNCTION; Schema: public; Owner: <migrator>
--

CREATE FUNCTION public.bf4ps_budget_class(priority_class text, last_error_at timestamp with time zone) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN CASE WHEN ((last_error_at IS NOT NULL) OR (priority_class = 'recent'::text)) THEN 'retry'::text WHEN (priority_class = 'bootstrap'::text) THEN 'bootstrap'::text ELSE 'active'::text END;


ALTER FUNCTION public.bf4ps_budget_class(priority_class text, last_error_at timestamp with time zone) OWNER TO <migrator>;

--
-- Name: bf4ps_check_document(text, jsonb, timestamp with time zone); Type: FUNCTION; Schema: public; Owner: <migrator>
--

CREATE FUNCTION public.bf4ps_check_document(p_resource text, p_data jsonb, p_now timestamp with time zone) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $_$
DECLARE
    v_list text := CASE p_resource WHEN 'weapons' THEN 'weapons'
                                   WHEN 'vehicles' THEN 'vehicles' END;
    v_seed integer;
    v_per_day integer;
    v_new bigint;
    v_size bigint;
    v_recent bigint;
    v_bad text;
BEGIN
    -- (An oversized or malformed list is bf4ps_succeed_job's to refuse.)
    IF v_list IS NOT NULL AND jsonb_typeof(p_data->v_list) = 'array'
       AND jsonb_array_length(p_data->v_list) <= 5000 THEN
        SELECT format('entry %s', e.guid) INTO v_bad
        FROM jsonb_to_recordset(p_data->v_list) AS e(guid text, name text, slug text, category text)
        WHERE NOT public.bf4ps_text_ok(e.name, 200) OR NOT public.bf4ps_text_ok(e.category, 200)
           OR e.name ~ '[<>]' OR e.category ~ '[<>]'
           OR e.slug !~ '^[A-Za-z0-9._-]{1,200}$' OR e.slug ~ '\.\.'
        LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'a % % has a name, slug or category with characters others must not be shown (control, bidirectional, zero-width or invisible characters, < or >; a slug is [A-Za-z0-9._-] without ..)',
                    p_resource, left(v_bad, 80)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT CASE v_list WHEN 'weapons' THEN s.catalog_seed ELSE s.vehicle_catalog_seed END,
               s.catalog_new_per_day
          INTO v_seed, v_per_day
        FROM public.scheduling_settings AS s;
        IF p_resource = 'weapons' THEN
            SELECT count(DISTINCT e.guid) INTO v_new
            FROM jsonb_to_recordset(p_data->'weapons') AS e(guid text)
            WHERE NOT EXISTS (SELECT 1 FROM public.weapon_catalog AS k
                              WHERE k.weapon_guid = e.guid);
            IF v_new > 0 THEN
                PERFORM 1 FROM public.bf4ps_locks WHERE lock_name = 'weapon_catalog' FOR UPDATE;
                -- Counted again under the lock: a concurrent finalization
                -- may have added the same entries meanwhile.
                SELECT count(DISTINCT e.guid) INTO v_new
                FROM jsonb_to_recordset(p_data->'weapons') AS e(guid text)
                WHERE NOT EXISTS (SELECT 1 FROM public.weapon_catalog AS k
                                  WHERE k.weapon_guid = e.guid);
                SELECT count(*), count(*) FILTER (WHERE k.first_seen_at > p_now - interval '1 day')
                  INTO v_size, v_recent
                FROM public.weapon_catalog AS k;
            END IF;
        ELSE
            SELECT count(DISTINCT e.guid) INTO v_new
            FROM jsonb_to_recordset(p_data->'vehicles') AS e(guid text)
            WHERE NOT EXISTS (SELECT 1 FROM public.vehicle_catalog AS k
                              WHERE k.vehicle_guid = e.guid);
            IF v_new > 0 THEN
                PERFORM 1 FROM public.bf4ps_locks WHERE lock_name = 'vehicle_catalog' FOR UPDATE;
                SELECT count(DISTINCT e.guid) INTO v_new
                FROM jsonb_to_recordset(p_data->'vehicles') AS e(guid text)
                WHERE NOT EXISTS (SELECT 1 FROM public.vehicle_catalog AS k
                                  WHERE k.vehicle_guid = e.guid);
                SELECT count(*), count(*) FILTER (WHERE k.first_seen_at > p_now - interval '1 day')
                  INTO v_size, v_recent
                FROM public.vehicle_catalog AS k;
            END IF;
        END IF;
        IF v_new > 0
           AND v_new > greatest(v_seed - v_size, 0) + greatest(v_per_day - v_recent, 0) THEN
            RAISE EXCEPTION 'this % list adds % new catalog entries; the catalog holds % and took % in the last day (it fills up to % entries, then takes % a day: scheduling_settings.%, catalog_new_per_day)',
                    p_resource, v_new, v_size, v_recent, v_seed, v_per_day,
                    CASE v_list WHEN 'weapons' THEN 'catalog_seed' ELSE 'vehicle_catalog_seed' END
                USING ERRCODE = 'configuration_limit_exceeded';
        END IF;
    ELSIF p_resource = 'profile' THEN
        IF NOT public.bf4ps_text_ok(p_data->>'battlelog_username', 200)
           OR NOT public.bf4ps_text_ok(p_data->>'country_name', 200)
           OR NOT coalesce(public.bf4ps_country_ok(p_data->>'country_code'), true)
           OR jsonb_typeof(p_data->'battlelog_user_id') = 'number'
              AND (p_data->>'battlelog_user_id')::numeric <= 0 THEN
            RAISE EXCEPTION 'a profile has a username and country name without control, bidirectional, zero-width or invisible characters, an ISO 3166-1 alpha-2 country_code if any, and a battlelog_user_id > 0 if any'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
END;
$_$;


ALTER FUNCTION public.bf4ps_check_document(p_resource text, p_data jsonb, p_now timestamp with time zone) OWNER TO <migrator>;

--
-- Name: bf4ps_claim_job(uuid, boolean, timestamp with time zone); Type: FUNCTION; Schema: public; Owner: <migrator>
--

CREATE FUNCTION public.bf4ps_claim_job(p_uuid uuid, p_start boolean, p_now timestamp with time zone) RETURNS TABLE(job_id bigint, soldier_id bigint, persona_id bigint, platform text, soldier_name text, resource text, lane text, priority_class text, attempt_count integer, lease_token uuid, lease_expires_at timestamp with time zone, claimed_at timestamp with time zone, created_at timestamp with time zone, eligible_at timestamp with time zone, budget_class text, granted boolean, wait_us bigint, paused boolean)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    s record;
    me record;
    g record;
    v_now timestamptz;
    v_budget_spacing interval;
    v_classes text[];
    v_class text;
    v_job bigint;
    v_budgeted boolean;
    v_active bigint;
    v_bootstrap bigint;
    v_retry bigint;
    v_interactive boolean;
    v_entitled boolean;
    v_until timestamptz;
    v_oldest timestamptz;
BEGIN
    SELECT c.collector_uuid, c.collector_name, c.hostname, c.egress_key, c.lane,
           c.current_job_id,
           -- The host: the login role that registered it (a collector
           -- registered before 0012 recorded none: its key is its host).
           coalesce((SELECT cs.registered_by FROM public.collector_secrets AS cs
                     WHERE cs.collector_uuid = c.collector_uuid),
                    '(key) ' || c.egress_key) AS host
      INTO me
    FROM public.collectors AS c
    WHERE c.collector_uuid = p_uuid AND c.enabled AND NOT c.drained AND c.retired_at IS NULL;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF me.current_job_id IS NOT NULL THEN
        -- A collector claims only when it holds nothing, so the job the
        -- database says it holds is not held: the database went back in
        -- time (a restore, a failover that lost its tail) or the answer to
        -- an earlier claim was lost. That lease ends now (the monitor
        -- returns the job with lease_expired + reclaimed) and the caller
        -- claims at once.
        UPDATE public.collection_jobs AS j
        SET lease_expires_at = least(j.lease_expires_at, clock_timestamp()),
            updated_at = clock_timestamp()
        WHERE j.job_id = me.current_job_id AND j.collector_uuid = p_uuid
          AND j.status IN ('claimed', 'running');
        UPDATE public.collectors AS c SET current_job_id = NULL, updated_at = clock_timestamp()
        WHERE c.collector_uuid = p_uuid AND c.current_job_id = me.current_job_id;
    END IF;
    SELECT x.egress_spacing, x.lease_duration, x.budget_spacing, x.budget_requests,
           x.budget_window, x.share_active_max, x.share_bootstrap_min, x.share_retry_min
      INTO s
    FROM public.scheduling_settings AS x;
    v_budgeted := me.lane = 'background' AND s.budget_spacing IS NOT NULL;
    v_budget_spacing := CASE WHEN v_budgeted THEN s.budget_spacing END;
    v_interactive := me.lane = 'interactive';
    SELECT x.claim_at, x.go_at, x.paused, x.entitled, x.locked INTO g
    FROM public.bf4ps_egress_gate(me.egress_key, me.host, v_budget_spacing, v_interactive,
                                    p_now) AS x;
    v_now := g.claim_at;
    v_entitled := g.entitled;
    v_until := v_now;
    IF v_interactive AND NOT g.entitled AND coalesce(g.go_at <= v_now, true) THEN
        -- Not this host's turn on the interactive lane (it is ahead of
        -- another host that claims): it may take only a job that waited a
        -- second (no entitled host came for it), so the lane is shared per
        -- host and no job waits for a host that does not come.
        SELECT min(j.eligible_at) INTO v_oldest
        FROM public.collection_jobs AS j
        WHERE j.status = 'pending' AND j.lane = 'interactive' AND j.eligible_at <= v_now;
        IF v_oldest IS NULL THEN
            RETURN;
        END IF;
        v_until := v_now - interval '1 second';
        IF v_oldest > v_until THEN
            g.go_at := v_oldest + interval '1 second';
        ELSIF NOT g.locked THEN
            -- The key's gate alone, which locks.
            SELECT x.claim_at, x.go_at, x.paused, x.entitled, x.locked INTO g
            FROM public.bf4ps_egress_gate(me.egress_key, me.host, NULL, false, p_now) AS x;
            v_now := g.claim_at;
            v_until := v_now - interval '1 second';
        END IF;
    END IF;
    IF g.go_at > v_now THEN
        RETURN QUERY SELECT NULL::bigint, NULL::bigint, NULL::bigint, NULL::text, NULL::text,
            NULL::text, NULL::text, NULL::text, NULL::integer, NULL::uuid, NULL::timestamptz,
            NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::text, false,
            CASE WHEN g.go_at >= v_now + interval '1 day' THEN 86400000000::bigint
                 ELSE ceil(extract(epoch FROM g.go_at - v_now) * 1000000)::bigint END,
            g.paused;
        RETURN;
    END IF;
    IF v_budgeted THEN
        SELECT coalesce(sum(u.grants) FILTER (WHERE u.budget_class = 'active'), 0),
               coalesce(sum(u.grants) FILTER (WHERE u.budget_class = 'bootstrap'), 0),
               coalesce(sum(u.grants) FILTER (WHERE u.budget_class = 'retry'), 0)
          INTO v_active, v_bootstrap, v_retry
        FROM public.budget_usage AS u
        -- Every minute whose span overlaps the window (the current one
        -- included, whatever the window's length).
        WHERE u.minute + interval '1 minute' > v_now - s.budget_window AND u.minute <= v_now;
        v_classes := ARRAY[]::text[];
        IF v_bootstrap < s.share_bootstrap_min * s.budget_requests THEN
            v_classes := v_classes || 'bootstrap'::text;
        END IF;
        IF v_retry < s.share_retry_min * s.budget_requests THEN
            v_classes := v_classes || 'retry'::text;
        END IF;
        IF v_active < s.share_active_max * s.budget_requests THEN
            v_classes := v_classes || 'active'::text;
        END IF;
        -- Borrowing: an unused share goes to the other classes, active
        -- last (its share is a cap: it exceeds it only when nothing else
        -- waits).
        FOREACH v_class IN ARRAY ARRAY['bootstrap', 'retry', 'active'] LOOP
            IF NOT (v_class = ANY (v_classes)) THEN
                v_classes := v_classes || v_class;
            END IF;
        END LOOP;
    ELSE
        v_classes := ARRAY['any'];
    END IF;
    FOREACH v_class IN ARRAY v_classes LOOP
        IF v_class = 'any' THEN
            -- Served by ix_collection_jobs_claim_order.
            SELECT j.job_id INTO v_job
            FROM public.collection_jobs AS j
            WHERE j.status = 'pending' AND j.lane = me.lane AND j.eligible_at <= v_until
            ORDER BY CASE j.priority_class
                         WHEN 'interactive' THEN 1
                         WHEN 'active' THEN 2
                         WHEN 'recent' THEN 3
                         WHEN 'bootstrap' THEN 4
                     END,
                     j.priority_value DESC, j.eligible_at, j.created_at, j.job_id
            FOR UPDATE SKIP LOCKED
            LIMIT 1;
        ELSE
            -- One class of the background lane, in the contract's order:
            -- served by ix_collection_jobs_budget_claim_order (0016), whose
            -- predicate the literal lane matches in a generic plan too.
            SELECT j.job_id INTO v_job
            FROM public.collection_jobs AS j
            WHERE j.status = 'pending' AND j.lane = 'background' AND j.eligible_at <= v_now
              AND public.bf4ps_budget_class(j.priority_class, j.last_error_at) = v_class
            ORDER BY CASE j.priority_class
                         WHEN 'interactive' THEN 1
                         WHEN 'active' THEN 2
                         WHEN 'recent' THEN 3
                         WHEN 'bootstrap' THEN 4
                     END,
                     j.priority_value DESC, j.eligible_at, j.created_at, j.job_id
            FOR UPDATE SKIP LOCKED
            LIMIT 1;
        END IF;
        EXIT WHEN v_job IS NOT NULL;
    END LOOP;
    IF v_job IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH claimed AS (
        UPDATE public.collection_jobs AS j
        SET status = CASE WHEN p_start THEN 'running' ELSE 'claimed' END,
            collector_uuid = p_uuid,
            lease_token = gen_random_uuid(),
            claimed_at = v_now,
            started_at = CASE WHEN p_start THEN v_now END,
            lease_expires_at = v_now + s.lease_duration,
            attempt_count = j.attempt_count + 1,
            updated_at = v_now
        WHERE j.job_id = v_job
        RETURNING j.*
    ), job AS (
        SELECT c.*, so.persona_id AS s_persona_id, so.platform AS s_platform,
               so.current_name AS s_name,
               public.bf4ps_sane_time(c.eligible_at) AS sane_eligible_at,
               CASE WHEN c.lane = 'background'
                    THEN public.bf4ps_budget_class(c.priority_class, c.last_error_at) END AS b_class
        FROM claimed AS c JOIN public.soldiers AS so ON so.soldier_id = c.soldier_id
    ), holder AS (
        UPDATE public.collectors AS c
        SET current_job_id = claimed.job_id, updated_at = v_now
        FROM claimed
        WHERE c.collector_uuid = p_uuid
    ), usage AS (
        INSERT INTO public.budget_usage AS u (minute, budget_class, grants)
        SELECT date_trunc('minute', v_now), job.b_class, 1 FROM job WHERE v_budgeted
        ON CONFLICT (minute, budget_class) DO UPDATE SET grants = u.grants + 1
    ), events AS (
        INSERT INTO public.collection_events
            (occurred_at, collector_uuid, collector_name_snapshot, hostname_snapshot,
             egress_key_snapshot, job_id, soldier_id, persona_id, platform, resource, lane,
             event_type, attempt_number, lease_token, metadata)
        SELECT v_now, me.collector_uuid, me.collector_name, me.hostname, me.egress_key,
               c.job_id, c.soldier_id, c.s_persona_id, c.s_platform, c.resource, c.lane,
               e.event_type, c.attempt_count, c.lease_token, e.metadata
        FROM job AS c CROSS JOIN LATERAL (VALUES
            (1, 'claimed', jsonb_build_object(
                'priority_class', c.priority_class, 'reason', c.reason,
                'budget_class', c.b_class,
                'queued_ms', floor(extract(epoch FROM v_now - c.sane_eligible_at) * 1000))),
            (2, 'started', jsonb_build_object('claim_to_start_ms', 0))
        ) AS e(ord, event_type, metadata)
        WHERE e.ord = 1 OR p_start
        ORDER BY e.ord
    )
    SELECT c.job_id, c.soldier_id, c.s_persona_id, c.s_platform, c.s_name, c.resource, c.lane,
           c.priority_class, c.attempt_count, c.lease_token, c.lease_expires_at, c.claimed_at,
           public.bf4ps_sane_time(c.created_at), c.sane_eligible_at, c.b_class,
           true, 0::bigint, false
    FROM job AS c;
    PERFORM public.bf4ps_egress_spend(me.egress_key, me.host, s.egress_spacing,
                                        v_budget_spacing, v_interactive, v_entitled, v_now);
END;
$$;


ALTER FUNCTION public.bf4ps_claim_job(p_uuid uuid, p_start boolean, p_now timestamp with time zone) OWNER TO <migrator>;

--
-- Name: bf4ps_collector_check_secret(uuid, uuid); Type: FUNCTION; Schema: public; Owner: bf4ps_definer
--

CREATE FUNCTION public.bf4ps_collector_check_secret(p_uuid uuid, p_secret uuid) RETURNS void
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
BEGIN
    IF p_uuid IS NULL OR p_secret IS NULL OR NOT EXISTS (
        SELECT 1 FROM public.collector_secrets AS cs
        WHERE cs.collector_uuid = p_uuid
          AND cs.secret_sha256 = sha256(convert_to(p_secret::text, 'UTF8')))
    THEN
        RAISE EXCEPTION 'collector % did not prove it is this incarnation (wrong secret)', p_uuid
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END;
$$;


ALTER FUNCTION public.bf4ps_collector_check_secret(p_uuid uuid, p_secret uuid) OWNER TO bf4ps_definer;

--
-- Name: bf4ps_collector_claim(uuid, uuid, integer, boolean); Type: FUNCTION; Schema: public; Owner: bf4ps_definer
--

CREATE FUNCTION public.bf4ps_collector_claim(p_uuid uuid, p_secret uuid, p_protocol integer, p_start boolean DEFAULT true) RETURNS TABLE(job_id bigint, soldier_id bigint, persona_id bigint, platform text, soldier_name text, resource text, lane text, priority_class text, attempt_count integer, lease_token uuid, lease_expires_at timestamp with time zone, claimed_at timestamp with time zone, created_at timestamp with time zone, eligible_at timestamp with time zone, budget_class text, granted boolean, wait_us bigint, paused boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
BEGIN
    IF p_protocol IS NULL OR p_protocol < public.bf4ps_collector_protocol() THEN
        RAISE EXCEPTION 'this collector speaks protocol %, the schema protocol %: upgrade bf4ps-ops on this host',
                coalesce(p_protocol::text, 'NULL'), public.bf4ps_collector_protocol()
            USING ERRCODE = 'BF001';
    END IF;
    PERFORM public.bf4ps_collector_check_secret(p_uuid, p_secret);
    PERFORM set_config('synchronous_commit', 'off', true);
    RETURN QUERY SELECT * FROM public.bf4ps_claim_job(p_uuid, p_start, NULL);
END;
$$;


ALTER FUNCTION public.bf4ps_collector_claim(p_uuid uuid, p_secret uuid, p_protocol integer, p_start boolean) OWNER TO bf4ps_definer;

--
-- Name: bf4ps_collector_fail(uuid, uuid, bigint, uuid, text, integer, text, bigint); Type: FUNCTION; Schema: public; Owner: bf4ps_definer
--

CREATE FUNCTION public.bf4ps_collector_fail(p_uuid uuid, p_secret uuid, p_job_id bigint, p_lease_token uuid, p_error_class text, p_http_status integer, p_message text, p_duration_ms bigint) RETURNS TABLE(outcome text, eligible_at timestamp with time zone, next_due_at timestamp with time zone, paused_until timestamp with time zone)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
BEGIN
    PERFORM public.bf4ps_collector_check_secret(p_uuid, p_secret);
    RETURN QUERY SELECT * FROM public.bf4ps_fail_job(
        p_uuid, p_job_id, p_lease_token, p_error_class, p_http_status, p_message, p_duration_ms,
        now());
END;
$$;


ALTER FUNCTION public.bf4ps_collector_fail(p_uuid uuid, p_secret uuid, p_job_id bigint, p_lease_token uuid, p_error_class text, p_http_status integer, p_message text, p_duration_ms bigint) OWNER TO bf4ps_definer;

--
-- Name: bf4ps_collector_heartbeat(uuid, uuid); Type: FUNCTION; Schema: public; Owner: bf4ps_definer
--

CREATE FUNCTION public.bf4ps_collector_heartbeat(p_uuid uuid, p_secret uuid) RETURNS TABLE(retired boolean, claimable boolean, restored boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    c record;
BEGIN
    PERFORM public.bf4ps_collector_check_secret(p_uuid, p_secret);
    SELECT x.heartbeat_state, x.enabled, x.drained, x.last_heartbeat_at INTO c
    FROM public.collectors AS x
    WHERE x.collector_uuid = p_uuid AND x.retired_at IS NULL;
    IF NOT FOUND THEN
        retired := true;
        claimable := false;
        restored := false;
        RETURN NEXT;
        RETURN;
    END IF;
    IF c.heartbeat_state = 'healthy' AND c.last_heartbeat_at <= now()
       AND c.last_heartbeat_at > now() - (
           SELECT s.heartbeat_lost_after / 6 FROM public.scheduling_settings AS s) THEN
        -- Recorded recently enough: answer only.
        retired := false;
        claimable := c.enabled AND NOT c.drained;
        restored := false;
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT x.heartbeat_state, x.enabled, x.drained INTO c
    FROM public.collectors AS x
    WHERE x.collector_uuid = p_uuid AND x.retired_at IS NULL
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        -- Locked by another transaction (or retired meanwhile): answer from
        -- the unlocked read, record nothing now.
        SELECT x.heartbeat_state, x.enabled, x.drained INTO c
        FROM public.collectors AS x
        WHERE x.collector_uuid = p_uuid AND x.retired_at IS NULL;
        retired := NOT FOUND;
        claimable := FOUND AND c.enabled AND NOT c.drained;
        restored := false;
        RETURN NEXT;
        RETURN;
    END IF;
    IF c.heartbeat_state = 'lost' THEN
        INSERT INTO public.collection_events
            (collector_uuid, collector_name_snapshot, hostname_snapshot, egress_key_snapshot,
             lane, event_type, metadata)
        SELECT x.collector_uuid, x.collector_name, x.hostname, x.egress_key, x.lane,
               'heartbeat_restored',
               jsonb_build_object(
                   'lost_at', x.heartbeat_lost_at,
                   'last_heartbeat_at', x.last_heartbeat_at,
                   'outage_ms', CASE WHEN isfinite(x.heartbeat_lost_at)
                                     THEN floor(extract(epoch FROM now() - x.heartbeat_lost_at) * 1000)
                                END)
        FROM public.collectors AS x WHERE x.collector_uuid = p_uuid;
    END IF;
    UPDATE public.collectors AS x
    SET last_heartbeat_at = now(), heartbeat_state = 'healthy', heartbeat_lost_at = NULL,
        updated_at = now()
    WHERE x.collector_uuid = p_uuid;
    retired := false;
    claimable := c.enabled AND NOT c.drained;
    restored := c.heartbeat_state = 'lost';
    RETURN NEXT;
END;
$$;


ALTER FUNCTION public.bf4ps_collector_heartbeat(p_uuid uuid, p_secret uuid) OWNER TO bf4ps_definer;

--
-- Name: bf4ps_collector_next_eligible(uuid, uuid); Type: FUNCTION; Schema: public; Owner: bf4ps_definer
--

CREATE FUNCTION public.bf4ps_collector_next_eligible(p_uuid uuid, p_secret uuid) RETURNS timestamp with time zone
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
BEGIN
    PERFORM public.bf4ps_collector_check_secret(p_uuid, p_secret);
    RETURN (SELECT public.bf4ps_sane_time(min(j.eligible_at))
            FROM public.collection_jobs AS j
            WHERE j.status = 'pending'
              AND j.lane = (SELECT c.lane FROM public.collectors AS c
                            WHERE c.collector_uuid = p_uuid));
END;
$$;


ALTER FUNCTION public.bf4ps_collector_next_eligible(p_uuid uuid, p_secret uuid) OWNER TO bf4ps_definer;

--
-- Name: bf4ps_collector_protocol(); Type: FUNCTION; Schema: public; Owner: <migrator>
--

CREATE FUNCTION public.bf4ps_collector_protocol() RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$ SELECT 3 $$;


ALTER FUNCTION public.bf4ps_collector_protocol() OWNER TO <migrator>;

--
-- Name: bf4ps_collector_register(text, text, text, text, text); Type: FUNCTION; Schema: public; Owner: bf4ps_definer
--

CREATE FUNCTION public.bf4ps_collector_register(p_name text, p_hostname text, p_lane text, p_egress_key text, p_software_version text) RETURNS TABLE(collector_uuid uuid, secret uuid, holder_hostname text, holder_age_s double precision)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
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
    IF NOT public.bf4ps_name_ok(p_name, 200) THEN
        RAISE EXCEPTION 'collector name must be 1-200 characters without control characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT public.bf4ps_name_ok(p_hostname, 200) THEN
        RAISE EXCEPTION 'hostname must be 1-200 characters without control characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT public.bf4ps_name_ok(p_egress_key, 200) THEN
        RAISE EXCEPTION 'egress key must be 1-200 characters without control characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_lane IS NULL OR p_lane NOT IN ('background', 'interactive') THEN
        RAISE EXCEPTION 'lane must be background or interactive'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_software_version IS NOT NULL AND NOT public.bf4ps_name_ok(p_software_version, 200) THEN
        RAISE EXCEPTION 'software version must be up to 200 characters without control characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT x.heartbeat_lost_after, x.registrations_per_hour, x.collectors_per_role INTO s
    FROM public.scheduling_settings AS x;

    -- One registration at a time, so the bounds are exact (a row lock no
    -- other role can take; registrations are rare).
    PERFORM 1 FROM public.bf4ps_locks WHERE lock_name = 'collector_registration' FOR UPDATE;
    SELECT count(*) FILTER (WHERE cs.created_at > now() - interval '1 hour'),
           count(*) FILTER (WHERE c.retired_at IS NULL)
      INTO v_recent, v_live
    FROM public.collector_secrets AS cs
    JOIN public.collectors AS c ON c.collector_uuid = cs.collector_uuid
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
    FROM public.collectors AS c
    JOIN public.collector_secrets AS cs ON cs.collector_uuid = c.collector_uuid
    WHERE c.egress_key = v_key AND c.retired_at IS NULL AND cs.registered_by <> v_role
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'egress key % is in use by collectors of role %', v_key, v_owner
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'each host registers its own egress key; an operator retires the other role''s collectors first (bf4ps-ops collectors retire NAME)';
    END IF;

    SELECT c.collector_uuid, c.hostname, c.heartbeat_state, c.drained, c.current_job_id,
           extract(epoch FROM now() - c.last_heartbeat_at)::float8 AS age_s,
           (SELECT cs.registered_by FROM public.collector_secrets AS cs
            WHERE cs.collector_uuid = c.collector_uuid) AS registered_by
      INTO h
    FROM public.collectors AS c
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
        UPDATE public.collectors AS c
        SET retired_at = now(), drained = true, updated_at = now()
        WHERE c.collector_uuid = h.collector_uuid;
        IF h.collector_uuid IN (SELECT cs.collector_uuid FROM public.collector_secrets AS cs
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
        INSERT INTO public.collectors AS c
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
    INSERT INTO public.collector_secrets (collector_uuid, secret_sha256, registered_by)
    VALUES (v_uuid, sha256(convert_to(v_secret::text, 'UTF8')), v_role);
    collector_uuid := v_uuid;
    secret := v_secret;
    holder_hostname := NULL;
    holder_age_s := NULL;
    RETURN NEXT;
END;
$$;


ALTER FUNCTION public.bf4ps_collector_register(p_name text, p_hostname text, p_lane text, p_egress_key text, p_software_version text) OWNER TO bf4ps_definer;

--
-- Name: bf4ps_collector_renew(uuid, uuid, bigint, uuid); Type: FUNCTION; Schema: public; Owner: bf4ps_definer
--

CREATE FUNCTION public.bf4ps_collector_renew(p_uuid uuid, p_secret uuid, p_job_id bigint, p_lease_token uuid) RETURNS timestamp with time zone
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
DECLARE
    v_expires timestamptz;
    v_duration interval;
BEGIN
    PERFORM public.bf4ps_collector_check_secret(p_uuid, p_secret);
    SELECT s.lease_duration INTO v_duration FROM public.scheduling_settings AS s;
    SELECT j.lease_expires_at INTO v_expires
    FROM public.collection_jobs AS j
    WHERE j.job_id = p_job_id AND j.collector_uuid = p_uuid AND j.lease_token = p_lease_token
      AND j.status IN ('claimed', 'running') AND j.lease_expires_at > now();
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF v_expires > now() + v_duration * 0.75 AND v_expires <= now() + v_duration THEN
        -- Renewed recently enough: answer only.
        RETURN v_expires;
    END IF;
    UPDATE public.collection_jobs AS j
    SET lease_expires_at = now() + v_duration,
        updated_at = now()
    WHERE j.job_id = p_job_id AND j.collector_uuid = p_uuid AND j.lease_token = p_lease_token
      AND j.status IN ('claimed', 'running') AND j.lease_expires_at > now()
    RETURNING j.lease_expires_at INTO v_expires;
    RETURN v_expires;
END;
$$;


ALTER FUNCTION public.bf4ps_collector_renew(p_uuid uuid, p_secret uuid, p_job_id bigint, p_lease_token uuid) OWNER TO bf4ps_definer;

--
-- Name: bf4ps_collector_start(uuid, uuid, bigint, uuid); Type: FUNCTION; Schema: public; Owner: bf4ps_definer
--

CREATE FUNCTION public.bf4ps_collector_start(p_uuid uuid, p_secret uuid, p_job_id bigint, p_lease_token uuid) RETURNS timestamp with time zone
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
DECLARE
    v_expires timestamptz;
BEGIN
    PERFORM public.bf4ps_collector_check_secret(p_uuid, p_secret);
    PERFORM set_config('synchronous_commit', 'off', true);
    WITH started AS (
        UPDATE public.collection_jobs AS j
        SET status = 'running', started_at = now(), updated_at = now()
        WHERE j.job_id = p_job_id AND j.status = 'claimed' AND j.collector_uuid = p_uuid
          AND j.lease_token = p_lease_token AND j.lease_expires_at > now()
        RETURNING j.job_id, j.soldier_id, j.resource, j.lane, j.attempt_count, j.lease_token,
                  j.lease_expires_at, j.claimed_at
    ), event AS (
        INSERT INTO public.collection_events
            (collector_uuid, collector_name_snapshot, hostname_snapshot, egress_key_snapshot,
             job_id, soldier_id, persona_id, platform, resource, lane, event_type,
             attempt_number, lease_token, metadata)
        SELECT p_uuid, c.collector_name, c.hostname, c.egress_key,
               j.job_id, j.soldier_id, s.persona_id, s.platform, j.resource, j.lane,
               'started', j.attempt_count, j.lease_token,
               jsonb_build_object('claim_to_start_ms',
                                  floor(extract(epoch FROM now() - j.claimed_at) * 1000))
        FROM started AS j
        JOIN public.soldiers AS s ON s.soldier_id = j.soldier_id
        JOIN public.collectors AS c ON c.collector_uuid = p_uuid
    )
    SELECT started.lease_expires_at INTO v_expires FROM started;
    RETURN v_expires;
END;
$$;


ALTER FUNCTION public.bf4ps_collector_start(p_uuid uuid, p_secret uuid, p_job_id bigint, p_lease_token uuid) OWNER TO bf4ps_definer;

--
-- Name: bf4ps_collector_stopped(uuid, uuid); Type: FUNCTION; Schema: public; Owner: bf4ps_definer
--

CREATE FUNCTION public.bf4ps_collector_stopped(p_uuid uuid, p_secret uuid) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
BEGIN
    PERFORM public.bf4ps_collector_check_secret(p_uuid, p_secret);
    UPDATE public.collectors AS x
    SET drained = true, updated_at = now()
    WHERE x.collector_uuid = p_uuid;
END;
$$;


ALTER FUNCTION public.bf4ps_collector_stopped(p_uuid uuid, p_secret uuid) OWNER TO bf4ps_definer;

--
-- Name: bf4ps_collector_succeed(uuid, uuid, bigint, uuid, jsonb, bigint, integer); Type: FUNCTION; Schema: public; Owner: bf4ps_definer
--

CREATE FUNCTION public.bf4ps_collector_succeed(p_uuid uuid, p_secret uuid, p_job_id bigint, p_lease_token uuid, p_data jsonb, p_duration_ms bigint, p_http_status integer) RETURNS TABLE(changed boolean, history_appended boolean, previous_success_at timestamp with time zone, next_due_at timestamp with time zone)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
DECLARE
    v_resource text;
BEGIN
    PERFORM public.bf4ps_collector_check_secret(p_uuid, p_secret);
    SELECT j.resource INTO v_resource
    FROM public.collection_jobs AS j
    WHERE j.job_id = p_job_id AND j.collector_uuid = p_uuid AND j.lease_token = p_lease_token
      AND j.status = 'running' AND j.lease_expires_at > now();
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM public.bf4ps_check_document(v_resource, p_data, now());
    RETURN QUERY SELECT * FROM public.bf4ps_succeed_job(
        p_uuid, p_job_id, p_lease_token, p_data, p_duration_ms, p_http_status, now());
END;
$$;


ALTER FUNCTION public.bf4ps_collector_succeed(p_uuid uuid, p_secret uuid, p_job_id bigint, p_lease_token uuid, p_data jsonb, p_duration_ms bigint, p_http_status integer) OWNER TO bf4ps_definer;

--
-- Name: bf4ps_country_ok(text); Type: FUNCTION; Schema: public; Owner: <migrator>
--

CREATE FUNCTION public.bf4ps_country_ok(code text) RETURNS boolean
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
    SELECT code = ANY ('{
        AD,AE,AF,AG,AI,AL,AM,AO,AQ,AR,AS,AT,AU,AW,AX,AZ,BA,BB,BD,BE,BF,BG,BH,BI,BJ,BL,BM,BN,BO,BQ,
        BR,BS,BT,BV,BW,BY,BZ,CA,CC,CD,CF,CG,CH,CI,CK,CL,CM,CN,CO,CR,CU,CV,CW,CX,CY,CZ,DE,DJ,DK,DM,
        DO,DZ,EC,EE,EG,EH,ER,ES,ET,FI,FJ,FK,FM,FO,FR,GA,GB,GD,GE,GF,GG,GH,GI,GL,GM,GN,GP,GQ,GR,GS,
        GT,GU,GW,GY,HK,HM,HN,HR,HT,HU,ID,IE,IL,IM,IN,IO,IQ,IR,IS,IT,JE,JM,JO,JP,KE,KG,KH,KI,KM,KN,
        KP,KR,KW,KY,KZ,LA,LB,LC,LI,LK,LR,LS,LT,LU,LV,LY,MA,MC,MD,ME,MF,MG,MH,MK,ML,MM,MN,MO,MP,MQ,
        MR,MS,MT,MU,MV,MW,MX,MY,MZ,NA,NC,NE,NF,NG,NI,NL,NO,NP,NR,NU,NZ,OM,PA,PE,PF,PG,PH,PK,PL,PM,
        PN,PR,PS,PT,PW,PY,QA,RE,RO,RS,RU,RW,SA,SB,SC,SD,SE,SG,SH,SI,SJ,SK,SL,SM,SN,SO,SR,SS,ST,SV,
        SX,SY,SZ,TC,TD,TF,TG,TH,TJ,TK,TL,TM,TN,TO,TR,TT,TV,TW,TZ,UA,UG,UM,US,UY,UZ,VA,VC,VE,VG,VI,
        VN,VU,WF,WS,YE,YT,ZA,ZM,ZW
    }'::text[])
$$;


ALTER FUNCTION public.bf4ps_country_ok(code text) OWNER TO <migrator>;

SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: collector_secrets; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.collector_secrets (
    collector_uuid uuid NOT NULL,
    secret_sha256 bytea NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    registered_by text,
    CONSTRAINT collector_secrets_sha256_length CHECK ((length(secret_sha256) = 32))
);


ALTER TABLE public.collector_secrets OWNER TO <migrator>;

--
-- Name: collectors; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.collectors (
    collector_uuid uuid DEFAULT gen_random_uuid() NOT NULL,
    collector_name text NOT NULL,
    hostname text NOT NULL,
    lane text NOT NULL,
    egress_key text NOT NULL,
    enabled boolean DEFAULT true NOT NULL,
    drained boolean DEFAULT false NOT NULL,
    software_version text,
    started_at timestamp with time zone,
    last_heartbeat_at timestamp with time zone,
    heartbeat_state text DEFAULT 'unknown'::text NOT NULL,
    heartbeat_lost_at timestamp with time zone,
    current_job_id bigint,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    retired_at timestamp with time zone,
    CONSTRAINT collectors_egress_nonempty CHECK ((btrim(egress_key) <> ''::text)),
    CONSTRAINT collectors_heartbeat_state_check CHECK ((heartbeat_state = ANY (ARRAY['unknown'::text, 'healthy'::text, 'lost'::text]))),
    CONSTRAINT collectors_hostname_nonempty CHECK ((btrim(hostname) <> ''::text)),
    CONSTRAINT collectors_lane_check CHECK ((lane = ANY (ARRAY['background'::text, 'interactive'::text]))),
    CONSTRAINT collectors_name_nonempty CHECK ((btrim(collector_name) <> ''::text))
);


ALTER TABLE public.collectors OWNER TO <migrator>;

--
-- Name: scheduling_settings; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.scheduling_settings (
    singleton boolean DEFAULT true NOT NULL,
    eta_window interval DEFAULT '00:15:00'::interval NOT NULL,
    egress_rate double precision DEFAULT 0.2 NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    max_pending_interactive integer DEFAULT 1000 NOT NULL,
    lease_duration interval DEFAULT '00:01:00'::interval NOT NULL,
    heartbeat_lost_after interval DEFAULT '00:00:30'::interval NOT NULL,
    egress_spacing interval DEFAULT '00:00:05'::interval NOT NULL,
    budget_spacing interval DEFAULT '00:00:02.792438'::interval,
    throttle_pause interval DEFAULT '00:01:00'::interval NOT NULL,
    throttle_pause_max interval DEFAULT '00:30:00'::interval NOT NULL,
    retry_ladder interval[] DEFAULT ARRAY['00:15:00'::interval, '01:00:00'::interval, '06:00:00'::interval, '24:00:00'::interval] NOT NULL,
    retry_jitter double precision DEFAULT 0.1 NOT NULL,
    retry_max_attempts integer DEFAULT 4 NOT NULL,
    refresh_detailed interval DEFAULT '24:00:00'::interval NOT NULL,
    refresh_profile interval DEFAULT '30 days'::interval NOT NULL,
    refresh_weapons interval DEFAULT '7 days'::interval NOT NULL,
    refresh_vehicles interval DEFAULT '7 days'::interval NOT NULL,
    registrations_per_hour integer DEFAULT 120 NOT NULL,
    collectors_per_role integer DEFAULT 50 NOT NULL,
    budget_requests integer DEFAULT 1296 NOT NULL,
    budget_window interval DEFAULT '01:00:00'::interval NOT NULL,
    share_active_max double precision DEFAULT 0.75 NOT NULL,
    share_bootstrap_min double precision DEFAULT 0.20 NOT NULL,
    share_retry_min double precision DEFAULT 0.05 NOT NULL,
    active_window interval DEFAULT '24:00:00'::interval NOT NULL,
    interactive_cooldown interval DEFAULT '00:10:00'::interval NOT NULL,
    catalog_seed integer DEFAULT 200 NOT NULL,
    catalog_new_per_day integer DEFAULT 50 NOT NULL,
    unavailable_recheck interval DEFAULT '01:00:00'::interval NOT NULL,
    vehicle_catalog_seed integer DEFAULT 100 NOT NULL,
    CONSTRAINT scheduling_settings_catalog_check CHECK (((catalog_seed >= 0) AND (catalog_new_per_day >= 0))),
    CONSTRAINT scheduling_settings_egress_rate_check CHECK (((egress_rate > (0)::double precision) AND (egress_rate < 'Infinity'::double precision))),
    CONSTRAINT scheduling_settings_eta_window_check CHECK ((eta_window > '00:00:00'::interval)),
    CONSTRAINT scheduling_settings_interactive_cooldown_check CHECK ((interactive_cooldown >= '00:00:00'::interval)),
    CONSTRAINT scheduling_settings_max_pending_interactive_check CHECK ((max_pending_interactive > 0)),
    CONSTRAINT scheduling_settings_policy_check CHECK (((active_window > '00:00:00'::interval) AND (lease_duration > '00:00:00'::interval) AND (heartbeat_lost_after > '00:00:00'::interval) AND (egress_spacing > '00:00:00'::interval) AND ((budget_spacing IS NULL) OR (budget_spacing > '00:00:00'::interval)) AND (throttle_pause > '00:00:00'::interval) AND (throttle_pause_max >= throttle_pause) AND ((cardinality(retry_ladder) >= 1) AND (cardinality(retry_ladder) <= 32)) AND (retry_jitter >= (0)::double precision) AND (retry_jitter <= (1)::double precision) AND (retry_max_attempts > 0) AND (refresh_detailed > '00:00:00'::interval) AND (refresh_profile > '00:00:00'::interval) AND (refresh_weapons > '00:00:00'::interval) AND (refresh_vehicles > '00:00:00'::interval) AND (registrations_per_hour > 0) AND (collectors_per_role > 0) AND (budget_requests > 0) AND (budget_window > '00:00:00'::interval) AND ((share_active_max >= (0)::double precision) AND (share_active_max <= (1)::double precision)) AND ((share_bootstrap_min >= (0)::double precision) AND (share_bootstrap_min <= (1)::double precision)) AND ((share_retry_min >= (0)::double precision) AND (share_retry_min <= (1)::double precision)) AND ((share_bootstrap_min + share_retry_min) <= (1)::double precision))),
    CONSTRAINT scheduling_settings_singleton CHECK (singleton),
    CONSTRAINT scheduling_settings_unavailable_recheck_check CHECK ((unavailable_recheck > '00:00:00'::interval)),
    CONSTRAINT scheduling_settings_vehicle_catalog_seed_check CHECK ((vehicle_catalog_seed >= 0))
);


ALTER TABLE public.scheduling_settings OWNER TO <migrator>;

--
-- Name: bf4ps_live_collectors(text, timestamp with time zone); Type: FUNCTION; Schema: public; Owner: <migrator>
--

CREATE FUNCTION public.bf4ps_live_collectors(p_lane text, p_at timestamp with time zone) RETURNS TABLE(host text, egress_key text, started_at timestamp with time zone)
    LANGUAGE sql STABLE
    BEGIN ATOMIC
 SELECT COALESCE(cs.registered_by, ('(key) '::text || c.egress_key)) AS "coalesce",
     c.egress_key,
     c.started_at
    FROM ((public.collectors c
      LEFT JOIN public.collector_secrets cs ON ((cs.collector_uuid = c.collector_uuid)))
      CROSS JOIN public.scheduling_settings s)
   WHERE ((c.lane = bf4ps_live_collectors.p_lane) AND c.enabled AND (NOT c.drained) AND (c.retired_at IS NULL) AND (c.heartbeat_state <> 'lost'::text) AND (c.last_heartbeat_at > (bf4ps_live_collectors.p_at - s.heartbeat_lost_after)));
END;


ALTER FUNCTION public.bf4ps_live_collectors(p_lane text, p_at timestamp with time zone) OWNER TO <migrator>;

--
-- Name: egress_gates; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.egress_gates (
    egress_key text NOT NULL,
    next_slot_at timestamp with time zone NOT NULL,
    passes bigint DEFAULT 0 NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    paused_until timestamp with time zone,
    throttle_streak integer DEFAULT 0 NOT NULL,
    budget_wanted_at timestamp with time zone,
    budget_next_at timestamp with time zone,
    host text,
    budget_spent_at timestamp with time zone,
    CONSTRAINT egress_gates_key_nonempty CHECK ((btrim(egress_key) <> ''::text)),
    CONSTRAINT egress_gates_passes_check CHECK ((passes >= 0)),
    CONSTRAINT egress_gates_throttle_streak_check CHECK ((throttle_streak >= 0))
);


ALTER TABLE public.egress_gates OWNER TO <migrator>;

--
-- Name: egress_hosts; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.egress_hosts (
    host text NOT NULL,
    budget_next_at timestamp with time zone,
    budget_spent_at timestamp with time zone,
    interactive_claims bigint DEFAULT 0 NOT NULL,
    interactive_at timestamp with time zone,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    interactive_passed_at timestamp with time zone,
    budget_passed_at timestamp with time zone,
    CONSTRAINT egress_hosts_host_nonempty CHECK ((host <> ''::text)),
    CONSTRAINT egress_hosts_interactive_claims_check CHECK ((interactive_claims >= 0))
);


ALTER TABLE public.egress_hosts OWNER TO <migrator>;

--
-- Name: bf4ps_egress_budget_newcomer(text, timestamp with time zone, interval); Type: FUNCTION; Schema: public; Owner: <migrator>
--

CREATE FUNCTION public.bf4ps_egress_budget_newcomer(p_host text, p_at timestamp with time zone, p_budget_spacing interval) RETURNS TABLE(host text, since timestamp with time zone)
    LANGUAGE sql STABLE
    BEGIN ATOMIC
 SELECT n.host,
     n.started_at
    FROM ((public.bf4ps_live_collectors('background'::text, bf4ps_egress_budget_newcomer.p_at) n(host, egress_key, started_at)
      LEFT JOIN public.egress_hosts h ON ((h.host = n.host)))
      LEFT JOIN public.egress_gates g ON ((g.egress_key = n.egress_key)))
   WHERE ((n.host <> bf4ps_egress_budget_newcomer.p_host) AND ((g.paused_until IS NULL) OR (g.paused_until <= bf4ps_egress_budget_newcomer.p_at)) AND ((h.budget_spent_at IS NULL) OR (h.budget_spent_at <= (bf4ps_egress_budget_newcomer.p_at - '00:01:00'::interval))) AND (NOT (EXISTS ( SELECT 1
            FROM public.egress_hosts p
           WHERE (p.budget_passed_at >= (GREATEST(COALESCE(n.started_at, '-infinity'::timestamp with time zone), h.budget_next_at) + bf4ps_egress_budget_newcomer.p_budget_spacing))))));
END;


ALTER FUNCTION public.bf4ps_egress_budget_newcomer(p_host text, p_at timestamp with time zone, p_budget_spacing interval) OWNER TO <migrator>;

--
-- Name: bf4ps_egress_gate(text, text, interval, boolean, timestamp with time zone); Type: FUNCTION; Schema: public; Owner: <migrator>
--

CREATE FUNCTION public.bf4ps_egress_gate(p_key text, p_host text, p_budget_spacing interval, p_interactive boolean, p_now timestamp with time zone, OUT claim_at timestamp with time zone, OUT go_at timestamp with time zone, OUT paused boolean, OUT entitled boolean, OUT locked boolean) RETURNS record
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
DECLARE
    v_budget timestamptz;
    v_next timestamptz;
    v_paused timestamptz;
    v_own timestamptz;
    v_host_own timestamptz;
    v_claims bigint;
    v_at timestamptz;
    v_least bigint;
    v_locked boolean := false;
BEGIN
    claim_at := coalesce(p_now, clock_timestamp());
    LOOP
        -- First a look without locks; then, if the claim may go, the same
        -- under the locks.
        IF v_locked THEN
            IF p_budget_spacing IS NOT NULL THEN
                SELECT b.next_slot_at INTO v_budget
                FROM public.egress_budget AS b WHERE b.singleton FOR UPDATE;
            END IF;
            -- (The host's row only when the grant spends from it: the keys
            -- of one host do not queue on it for an unbudgeted background
            -- grant.)
            IF p_budget_spacing IS NOT NULL OR p_interactive THEN
                SELECT h.budget_next_at, h.interactive_claims, h.interactive_at
                  INTO v_host_own, v_claims, v_at
                FROM public.egress_hosts AS h WHERE h.host = p_host FOR UPDATE;
                IF NOT FOUND THEN
                    INSERT INTO public.egress_hosts (host) VALUES (p_host)
                    ON CONFLICT (host) DO NOTHING;
                    SELECT h.budget_next_at, h.interactive_claims, h.interactive_at
                      INTO v_host_own, v_claims, v_at
                    FROM public.egress_hosts AS h WHERE h.host = p_host FOR UPDATE;
                END IF;
            END IF;
            SELECT g.next_slot_at, g.paused_until, g.budget_next_at INTO v_next, v_paused, v_own
            FROM public.egress_gates AS g WHERE g.egress_key = p_key FOR UPDATE;
            IF NOT FOUND THEN
                INSERT INTO public.egress_gates (egress_key, next_slot_at, passes, host)
                VALUES (p_key, '-infinity', 0, p_host)
                ON CONFLICT (egress_key) DO NOTHING;
                SELECT g.next_slot_at, g.paused_until, g.budget_next_at
                  INTO v_next, v_paused, v_own
                FROM public.egress_gates AS g WHERE g.egress_key = p_key FOR UPDATE;
            END IF;
            claim_at := coalesce(p_now, clock_timestamp());
        ELSE
            -- (One statement: a claim that may not go costs one read.)
            SELECT b.next_slot_at, h.budget_next_at, h.interactive_claims, h.interactive_at,
                   g.next_slot_at, g.paused_until, g.budget_next_at
              INTO v_budget, v_host_own, v_claims, v_at, v_next, v_paused, v_own
            FROM (SELECT) AS one
            LEFT JOIN public.egress_budget AS b
                   ON p_budget_spacing IS NOT NULL AND b.singleton
            LEFT JOIN public.egress_hosts AS h
                   ON (p_budget_spacing IS NOT NULL OR p_interactive) AND h.host = p_host
            LEFT JOIN public.egress_gates AS g ON g.egress_key = p_key;
        END IF;
        IF p_budget_spacing IS NOT NULL THEN
            -- The host's own slot passed (or none yet): entitled at the
            -- budget's slot; otherwise half a spacing after it. The key's
            -- own slot (its turn among its host's keys) always binds
            -- (greatest ignores NULLs).
            entitled := coalesce(v_host_own <= claim_at, true);
            go_at := greatest(v_next, v_paused, v_budget, v_own,
                              least(coalesce(v_host_own, '-infinity'),
                                    v_budget + p_budget_spacing / 2));
        ELSE
            IF p_interactive AND v_at > claim_at - interval '1 minute' THEN
                SELECT min(h.interactive_claims) INTO v_least
                FROM public.egress_hosts AS h
                WHERE h.host <> p_host AND h.interactive_at > claim_at - interval '1 minute';
                entitled := v_least IS NULL OR v_claims <= v_least + 1;
                -- (Looked for only when it decides: a newcomer costs the
                -- hosts ahead of it one read.)
                IF entitled THEN
                    entitled := NOT EXISTS (
                        SELECT 1 FROM public.bf4ps_egress_newcomer(p_host, claim_at) AS n);
                END IF;
            ELSE
                entitled := true;
            END IF;
            go_at := greatest(v_next, v_paused);
        END IF;
        paused := coalesce(v_paused > claim_at, false);
        -- (An interactive caller that is not entitled takes no lock: the
        -- claim looks for a job that waited long enough first.)
        EXIT WHEN v_locked OR go_at > claim_at OR (p_interactive AND NOT entitled);
        v_locked := true;
    END LOOP;
    locked := v_locked;
END;
$$;


ALTER FUNCTION public.bf4ps_egress_gate(p_key text, p_host text, p_budget_spacing interval, p_interactive boolean, p_now timestamp with time zone, OUT claim_at timestamp with time zone, OUT go_at timestamp with time zone, OUT paused boolean, OUT entitled boolean, OUT locked boolean) OWNER TO <migrator>;

--
-- Name: bf4ps_egress_newcomer(text, timestamp with time zone); Type: FUNCTION; Schema: public; Owner: <migrator>
--

CREATE FUNCTION public.bf4ps_egress_newcomer(p_host text, p_at timestamp with time zone) RETURNS TABLE(host text, since timestamp with time zone)
    LANGUAGE sql STABLE
    BEGIN ATOMIC
 SELECT n.host,
     n.started_at
    FROM (public.bf4ps_live_collectors('interactive'::text, bf4ps_egress_newcomer.p_at) n(host, egress_key, started_at)
      LEFT JOIN public.egress_hosts h ON ((h.host = n.host)))
   WHERE ((n.host <> bf4ps_egress_newcomer.p_host) AND ((h.interactive_at IS NULL) OR (h.interactive_at <= (bf4ps_egress_newcomer.p_at - '00:01:00'::interval))) AND (NOT (EXISTS ( SELECT 1
            FROM public.egress_hosts p
           WHERE (p.interactive_passed_at >= (GREATEST(COALESCE(n.started_at, '-infinity'::timestamp with time zone), h.interactive_at) + '00:00:01'::interval))))));
END;


ALTER FUNCTION public.bf4ps_egress_newcomer(p_host text, p_at timestamp with time zone) OWNER TO <migrator>;

--
-- Name: bf4ps_egress_spend(text, text, interval, interval, boolean, boolean, timestamp with time zone); Type: FUNCTION; Schema: public; Owner: <migrator>
--

CREATE FUNCTION public.bf4ps_egress_spend(p_key text, p_host text, p_spacing interval, p_budget_spacing interval, p_interactive boolean, p_entitled boolean, p_at timestamp with time zone) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
BEGIN
    IF p_budget_spacing IS NOT NULL THEN
        UPDATE public.egress_budget AS b
        SET next_slot_at = p_at + p_budget_spacing, passes = b.passes + 1, updated_at = p_at
        WHERE b.singleton;
        IF p_entitled THEN
            UPDATE public.egress_hosts AS h
            SET budget_next_at = p_at + p_budget_spacing * (
                    SELECT count(*) + 1 FROM (
                        SELECT o.host FROM public.egress_hosts AS o
                        WHERE o.budget_spent_at > p_at - interval '1 minute'
                          AND o.host <> p_host
                        UNION
                        SELECT n.host
                        FROM public.bf4ps_egress_budget_newcomer(p_host, p_at,
                                                                    p_budget_spacing) AS n
                    ) AS k),
                budget_spent_at = p_at, updated_at = p_at
            WHERE h.host = p_host;
        ELSE
            UPDATE public.egress_hosts AS h
            SET budget_passed_at = p_at, updated_at = p_at
            WHERE h.host = p_host;
        END IF;
    ELSIF p_interactive AND p_entitled THEN
        UPDATE public.egress_hosts AS h
        SET interactive_claims = CASE
                WHEN h.interactive_at > p_at - interval '1 minute' THEN h.interactive_claims
                ELSE coalesce((
                    SELECT min(o.interactive_claims) FROM public.egress_hosts AS o
                    WHERE o.host <> p_host AND o.interactive_at > p_at - interval '1 minute'),
                    h.interactive_claims)
                END + 1,
            interactive_at = p_at, updated_at = p_at
        WHERE h.host = p_host;
    ELSIF p_interactive THEN
        UPDATE public.egress_hosts AS h
        SET interactive_passed_at = p_at, updated_at = p_at
        WHERE h.host = p_host;
    END IF;
    UPDATE public.egress_gates AS g
    SET next_slot_at = p_at + p_spacing, passes = g.passes + 1, updated_at = p_at, host = p_host,
        -- (A paused key wants it but may not use it: not counted.)
        budget_next_at = CASE WHEN p_budget_spacing IS NULL THEN g.budget_next_at
                              ELSE p_at + p_budget_spacing * (
                                  SELECT count(*) + 1 FROM (
                                      SELECT o.egress_key FROM public.egress_gates AS o
                                      WHERE o.host = p_host AND o.egress_key <> p_key
                                        AND o.budget_spent_at > p_at - interval '1 minute'
                                        AND (o.paused_until IS NULL OR o.paused_until <= p_at)
                                      UNION
                                      SELECT c.egress_key
                                      FROM public.bf4ps_live_collectors('background', p_at)
                                           AS c
                                      LEFT JOIN public.egress_gates AS o
                                             ON o.egress_key = c.egress_key
                                      WHERE c.host = p_host AND c.egress_key <> p_key
                                        AND (o.paused_until IS NULL OR o.paused_until <= p_at)
                                  ) AS k) END,
        budget_spent_at = CASE WHEN p_budget_spacing IS NULL THEN g.budget_spent_at ELSE p_at END
    WHERE g.egress_key = p_key;
END;
$$;


ALTER FUNCTION public.bf4ps_egress_spend(p_key text, p_host text, p_spacing interval, p_budget_spacing interval, p_interactive boolean, p_entitled boolean, p_at timestamp with time zone) OWNER TO <migrator>;

--
-- Name: bf4ps_eta_schedule(bigint[], interval, double precision); Type: FUNCTION; Schema: public; Owner: <migrator>
--

CREATE FUNCTION public.bf4ps_eta_schedule(p_jobs bigint[], p_window interval, p_egress_rate double precision) RETURNS TABLE(job_id bigint, eta_seconds double precision)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    all_resources constant text[] := ARRAY['detailed', 'profile', 'weapons', 'vehicles'];
    simulated constant integer := 1000;
    v_clock timestamptz := clock_timestamp();
    v_now double precision := extract(epoch FROM v_clock);
    v_spacing double precision;
    v_service double precision[] := ARRAY[NULL, NULL, NULL, NULL]::double precision[];
    v_known double precision;
    v_keys text[] := ARRAY[]::text[];
    v_ready double precision[] := ARRAY[]::double precision[];
    v_free double precision[] := ARRAY[]::double precision[];
    v_key_of integer[] := ARRAY[]::integer[];
    v_eta double precision[];
    v_left integer;
    v_placed integer := 0;
    v_last_start double precision := 0;
    v_best integer;
    v_best_start double precision;
    v_start double precision;
    v_extra bigint;
    v_med double precision;
    n integer;
    ki integer;
    ci integer;
    r record;
BEGIN
    IF coalesce(cardinality(p_jobs), 0) = 0 THEN
        RETURN;
    END IF;
    v_eta := array_fill(NULL::double precision, ARRAY[cardinality(p_jobs)]);
    v_spacing := CASE WHEN p_egress_rate > 0 AND p_egress_rate < 'Infinity'::double precision
                      THEN least(1.0 / greatest(p_egress_rate, 1e-6), 86400.0) ELSE 0 END;

    -- Service time per resource: the median of its recent outcomes.
    FOR n IN 1 .. 4 LOOP
        SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY s.d) INTO v_med
        FROM (
            SELECT least(greatest(extract(epoch FROM e.occurred_at - cl.occurred_at), 0), 3600)
                       ::double precision AS d
            FROM public.collection_events AS e
            CROSS JOIN LATERAL (
                SELECT x.occurred_at FROM public.collection_events AS x
                WHERE x.job_id = e.job_id AND x.event_type = 'claimed'
                  AND x.lease_token = e.lease_token
                LIMIT 1) AS cl
            WHERE e.lane = 'interactive'
              AND e.event_type IN ('succeeded', 'failed')
              AND e.occurred_at > v_clock - p_window
              AND e.resource = all_resources[n]
            ORDER BY e.occurred_at DESC
            LIMIT 100
        ) AS s;
        v_service[n] := v_med;
    END LOOP;
    SELECT avg(x) INTO v_known FROM unnest(v_service) AS x;
    FOR n IN 1 .. 4 LOOP
        v_service[n] := coalesce(v_service[n], v_known, 2.0);
    END LOOP;

    -- The live interactive collectors: when each is free, and its key.
    FOR r IN
        SELECT c.egress_key, j.resource,
               extract(epoch FROM public.bf4ps_sane_time(j.claimed_at)) AS claimed
        FROM public.collectors AS c
        LEFT JOIN public.collection_jobs AS j
          ON j.job_id = c.current_job_id AND j.collector_uuid = c.collector_uuid
         AND j.status IN ('claimed', 'running')
        WHERE c.lane = 'interactive'
          AND c.retired_at IS NULL
          AND c.enabled
          AND NOT c.drained
          AND c.heartbeat_state = 'healthy'
        ORDER BY c.collector_uuid
    LOOP
        ki := array_position(v_keys, r.egress_key);
        IF ki IS NULL THEN
            v_keys := v_keys || r.egress_key;
            v_ready := v_ready || 0::double precision;
            ki := cardinality(v_keys);
        END IF;
        v_key_of := v_key_of || ki;
        v_free := v_free || greatest(
            coalesce(r.claimed + v_service[array_position(all_resources, r.resource)] - v_now, 0),
            0);
    END LOOP;
    FOR r IN
        SELECT g.egress_key,
               extract(epoch FROM public.bf4ps_sane_time(greatest(g.next_slot_at, g.paused_until)))
                   AS go
        FROM public.egress_gates AS g
        WHERE g.egress_key = ANY (v_keys)
    LOOP
        v_ready[array_position(v_keys, r.egress_key)] := greatest(coalesce(r.go - v_now, 0), 0);
    END LOOP;

    -- Claimed or running: its claim + its service time.
    FOR r IN
        SELECT j.job_id, j.resource,
               extract(epoch FROM public.bf4ps_sane_time(j.claimed_at)) AS claimed
        FROM public.collection_jobs AS j
        WHERE j.job_id = ANY (p_jobs) AND j.status IN ('claimed', 'running')
    LOOP
        FOR n IN 1 .. cardinality(p_jobs) LOOP
            IF p_jobs[n] = r.job_id THEN
                v_eta[n] := greatest(
                    coalesce(r.claimed, v_now)
                        + v_service[array_position(all_resources, r.resource)] - v_now,
                    0);
            END IF;
        END LOOP;
    END LOOP;

    -- The pending jobs, in the claim's order, each to the collector that
    -- can start it first.
    SELECT count(*) INTO v_left
    FROM public.collection_jobs AS j
    WHERE j.job_id = ANY (p_jobs) AND j.status = 'pending' AND j.lane = 'interactive';
    IF v_left > 0 AND cardinality(v_free) > 0 THEN
        FOR r IN
            SELECT j.job_id, j.resource,
                   extract(epoch FROM public.bf4ps_sane_time(j.eligible_at)) AS eligible
            FROM public.collection_jobs AS j
            WHERE j.status = 'pending' AND j.lane = 'interactive'
            ORDER BY CASE j.priority_class
                         WHEN 'interactive' THEN 1
                         WHEN 'active' THEN 2
                         WHEN 'recent' THEN 3
                         WHEN 'bootstrap' THEN 4
                     END,
                     j.priority_value DESC, j.eligible_at, j.created_at, j.job_id
            LIMIT simulated
        LOOP
            v_best := NULL;
            FOR ci IN 1 .. cardinality(v_free) LOOP
                v_start := greatest(v_free[ci], v_ready[v_key_of[ci]]);
                IF v_best IS NULL OR v_start < v_best_start THEN
                    v_best := ci;
                    v_best_start := v_start;
                END IF;
            END LOOP;
            v_best_start := greatest(v_best_start, coalesce(r.eligible - v_now, 0));
            v_free[v_best] := v_best_start + v_service[array_position(all_resources, r.resource)];
            v_ready[v_key_of[v_best]] := v_best_start + v_spacing;
            v_last_start := v_best_start;
            v_placed := v_placed + 1;
            IF r.job_id = ANY (p_jobs) THEN
                FOR n IN 1 .. cardinality(p_jobs) LOOP
                    IF p_jobs[n] = r.job_id THEN
                        v_eta[n] := v_free[v_best];
                    END IF;
                END LOOP;
                v_left := v_left - 1;
                EXIT WHEN v_left = 0;
            END IF;
        END LOOP;
        -- Beyond the simulated jobs: the formula for the jobs in between.
        IF v_left > 0 THEN
            SELECT avg(x) INTO v_known FROM unnest(v_service) AS x;
            FOR n IN 1 .. cardinality(p_jobs) LOOP
                CONTINUE WHEN v_eta[n] IS NOT NULL OR p_jobs[n] IS NULL;
                SELECT count(*) INTO v_extra
                FROM public.collection_jobs AS me, public.collection_jobs AS o
                WHERE me.job_id = p_jobs[n] AND me.status = 'pending' AND me.lane = 'interactive'
                  AND o.lane = 'interactive'
                  AND o.status = 'pending'
                  AND (CASE o.priority_class WHEN 'interactive' THEN 1 WHEN 'active' THEN 2
                                             WHEN 'recent' THEN 3 WHEN 'bootstrap' THEN 4 END,
                       -o.priority_value::bigint, o.eligible_at, o.created_at, o.job_id)
                      <= (CASE me.priority_class WHEN 'interactive' THEN 1 WHEN 'active' THEN 2
                                                 WHEN 'recent' THEN 3 WHEN 'bootstrap' THEN 4 END,
                          -me.priority_value::bigint, me.eligible_at, me.created_at, me.job_id);
                IF v_extra > v_placed THEN
                    -- The last simulated job is the formula's first.
                    v_eta[n] := v_last_start + public.bf4ps_eta_seconds(
                        v_extra - v_placed + 1, cardinality(v_free), v_known,
                        p_egress_rate * cardinality(v_keys));
                END IF;
            END LOOP;
        END IF;
    END IF;

    RETURN QUERY
    SELECT p_jobs[i], v_eta[i] FROM generate_subscripts(p_jobs, 1) AS i ORDER BY i;
END;
$$;


ALTER FUNCTION public.bf4ps_eta_schedule(p_jobs bigint[], p_window interval, p_egress_rate double precision) OWNER TO <migrator>;

--
-- Name: bf4ps_eta_seconds(bigint, integer, double precision, double precision); Type: FUNCTION; Schema: public; Owner: <migrator>
--

CREATE FUNCTION public.bf4ps_eta_seconds(queue_position bigint, healthy_collectors integer, mean_duration_s double precision, egress_rate double precision) RETURNS double precision
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
    SELECT CASE
        WHEN queue_position IS NULL OR healthy_collectors IS NULL OR healthy_collectors <= 0
            THEN NULL
        ELSE greatest(
            ceil(greatest(queue_position, 1)::double precision / healthy_collectors) * p.duration,
            CASE
                WHEN egress_rate > 0 AND egress_rate < 'Infinity'::double precision
                    THEN (greatest(queue_position, 1) - 1)::double precision
                         / greatest(egress_rate, 1e-6) + p.duration
                ELSE 0
            END)
    END
    FROM (SELECT CASE
                     WHEN mean_duration_s >= 0 AND mean_duration_s < 'Infinity'::double precision
                         THEN least(mean_duration_s, 3600)
                     ELSE 2.0
                 END AS duration) AS p
$$;


ALTER FUNCTION public.bf4ps_eta_seconds(queue_position bigint, healthy_collectors integer, mean_duration_s double precision, egress_rate double precision) OWNER TO <migrator>;

--
-- Name: bf4ps_fail_job(uuid, bigint, uuid, text, integer, text, bigint, timestamp with time zone); Type: FUNCTION; Schema: public; Owner: <migrator>
--

CREATE FUNCTION public.bf4ps_fail_job(p_uuid uuid, p_job_id bigint, p_lease_token uuid, p_error_class text, p_http_status integer, p_message text, p_duration_ms bigint, p_now timestamp with time zone) RETURNS TABLE(outcome text, eligible_at timestamp with time zone, next_due_at timestamp with time zone, paused_until timestamp with time zone)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    j record;
    s record;
    v_message text;
    v_failures integer;
    v_attempts integer;
    v_delay interval;
    v_paused timestamptz;
    v_eligible timestamptz;
    v_next timestamptz;
    v_outcome text;
    v_retry boolean;
    v_prev record;
    v_role text;
    v_unconfirmed boolean := false;
BEGIN
    IF p_error_class IS NULL OR p_error_class NOT IN
           ('transport', 'timeout', 'server', 'parse', 'throttled', 'http', 'unavailable') THEN
        RAISE EXCEPTION 'unknown error class % (expected transport, timeout, server, parse, throttled, http or unavailable)',
                coalesce(quote_literal(left(p_error_class, 40)), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_http_status IS NOT NULL AND (p_http_status < 100 OR p_http_status > 599) THEN
        RAISE EXCEPTION 'http_status must be 100-599 (got %)', p_http_status
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_duration_ms IS NULL OR p_duration_ms < 0 OR p_duration_ms > 86400000 THEN
        RAISE EXCEPTION 'duration_ms must be 0-86400000 (got %)', coalesce(p_duration_ms::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_message := regexp_replace(left(coalesce(p_message, ''), 500),
                                '[\x01-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]', ' ', 'g');

    SELECT x.job_id, x.soldier_id, so.persona_id, so.platform, x.resource, x.lane,
           x.attempt_count, x.throttled_attempts, c.collector_name, c.hostname, c.egress_key,
           CASE x.resource WHEN 'detailed' THEN st.detailed_consecutive_failures
                           WHEN 'profile' THEN st.profile_consecutive_failures
                           WHEN 'weapons' THEN st.weapons_consecutive_failures
                           ELSE st.vehicles_consecutive_failures END AS failures
      INTO j
    FROM public.collection_jobs AS x
    JOIN public.soldiers AS so ON so.soldier_id = x.soldier_id
    JOIN public.collectors AS c ON c.collector_uuid = x.collector_uuid
    LEFT JOIN public.collection_state AS st ON st.soldier_id = x.soldier_id
    WHERE x.job_id = p_job_id AND x.collector_uuid = p_uuid AND x.lease_token = p_lease_token
      AND x.status = 'running' AND x.lease_expires_at > p_now
    FOR UPDATE OF x;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT x.throttle_pause, x.throttle_pause_max, x.retry_ladder, x.retry_jitter,
           x.retry_max_attempts, x.unavailable_recheck
      INTO s
    FROM public.scheduling_settings AS x;
    v_failures := least(coalesce(j.failures, 0), 1000000) + 1;

    IF p_error_class = 'throttled' THEN
        -- The whole key pauses (every collector on it), unless a pause is
        -- running already: this answer was in flight before it began.
        INSERT INTO public.egress_gates AS g (egress_key, next_slot_at, paused_until, throttle_streak)
        VALUES (j.egress_key, p_now, p_now + s.throttle_pause, 1)
        ON CONFLICT (egress_key) DO UPDATE
        SET paused_until = CASE
                WHEN g.paused_until > p_now THEN g.paused_until
                ELSE p_now + least(s.throttle_pause * power(2, least(g.throttle_streak, 30)),
                                   s.throttle_pause_max) END,
            throttle_streak = CASE
                WHEN g.paused_until > p_now THEN g.throttle_streak
                ELSE least(g.throttle_streak + 1, 1000) END,
            updated_at = p_now
        RETURNING g.paused_until INTO v_paused;
        -- After the pause, spread out (the whole key's jobs wait for it).
        v_delay := least(v_paused - p_now, interval '1 day') * (1 + random() * s.retry_jitter);
        v_retry := true;
        v_outcome := 'throttled';
    ELSIF p_error_class = 'unavailable' THEN
        SELECT cs.registered_by INTO v_role
        FROM public.collector_secrets AS cs WHERE cs.collector_uuid = p_uuid;
        -- The pair's latest outcome (a soldier's few events, newest first).
        SELECT e.event_type = 'failed' AND e.error_class = 'unavailable' AS verdict,
               cs.registered_by
          INTO v_prev
        FROM public.collection_events AS e
        LEFT JOIN public.collector_secrets AS cs ON cs.collector_uuid = e.collector_uuid
        WHERE e.soldier_id = j.soldier_id AND e.resource = j.resource
          AND e.event_type IN ('succeeded', 'failed')
        ORDER BY e.occurred_at DESC, e.event_id DESC
        LIMIT 1;
        v_unconfirmed := NOT coalesce(
            v_prev.verdict
            AND (v_prev.registered_by <> v_role
                 OR NOT EXISTS (
                     SELECT 1
                     FROM public.collectors AS c
                     JOIN public.collector_secrets AS cs ON cs.collector_uuid = c.collector_uuid
                     WHERE c.lane = j.lane AND c.retired_at IS NULL AND c.enabled
                       AND NOT c.drained AND c.heartbeat_state <> 'lost'
                       AND cs.registered_by <> v_role)),
            false);
        IF v_unconfirmed THEN
            v_delay := s.unavailable_recheck;
            v_retry := true;
            v_outcome := 'retry_scheduled';
        ELSE
            v_retry := false;
            v_outcome := 'unavailable';
        END IF;
    ELSE
        v_attempts := j.attempt_count - j.throttled_attempts;
        v_delay := s.retry_ladder[least(v_failures, cardinality(s.retry_ladder))]
                   * (1 + (random() * 2 - 1) * s.retry_jitter);
        v_retry := v_attempts < s.retry_max_attempts;
        v_outcome := CASE WHEN v_retry THEN 'retry_scheduled' ELSE 'gave_up' END;
    END IF;
    v_next := CASE WHEN v_outcome = 'unavailable' THEN NULL ELSE p_now + v_delay END;

    PERFORM public.bf4ps_record_outcome(
        j.soldier_id, j.resource,
        CASE WHEN v_outcome = 'unavailable' THEN 'unavailable' ELSE 'temporary_failure' END,
        false, v_next, v_failures, p_error_class, v_message, p_now);

    IF v_retry THEN
        UPDATE public.collection_jobs AS x
        SET status = 'pending', collector_uuid = NULL, lease_token = NULL,
            claimed_at = NULL, started_at = NULL, lease_expires_at = NULL,
            eligible_at = v_next,
            throttled_attempts = x.throttled_attempts
                                 + CASE WHEN p_error_class = 'throttled' THEN 1 ELSE 0 END,
            last_error_class = p_error_class, last_error_at = p_now, updated_at = p_now
        WHERE x.job_id = p_job_id;
        v_eligible := v_next;
    ELSE
        DELETE FROM public.collection_jobs AS x WHERE x.job_id = p_job_id;
    END IF;
    UPDATE public.collectors AS c SET current_job_id = NULL, updated_at = p_now
    WHERE c.collector_uuid = p_uuid AND c.current_job_id = p_job_id;

    INSERT INTO public.collection_events
        (occurred_at, collector_uuid, collector_name_snapshot, hostname_snapshot,
         egress_key_snapshot, job_id, soldier_id, persona_id, platform, resource, lane,
         event_type, attempt_number, lease_token, result, duration_ms, http_status,
         error_class, error_message, metadata)
    SELECT p_now, p_uuid, j.collector_name, j.hostname, j.egress_key, j.job_id, j.soldier_id,
           j.persona_id, j.platform, j.resource, j.lane, e.event_type, j.attempt_count,
           p_lease_token, e.result, e.duration_ms, e.http_status, e.error_class, e.error_message,
           e.metadata
    FROM (VALUES
        (1, 'failed',
            CASE WHEN v_retry THEN 'retry' ELSE v_outcome END,
            p_duration_ms, p_http_status, p_error_class, v_message,
            jsonb_build_object('next_due_at', v_next, 'consecutive_failures', v_failures)
            || CASE WHEN v_unconfirmed THEN jsonb_build_object('verdict', 'unconfirmed')
                    ELSE '{}'::jsonb END),
        (2, 'retry_scheduled', NULL, NULL, NULL, NULL, NULL,
            jsonb_build_object('delay_ms', floor(extract(epoch FROM v_delay) * 1000),
                               'eligible_at', v_eligible)
            || CASE WHEN v_paused IS NULL THEN '{}'::jsonb
                    ELSE jsonb_build_object('egress_paused_until', v_paused) END)
    ) AS e(ord, event_type, result, duration_ms, http_status, error_class, error_message,
           metadata)
    WHERE e.ord = 1 OR v_retry
    ORDER BY e.ord;

    outcome := v_outcome;
    eligible_at := v_eligible;
    next_due_at := v_next;
    paused_until := v_paused;
    RETURN NEXT;
END;
$$;


ALTER FUNCTION public.bf4ps_fail_job(p_uuid uuid, p_job_id bigint, p_lease_token uuid, p_error_class text, p_http_status integer, p_message text, p_duration_ms bigint, p_now timestamp with time zone) OWNER TO <migrator>;

--
-- Name: bf4ps_feeder_row_changed(); Type: FUNCTION; Schema: public; Owner: bf4ps_definer
--

CREATE FUNCTION public.bf4ps_feeder_row_changed() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
BEGIN
    PERFORM public.bf4ps_feeder_sync(ARRAY[NEW.soldier_id]);
    RETURN NULL;
END;
$$;


ALTER FUNCTION public.bf4ps_feeder_row_changed() OWNER TO bf4ps_definer;

--
-- Name: bf4ps_feeder_rows_changed(); Type: FUNCTION; Schema: public; Owner: bf4ps_definer
--

CREATE FUNCTION public.bf4ps_feeder_rows_changed() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
BEGIN
    PERFORM public.bf4ps_feeder_sync(
        ARRAY(SELECT DISTINCT r.soldier_id FROM bf4ps_rows AS r ORDER BY 1));
    RETURN NULL;
END;
$$;


ALTER FUNCTION public.bf4ps_feeder_rows_changed() OWNER TO bf4ps_definer;

--
-- Name: bf4ps_feeder_sync(bigint[]); Type: FUNCTION; Schema: public; Owner: bf4ps_definer
--

CREATE FUNCTION public.bf4ps_feeder_sync(p_ids bigint[]) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
BEGIN
    -- (Each id probes the indexes, never `= ANY (p_ids)` against every row:
    -- a bulk statement passes thousands.)
    DELETE FROM public.feeder_pairs AS f
    WHERE f.soldier_id IN (
        SELECT i.id FROM unnest(p_ids) AS i(id)
        WHERE NOT EXISTS (SELECT 1 FROM public.collection_state AS cs
                          WHERE cs.soldier_id = i.id));
    INSERT INTO public.feeder_pairs AS f
        (soldier_id, resource, kind, phase, due_at, live_at, seen_at, first_seen_at)
    SELECT cs.soldier_id, p.resource, p.kind, 0, p.due_at,
           CASE p.kind WHEN 1 THEN src.seen_any
                       WHEN 3 THEN CASE WHEN confirmed.yes OR p.resource = 'detailed'
                                        THEN src.seen_any END
                       ELSE src.seen_bf4sw END,
           src.seen_any, so.first_seen_at
    FROM (SELECT DISTINCT i.id FROM unnest(p_ids) AS i(id)) AS i
    JOIN public.collection_state AS cs ON cs.soldier_id = i.id
    LEFT JOIN public.soldiers AS so ON so.soldier_id = cs.soldier_id
    LEFT JOIN LATERAL (
        SELECT max(s.last_seen_at) AS seen_any,
               max(s.last_seen_at) FILTER (WHERE s.source_type = 'bf4sw') AS seen_bf4sw,
               bool_or(s.source_type = 'bf4sw') AS bf4sw
        FROM public.soldier_sources AS s WHERE s.soldier_id = cs.soldier_id
    ) AS src ON true
    CROSS JOIN LATERAL (SELECT (cs.detailed_state = 'success' OR cs.weapons_state = 'success'
                                OR cs.vehicles_state = 'success'
                                OR cs.detailed_last_success_at IS NOT NULL
                                OR cs.weapons_last_success_at IS NOT NULL
                                OR cs.vehicles_last_success_at IS NOT NULL) AS yes
    ) AS confirmed
    CROSS JOIN LATERAL (VALUES
        ('detailed', cs.detailed_state, cs.detailed_next_due_at),
        ('profile', cs.profile_state, cs.profile_next_due_at),
        ('weapons', cs.weapons_state, cs.weapons_next_due_at),
        ('vehicles', cs.vehicles_state, cs.vehicles_next_due_at)
    ) AS x(resource, state, due_at)
    CROSS JOIN LATERAL (SELECT x.resource,
                               (CASE WHEN x.state = 'never_attempted'
                                          AND NOT coalesce(src.bf4sw, false) THEN 3
                                     WHEN x.state = 'never_attempted' THEN 1
                                     WHEN x.state = 'success' THEN 2 ELSE 0 END)::smallint AS kind,
                               x.due_at) AS p
    ORDER BY cs.soldier_id, p.resource
    ON CONFLICT (soldier_id, resource) DO UPDATE
    SET kind = EXCLUDED.kind, due_at = EXCLUDED.due_at, live_at = EXCLUDED.live_at,
        seen_at = EXCLUDED.seen_at, first_seen_at = EXCLUDED.first_seen_at,
        phase = CASE WHEN f.kind = EXCLUDED.kind
                          AND f.due_at IS NOT DISTINCT FROM EXCLUDED.due_at
                          AND EXCLUDED.live_at IS NOT NULL
                     THEN f.phase ELSE 0 END
    WHERE (f.kind, f.due_at, f.live_at, f.seen_at, f.first_seen_at)
          IS DISTINCT FROM (EXCLUDED.kind, EXCLUDED.due_at, EXCLUDED.live_at,
                            EXCLUDED.seen_at, EXCLUDED.first_seen_at);
END;
$$;


ALTER FUNCTION public.bf4ps_feeder_sync(p_ids bigint[]) OWNER TO bf4ps_definer;

--
-- Name: bf4ps_feeder_truncated(); Type: FUNCTION; Schema: public; Owner: bf4ps_definer
--

CREATE FUNCTION public.bf4ps_feeder_truncated() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
BEGIN
    DELETE FROM public.feeder_pairs;
    RETURN NULL;
END;
$$;


ALTER FUNCTION public.bf4ps_feeder_truncated() OWNER TO bf4ps_definer;

--
-- Name: bf4ps_freshness_compact(); Type: FUNCTION; Schema: public; Owner: <migrator>
--

CREATE FUNCTION public.bf4ps_freshness_compact() RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
DECLARE
    folded bigint;
BEGIN
    PERFORM 1 FROM public.bf4ps_locks
    WHERE lock_name = 'freshness_compaction' FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN -1;
    END IF;
    WITH taken AS (
        DELETE FROM public.freshness_deltas RETURNING resource, slot, pairs
    ), summed AS (
        SELECT resource, public.bf4ps_freshness_stored_slot(slot, now()) AS slot,
               sum(pairs) AS pairs, count(*) AS n
        FROM taken GROUP BY 1, 2
    ), applied AS (
        INSERT INTO public.freshness_rollup AS r (resource, slot, pairs)
        SELECT resource, slot, pairs FROM summed
        ON CONFLICT (resource, slot) DO UPDATE SET pairs = r.pairs + EXCLUDED.pairs
    )
    SELECT coalesce(sum(n), 0) INTO folded FROM summed;
    WITH aged AS (
        DELETE FROM public.freshness_rollup AS r
        WHERE r.slot <> public.bf4ps_freshness_stored_slot(r.slot, now())
        RETURNING r.resource, public.bf4ps_freshness_stored_slot(r.slot, now()) AS slot, r.pairs
    )
    INSERT INTO public.freshness_rollup AS r (resource, slot, pairs)
    SELECT resource, slot, sum(pairs) FROM aged GROUP BY 1, 2
    ON CONFLICT (resource, slot) DO UPDATE SET pairs = r.pairs + EXCLUDED.pairs;
    DELETE FROM public.freshness_rollup WHERE pairs = 0;
    RETURN folded;
END;
$$;


ALTER FUNCTION public.bf4ps_freshness_compact() OWNER TO <migrator>;

--
-- Name: bf4ps_freshness_deleted(); Type: FUNCTION; Schema: public; Owner: bf4ps_definer
--

CREATE FUNCTION public.bf4ps_freshness_deleted() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
BEGIN
    INSERT INTO public.freshness_deltas (resource, slot, pairs)
    SELECT p.resource, p.slot, -count(*)
    FROM bf4ps_old_state AS o
    CROSS JOIN LATERAL (VALUES
        ('detailed', public.bf4ps_freshness_slot(o.detailed_last_success_at)),
        ('profile', public.bf4ps_freshness_slot(o.profile_last_success_at)),
        ('weapons', public.bf4ps_freshness_slot(o.weapons_last_success_at)),
        ('vehicles', public.bf4ps_freshness_slot(o.vehicles_last_success_at))
    ) AS p(resource, slot)
    GROUP BY 1, 2;
    RETURN NULL;
END;
$$;


ALTER FUNCTION public.bf4ps_freshness_deleted() OWNER TO bf4ps_definer;

--
-- Name: bf4ps_freshness_inserted(); Type: FUNCTION; Schema: public; Owner: bf4ps_definer
--

CREATE FUNCTION public.bf4ps_freshness_inserted() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
BEGIN
    INSERT INTO public.freshness_deltas (resource, slot, pairs)
    SELECT p.resource, p.slot, count(*)
    FROM bf4ps_new_state AS n
    CROSS JOIN LATERAL (VALUES
        ('detailed', public.bf4ps_freshness_slot(n.detailed_last_success_at)),
        ('profile', public.bf4ps_freshness_slot(n.profile_last_success_at)),
        ('weapons', public.bf4ps_freshness_slot(n.weapons_last_success_at)),
        ('vehicles', public.bf4ps_freshness_slot(n.vehicles_last_success_at))
    ) AS p(resource, slot)
    GROUP BY 1, 2;
    RETURN NULL;
END;
$$;


ALTER FUNCTION public.bf4ps_freshness_inserted() OWNER TO bf4ps_definer;

--
-- Name: bf4ps_freshness_moved(); Type: FUNCTION; Schema: public; Owner: bf4ps_definer
--

CREATE FUNCTION public.bf4ps_freshness_moved() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
BEGIN
    INSERT INTO public.freshness_deltas (resource, slot, pairs)
    SELECT m.resource, s.slot, s.pairs
    FROM (VALUES
        ('detailed', OLD.detailed_last_success_at, NEW.detailed_last_success_at),
        ('profile', OLD.profile_last_success_at, NEW.profile_last_success_at),
        ('weapons', OLD.weapons_last_success_at, NEW.weapons_last_success_at),
        ('vehicles', OLD.vehicles_last_success_at, NEW.vehicles_last_success_at)
    ) AS m(resource, old_at, new_at)
    CROSS JOIN LATERAL (VALUES
        (public.bf4ps_freshness_slot(m.old_at), -1),
        (public.bf4ps_freshness_slot(m.new_at), 1)
    ) AS s(slot, pairs)
    WHERE public.bf4ps_freshness_slot(m.old_at)
          IS DISTINCT FROM public.bf4ps_freshness_slot(m.new_at);
    RETURN NULL;
END;
$$;


ALTER FUNCTION public.bf4ps_freshness_moved() OWNER TO bf4ps_definer;

--
-- Name: bf4ps_freshness_slot(timestamp with time zone); Type: FUNCTION; Schema: public; Owner: <migrator>
--

CREATE FUNCTION public.bf4ps_freshness_slot(t timestamp with time zone) RETURNS timestamp with time zone
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN CASE WHEN (t IS NULL) THEN '-infinity'::timestamp with time zone WHEN (NOT isfinite(t)) THEN t ELSE date_bin('00:05:00'::interval, t, '2000-01-01 00:00:00+00'::timestamp with time zone) END;


ALTER FUNCTION public.bf4ps_freshness_slot(t timestamp with time zone) OWNER TO <migrator>;

--
-- Name: bf4ps_freshness_stored_slot(timestamp with time zone, timestamp with time zone); Type: FUNCTION; Schema: public; Owner: <migrator>
--

CREATE FUNCTION public.bf4ps_freshness_stored_slot(slot timestamp with time zone, at timestamp with time zone) RETURNS timestamp with time zone
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
    SELECT CASE WHEN isfinite(slot) AND slot < at - interval '8 days'
                THEN date_bin('1 day', slot, '2000-01-01 00:00:00+00')
                ELSE slot END
$$;


ALTER FUNCTION public.bf4ps_freshness_stored_slot(slot timestamp with time zone, at timestamp with time zone) OWNER TO <migrator>;

--
-- Name: bf4ps_freshness_truncated(); Type: FUNCTION; Schema: public; Owner: bf4ps_definer
--

CREATE FUNCTION public.bf4ps_freshness_truncated() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
BEGIN
    DELETE FROM public.freshness_deltas;
    DELETE FROM public.freshness_rollup;
    DELETE FROM public.freshness_bands;
    RETURN NULL;
END;
$$;


ALTER FUNCTION public.bf4ps_freshness_truncated() OWNER TO bf4ps_definer;

--
-- Name: bf4ps_text_ok(text, integer); Type: FUNCTION; Schema: public; Owner: <migrator>
--

CREATE FUNCTION public.bf4ps_text_ok(t text, max_length integer) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN ((t IS NULL) OR ((length(t) <= max_length) AND (t !~ '[\x01-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]'::text)));


ALTER FUNCTION public.bf4ps_text_ok(t text, max_length integer) OWNER TO <migrator>;

--
-- Name: bf4ps_name_ok(text, integer); Type: FUNCTION; Schema: public; Owner: <migrator>
--

CREATE FUNCTION public.bf4ps_name_ok(t text, max_length integer) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN ((t IS NOT NULL) AND ((length(btrim(t)) >= 1) AND (length(btrim(t)) <= max_length)) AND public.bf4ps_text_ok(t, max_length));


ALTER FUNCTION public.bf4ps_name_ok(t text, max_length integer) OWNER TO <migrator>;

--
-- Name: bf4ps_notify_event(); Type: FUNCTION; Schema: public; Owner: <migrator>
--

CREATE FUNCTION public.bf4ps_notify_event() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
BEGIN
    PERFORM pg_notify('bf4ps_events', '');
    RETURN NULL;
END;
$$;


ALTER FUNCTION public.bf4ps_notify_event() OWNER TO <migrator>;

--
-- Name: bf4ps_notify_job_claimable(); Type: FUNCTION; Schema: public; Owner: <migrator>
--

CREATE FUNCTION public.bf4ps_notify_job_claimable() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
BEGIN
    PERFORM pg_notify('bf4ps_jobs_' || NEW.lane, '');
    RETURN NULL;
END;
$$;


ALTER FUNCTION public.bf4ps_notify_job_claimable() OWNER TO <migrator>;

--
-- Name: bf4ps_notify_jobs_claimable(); Type: FUNCTION; Schema: public; Owner: <migrator>
--

CREATE FUNCTION public.bf4ps_notify_jobs_claimable() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
DECLARE
    claimable_lane text;
BEGIN
    FOR claimable_lane IN
        SELECT DISTINCT n.lane FROM bf4ps_new_jobs n
        WHERE n.status = 'pending' AND n.eligible_at <= now()
    LOOP
        PERFORM pg_notify('bf4ps_jobs_' || claimable_lane, '');
    END LOOP;
    RETURN NULL;
END;
$$;


ALTER FUNCTION public.bf4ps_notify_jobs_claimable() OWNER TO <migrator>;

--
-- Name: bf4ps_projection_horizon(); Type: FUNCTION; Schema: public; Owner: <migrator>
--

CREATE FUNCTION public.bf4ps_projection_horizon() RETURNS xid8
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
BEGIN
    RETURN (
        SELECT coalesce(
            (SELECT min(x.xid)
             FROM pg_snapshot_xip(s.snap) AS x(xid)
             WHERE xid(x.xid) NOT IN (
                     SELECT a.backend_xid FROM pg_stat_get_activity(NULL) a
                     WHERE a.backend_xid IS NOT NULL
                       AND a.datid IS NOT NULL AND a.datid <> 0
                       AND (a.datid <> (SELECT d.oid FROM pg_database d
                                        WHERE d.datname = current_database())
                            OR (a.usesysid IS NOT NULL
                                AND NOT has_table_privilege(a.usesysid,
                                        'public.collection_events', 'INSERT')
                                AND NOT pg_has_role(a.usesysid, 'bf4ps_collector', 'MEMBER')
                                AND NOT pg_has_role(a.usesysid, 'bf4ps_website', 'MEMBER'))))
               AND xid(x.xid) NOT IN (
                     SELECT p.transaction FROM pg_prepared_xacts p
                     WHERE p.database <> current_database())),
            pg_snapshot_xmax(s.snap))
        FROM (SELECT pg_current_snapshot() AS snap) s);
END;
$$;


ALTER FUNCTION public.bf4ps_projection_horizon() OWNER TO <migrator>;

--
-- Name: bf4ps_record_outcome(bigint, text, text, boolean, timestamp with time zone, integer, text, text, timestamp with time zone); Type: FUNCTION; Schema: public; Owner: <migrator>
--

CREATE FUNCTION public.bf4ps_record_outcome(p_soldier_id bigint, p_resource text, p_state text, p_success boolean, p_next_due_at timestamp with time zone, p_failures integer, p_error_class text, p_error_message text, p_now timestamp with time zone) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
BEGIN
    PERFORM 1 FROM public.soldiers AS so WHERE so.soldier_id = p_soldier_id
    FOR NO KEY UPDATE;
    FOR attempt IN 1..2 LOOP
        UPDATE public.collection_state AS s SET
            detailed_state = CASE WHEN p_resource = 'detailed' THEN p_state ELSE s.detailed_state END,
            detailed_last_attempt_at = CASE WHEN p_resource = 'detailed' THEN p_now ELSE s.detailed_last_attempt_at END,
            detailed_last_success_at = CASE WHEN p_resource = 'detailed' AND p_success THEN p_now ELSE s.detailed_last_success_at END,
            detailed_next_due_at = CASE WHEN p_resource = 'detailed' THEN p_next_due_at ELSE s.detailed_next_due_at END,
            detailed_consecutive_failures = CASE WHEN p_resource = 'detailed' THEN p_failures ELSE s.detailed_consecutive_failures END,
            detailed_last_error_class = CASE WHEN p_resource = 'detailed' THEN p_error_class ELSE s.detailed_last_error_class END,
            detailed_last_error_message = CASE WHEN p_resource = 'detailed' THEN p_error_message ELSE s.detailed_last_error_message END,
            profile_state = CASE WHEN p_resource = 'profile' THEN p_state ELSE s.profile_state END,
            profile_last_attempt_at = CASE WHEN p_resource = 'profile' THEN p_now ELSE s.profile_last_attempt_at END,
            profile_last_success_at = CASE WHEN p_resource = 'profile' AND p_success THEN p_now ELSE s.profile_last_success_at END,
            profile_next_due_at = CASE WHEN p_resource = 'profile' THEN p_next_due_at ELSE s.profile_next_due_at END,
            profile_consecutive_failures = CASE WHEN p_resource = 'profile' THEN p_failures ELSE s.profile_consecutive_failures END,
            profile_last_error_class = CASE WHEN p_resource = 'profile' THEN p_error_class ELSE s.profile_last_error_class END,
            profile_last_error_message = CASE WHEN p_resource = 'profile' THEN p_error_message ELSE s.profile_last_error_message END,
            weapons_state = CASE WHEN p_resource = 'weapons' THEN p_state ELSE s.weapons_state END,
            weapons_last_attempt_at = CASE WHEN p_resource = 'weapons' THEN p_now ELSE s.weapons_last_attempt_at END,
            weapons_last_success_at = CASE WHEN p_resource = 'weapons' AND p_success THEN p_now ELSE s.weapons_last_success_at END,
            weapons_next_due_at = CASE WHEN p_resource = 'weapons' THEN p_next_due_at ELSE s.weapons_next_due_at END,
            weapons_consecutive_failures = CASE WHEN p_resource = 'weapons' THEN p_failures ELSE s.weapons_consecutive_failures END,
            weapons_last_error_class = CASE WHEN p_resource = 'weapons' THEN p_error_class ELSE s.weapons_last_error_class END,
            weapons_last_error_message = CASE WHEN p_resource = 'weapons' THEN p_error_message ELSE s.weapons_last_error_message END,
            vehicles_state = CASE WHEN p_resource = 'vehicles' THEN p_state ELSE s.vehicles_state END,
            vehicles_last_attempt_at = CASE WHEN p_resource = 'vehicles' THEN p_now ELSE s.vehicles_last_attempt_at END,
            vehicles_last_success_at = CASE WHEN p_resource = 'vehicles' AND p_success THEN p_now ELSE s.vehicles_last_success_at END,
            vehicles_next_due_at = CASE WHEN p_resource = 'vehicles' THEN p_next_due_at ELSE s.vehicles_next_due_at END,
            vehicles_consecutive_failures = CASE WHEN p_resource = 'vehicles' THEN p_failures ELSE s.vehicles_consecutive_failures END,
            vehicles_last_error_class = CASE WHEN p_resource = 'vehicles' THEN p_error_class ELSE s.vehicles_last_error_class END,
            vehicles_last_error_message = CASE WHEN p_resource = 'vehicles' THEN p_error_message ELSE s.vehicles_last_error_message END,
            updated_at = p_now
        WHERE s.soldier_id = p_soldier_id;
        EXIT WHEN FOUND;
        INSERT INTO public.collection_state (soldier_id) VALUES (p_soldier_id)
        ON CONFLICT (soldier_id) DO NOTHING;
    END LOOP;
END;
$$;


ALTER FUNCTION public.bf4ps_record_outcome(p_soldier_id bigint, p_resource text, p_state text, p_success boolean, p_next_due_at timestamp with time zone, p_failures integer, p_error_class text, p_error_message text, p_now timestamp with time zone) OWNER TO <migrator>;

--
-- Name: bf4ps_request_refresh(text, bigint, text[], interval, double precision, text); Type: FUNCTION; Schema: public; Owner: bf4ps_definer
--

CREATE FUNCTION public.bf4ps_request_refresh(platform text, persona_id bigint, resources text[] DEFAULT ARRAY['detailed'::text, 'profile'::text, 'weapons'::text, 'vehicles'::text], eta_window interval DEFAULT NULL::interval, egress_rate double precision DEFAULT NULL::double precision, soldier_name text DEFAULT NULL::text) RETURNS TABLE(resource text, job_id bigint, state text, "position" bigint, eta_seconds double precision, last_success_at timestamp with time zone)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
#variable_conflict use_column
DECLARE
    all_resources constant text[] := ARRAY['detailed', 'profile', 'weapons', 'vehicles'];
    v_platform text := bf4ps_request_refresh.platform;
    v_persona bigint := bf4ps_request_refresh.persona_id;
    v_name text := btrim(bf4ps_request_refresh.soldier_name);
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
    v_etas double precision[];
    v_lock_timeout text;
    v_cooldown interval;
    v_last timestamptz;
    v_lasts timestamptz[] := ARRAY[]::timestamptz[];
    i integer;
BEGIN
    IF v_platform IS NULL OR NOT (v_platform = ANY (ARRAY['pc', 'ps4', 'xboxone'])) THEN
        RAISE EXCEPTION 'unknown platform % (expected one of: pc, ps4, xboxone)',
                coalesce('"' || left(v_platform, 40) || '"', 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_persona IS NULL OR v_persona <= 0 THEN
        RAISE EXCEPTION 'persona_id must be a positive integer (got %)',
                coalesce(v_persona::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF bf4ps_request_refresh.soldier_name IS NOT NULL
       AND NOT public.bf4ps_name_ok(bf4ps_request_refresh.soldier_name, 200) THEN
        RAISE EXCEPTION 'soldier_name must be 1-200 characters without control characters'
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
                coalesce('"' || left(v_bad, 40) || '"', 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT array_agg(r ORDER BY array_position(all_resources, r)) INTO v_wanted
    FROM (SELECT DISTINCT r FROM unnest(bf4ps_request_refresh.resources) AS r) AS d;

    SELECT coalesce(bf4ps_request_refresh.eta_window, s.eta_window),
           coalesce(bf4ps_request_refresh.egress_rate, s.egress_rate),
           s.max_pending_interactive, s.interactive_cooldown
      INTO v_window, v_rate, v_cap, v_cooldown
    FROM public.scheduling_settings AS s;
    v_window := coalesce(v_window, interval '15 minutes');
    v_rate := coalesce(v_rate, 0.2);
    v_cap := coalesce(v_cap, 1000);
    IF v_window <= interval '0' OR NOT isfinite(v_window) THEN
        RAISE EXCEPTION 'eta_window must be positive and finite (got %)', v_window
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT (v_rate > 0 AND v_rate < 'Infinity'::double precision) THEN
        RAISE EXCEPTION 'egress_rate must be a finite number > 0 (got %)', v_rate
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- The soldier, as BF4PS writes a manual submission.
    SELECT s.soldier_id INTO v_soldier
    FROM public.soldiers AS s
    WHERE s.persona_id = v_persona AND s.platform = v_platform;
    IF v_soldier IS NULL AND v_name IS NULL THEN
        RAISE EXCEPTION 'soldier %/% is not known yet: pass its name (soldier_name)',
                v_platform, v_persona
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_soldier IS NULL THEN
        INSERT INTO public.soldiers AS s
            (persona_id, platform, current_name, first_seen_at, last_seen_at)
        VALUES (v_persona, v_platform, v_name, now(), now())
        ON CONFLICT (persona_id, platform) DO UPDATE
        -- Created concurrently: known now, so not renamed.
        SET first_seen_at = least(s.first_seen_at, EXCLUDED.first_seen_at),
            last_seen_at = greatest(s.last_seen_at, EXCLUDED.last_seen_at),
            updated_at = now()
        RETURNING s.soldier_id INTO v_soldier;
        INSERT INTO public.soldier_names AS n (soldier_id, name, first_seen_at, last_seen_at)
        VALUES (v_soldier, v_name, now(), now())
        ON CONFLICT (soldier_id, name) DO UPDATE
        SET first_seen_at = least(n.first_seen_at, EXCLUDED.first_seen_at),
            last_seen_at = greatest(n.last_seen_at, EXCLUDED.last_seen_at);
    ELSE
        UPDATE public.soldiers AS s
        SET last_seen_at = greatest(s.last_seen_at, now()), updated_at = now()
        WHERE s.soldier_id = v_soldier;
    END IF;
    INSERT INTO public.soldier_sources AS o (soldier_id, source_type, first_seen_at, last_seen_at)
    VALUES (v_soldier, 'manual', now(), now())
    ON CONFLICT (soldier_id, source_type) DO UPDATE
    SET first_seen_at = least(o.first_seen_at, EXCLUDED.first_seen_at),
        last_seen_at = greatest(o.last_seen_at, EXCLUDED.last_seen_at);
    INSERT INTO public.collection_state (soldier_id) VALUES (v_soldier)
    ON CONFLICT (soldier_id) DO NOTHING;

    -- One job per resource. A job can be finalized (deleted) or fed between
    -- our statements; each pass re-reads and settles within a few tries.
    FOREACH v_resource IN ARRAY v_wanted LOOP
        v_settled := false;
        SELECT public.bf4ps_sane_time(CASE v_resource
                   WHEN 'detailed' THEN cs.detailed_last_success_at
                   WHEN 'profile' THEN cs.profile_last_success_at
                   WHEN 'weapons' THEN cs.weapons_last_success_at
                   WHEN 'vehicles' THEN cs.vehicles_last_success_at END)
          INTO v_last
        FROM public.collection_state AS cs WHERE cs.soldier_id = v_soldier;
        FOR attempt IN 1..5 LOOP
            SELECT j.job_id, j.status, j.lane, j.priority_class, j.attempt_count
              INTO v_job, v_status, v_lane, v_class, v_attempts
            FROM public.collection_jobs AS j
            WHERE j.soldier_id = v_soldier AND j.resource = v_resource;

            IF NOT FOUND AND v_last > now() - v_cooldown THEN
                -- Fetched moments ago: answered as fresh, nothing spent.
                v_job := NULL;
                v_state := 'fresh';
                v_settled := true;
            ELSIF NOT FOUND THEN
                INSERT INTO public.collection_jobs AS j
                    (soldier_id, resource, lane, priority_class, reason, priority_value)
                VALUES (v_soldier, v_resource, 'interactive', 'interactive', 'requested', 0)
                ON CONFLICT (soldier_id, resource) DO NOTHING
                RETURNING j.job_id, j.attempt_count INTO v_job, v_attempts;
                IF v_job IS NOT NULL THEN
                    INSERT INTO public.collection_events
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
                UPDATE public.collection_jobs AS j
                SET lane = 'interactive',
                    priority_class = 'interactive',
                    reason = 'requested',
                    priority_value = 0,
                    eligible_at = now(),
                    updated_at = now()
                WHERE j.job_id = v_job AND j.status = 'pending' AND j.lane = 'background'
                RETURNING j.attempt_count INTO v_attempts;
                IF FOUND THEN
                    INSERT INTO public.collection_events
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
        v_lasts := v_lasts || v_last;
    END LOOP;

    -- Admission: every call that added pending interactive jobs counts them
    -- under one row lock held until its caller commits, so concurrent
    -- callers see each other's admissions and the cap is exact.
    IF v_admitted > 0 THEN
        v_lock_timeout := current_setting('lock_timeout');
        PERFORM set_config('lock_timeout', '2s', true);
        PERFORM 1 FROM public.bf4ps_locks AS l
        WHERE l.lock_name = 'interactive_admission' FOR UPDATE;
        PERFORM set_config('lock_timeout', v_lock_timeout, true);
        SELECT count(*) INTO v_pending
        FROM (SELECT 1 FROM public.collection_jobs AS j
              WHERE j.lane = 'interactive' AND j.status = 'pending'
              LIMIT v_cap::bigint + 1) AS p;
        IF v_pending > v_cap THEN
            RAISE EXCEPTION 'too many pending interactive refreshes: the limit is % (scheduling_settings.max_pending_interactive); nothing was queued',
                    v_cap
                USING ERRCODE = 'configuration_limit_exceeded',
                      HINT = 'retry after a while; operators raise the limit with BF4PS_MAX_PENDING_INTERACTIVE';
        END IF;
    END IF;

    -- The ETAs: the interactive lane's schedule, simulated once per call.
    SELECT array_agg(x.eta_seconds ORDER BY x.n) INTO v_etas
    FROM public.bf4ps_eta_schedule(v_jobs, v_window, v_rate)
         WITH ORDINALITY AS x(job_id, eta_seconds, n);

    FOR i IN 1 .. cardinality(v_wanted) LOOP
        resource := v_wanted[i];
        job_id := v_jobs[i];
        state := v_states[i];
        last_success_at := v_lasts[i];
        IF state = 'fresh' THEN
            "position" := NULL;
            eta_seconds := NULL;
        ELSIF state IN ('claimed', 'running') THEN
            "position" := 0;
            eta_seconds := v_etas[i];
        ELSE
            SELECT count(*) INTO "position"
            FROM public.collection_jobs AS me, public.collection_jobs AS o
            WHERE me.job_id = v_jobs[i]
              AND o.lane = 'interactive'
              AND o.status = 'pending'
              AND (CASE o.priority_class WHEN 'interactive' THEN 1 WHEN 'active' THEN 2
                                         WHEN 'recent' THEN 3 WHEN 'bootstrap' THEN 4 END,
                   -o.priority_value::bigint, o.eligible_at, o.created_at, o.job_id)
                  <= (CASE me.priority_class WHEN 'interactive' THEN 1 WHEN 'active' THEN 2
                                             WHEN 'recent' THEN 3 WHEN 'bootstrap' THEN 4 END,
                      -me.priority_value::bigint, me.eligible_at, me.created_at, me.job_id);
            eta_seconds := v_etas[i];
        END IF;
        RETURN NEXT;
    END LOOP;
END;
$$;


ALTER FUNCTION public.bf4ps_request_refresh(platform text, persona_id bigint, resources text[], eta_window interval, egress_rate double precision, soldier_name text) OWNER TO bf4ps_definer;

--
-- Name: bf4ps_round_half_even(numeric, integer); Type: FUNCTION; Schema: public; Owner: <migrator>
--

CREATE FUNCTION public.bf4ps_round_half_even(x numeric, scale integer) RETURNS numeric
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
DECLARE
    f numeric := power(10::numeric, scale);
    y numeric := x * f;
BEGIN
    IF abs(y - trunc(y)) = 0.5 THEN
        RETURN round((trunc(y) + CASE WHEN mod(trunc(y), 2) = 0 THEN 0 ELSE sign(x) END) / f,
                     scale);
    END IF;
    RETURN round(x, scale);
END;
$$;


ALTER FUNCTION public.bf4ps_round_half_even(x numeric, scale integer) OWNER TO <migrator>;

--
-- Name: bf4ps_sane_time(timestamp with time zone); Type: FUNCTION; Schema: public; Owner: <migrator>
--

CREATE FUNCTION public.bf4ps_sane_time(t timestamp with time zone) RETURNS timestamp with time zone
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN CASE WHEN (t IS NOT NULL) THEN LEAST(GREATEST(t, '1970-01-01 00:00:00+00'::timestamp with time zone), '9999-12-31 00:00:00+00'::timestamp with time zone) ELSE NULL::timestamp with time zone END;


ALTER FUNCTION public.bf4ps_sane_time(t timestamp with time zone) OWNER TO <migrator>;

--
-- Name: bf4ps_store_detailed(bigint, bigint, jsonb, timestamp with time zone); Type: FUNCTION; Schema: public; Owner: <migrator>
--

CREATE FUNCTION public.bf4ps_store_detailed(p_soldier_id bigint, p_persona_id bigint, p_data jsonb, p_now timestamp with time zone, OUT changed boolean, OUT history_appended boolean) RETURNS record
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    v detailed_stats_current;
BEGIN
    history_appended := false;
    -- A detailed document: BF4PS's columns (and the persona it is for,
    -- which must be the job's), at least one of them.
    IF NOT ARRAY(SELECT jsonb_object_keys(p_data)) <@ (
           SELECT array_agg(a.attname::text) || 'persona_id'::text
           FROM pg_catalog.pg_attribute AS a
           WHERE a.attrelid = 'public.detailed_stats_current'::regclass
             AND a.attnum > 0 AND NOT a.attisdropped
             AND a.attname NOT IN ('soldier_id', 'source_fetched_at', 'updated_at'))
       OR NOT EXISTS (SELECT 1 FROM jsonb_object_keys(p_data) AS k(key)
                      WHERE k.key <> 'persona_id')
       OR (p_data ? 'persona_id'
           AND (p_data->'persona_id') IS DISTINCT FROM to_jsonb(p_persona_id)) THEN
        RAISE EXCEPTION 'detailed data must hold detailed_stats_current columns only (and the job''s persona_id)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v := jsonb_populate_record(NULL::detailed_stats_current,
             p_data - 'soldier_id' - 'source_fetched_at' - 'updated_at');
    IF EXISTS (SELECT 1 FROM jsonb_each(to_jsonb(v)) AS e
               WHERE jsonb_typeof(e.value) = 'number' AND (e.value)::text::numeric < 0) THEN
        RAISE EXCEPTION 'detailed counters must not be negative'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v.soldier_id := p_soldier_id;
    v.quit_percentage := public.bf4ps_round_half_even((p_data->>'quit_percentage')::numeric, 6);
    v.longest_headshot := public.bf4ps_round_half_even((p_data->>'longest_headshot')::numeric, 4);
    IF v.quit_percentage = 'NaN'::numeric OR v.longest_headshot = 'NaN'::numeric THEN
        RAISE EXCEPTION 'quit_percentage and longest_headshot must be numbers'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v.source_fetched_at := p_now;
    v.updated_at := p_now;
    -- History only when a retained (quantized) value differs from the
    -- latest snapshot.
    SELECT (to_jsonb(h) - 'snapshot_id' - 'soldier_id' - 'observed_at')
           IS DISTINCT FROM (to_jsonb(v) - 'soldier_id' - 'source_fetched_at' - 'updated_at')
      INTO changed
    FROM public.detailed_stats_history AS h
    WHERE h.soldier_id = p_soldier_id
    ORDER BY h.observed_at DESC, h.snapshot_id DESC
    LIMIT 1;
    changed := coalesce(changed, true);
    IF changed THEN
        INSERT INTO public.detailed_stats_history (soldier_id,
            rank, time_played_seconds, assault_score, engineer_score, support_score,
            recon_score, commander_score, squad_score, vehicle_score, award_score,
            unlock_score, total_score, combat_score, conquest_score, rush_score,
            team_deathmatch_score, domination_score, obliteration_score, defuse_score,
            capture_the_flag_score, air_superiority_score, carrier_assault_score,
            chain_link_score, kills, deaths, kill_assists, wins, losses, shots_fired,
            shots_hit, repairs, revives, heals, resupplies, avenger_kills, savior_kills,
            suppression_assists, quit_percentage, flags_captured, flags_defended,
            dogtags_taken, vehicles_destroyed, vehicle_damage, headshots,
            longest_headshot, highest_kill_streak, nemesis_kills, highest_nemesis_streak,
            observed_at)
        VALUES (v.soldier_id,
            v.rank, v.time_played_seconds, v.assault_score, v.engineer_score,
            v.support_score, v.recon_score, v.commander_score, v.squad_score,
            v.vehicle_score, v.award_score, v.unlock_score, v.total_score,
            v.combat_score, v.conquest_score, v.rush_score, v.team_deathmatch_score,
            v.domination_score, v.obliteration_score, v.defuse_score,
            v.capture_the_flag_score, v.air_superiority_score, v.carrier_assault_score,
            v.chain_link_score, v.kills, v.deaths, v.kill_assists, v.wins, v.losses,
            v.shots_fired, v.shots_hit, v.repairs, v.revives, v.heals, v.resupplies,
            v.avenger_kills, v.savior_kills, v.suppression_assists, v.quit_percentage,
            v.flags_captured, v.flags_defended, v.dogtags_taken, v.vehicles_destroyed,
            v.vehicle_damage, v.headshots, v.longest_headshot, v.highest_kill_streak,
            v.nemesis_kills, v.highest_nemesis_streak,
            p_now);
        history_appended := true;
    END IF;
    INSERT INTO public.detailed_stats_current AS d
    SELECT v.*
    ON CONFLICT (soldier_id) DO UPDATE SET
            rank = EXCLUDED.rank, time_played_seconds = EXCLUDED.time_played_seconds,
            assault_score = EXCLUDED.assault_score,
            engineer_score = EXCLUDED.engineer_score,
            support_score = EXCLUDED.support_score, recon_score = EXCLUDED.recon_score,
            commander_score = EXCLUDED.commander_score,
            squad_score = EXCLUDED.squad_score, vehicle_score = EXCLUDED.vehicle_score,
            award_score = EXCLUDED.award_score, unlock_score = EXCLUDED.unlock_score,
            total_score = EXCLUDED.total_score, combat_score = EXCLUDED.combat_score,
            conquest_score = EXCLUDED.conquest_score, rush_score = EXCLUDED.rush_score,
            team_deathmatch_score = EXCLUDED.team_deathmatch_score,
            domination_score = EXCLUDED.domination_score,
            obliteration_score = EXCLUDED.obliteration_score,
            defuse_score = EXCLUDED.defuse_score,
            capture_the_flag_score = EXCLUDED.capture_the_flag_score,
            air_superiority_score = EXCLUDED.air_superiority_score,
            carrier_assault_score = EXCLUDED.carrier_assault_score,
            chain_link_score = EXCLUDED.chain_link_score, kills = EXCLUDED.kills,
            deaths = EXCLUDED.deaths, kill_assists = EXCLUDED.kill_assists,
            wins = EXCLUDED.wins, losses = EXCLUDED.losses,
            shots_fired = EXCLUDED.shots_fired, shots_hit = EXCLUDED.shots_hit,
            repairs = EXCLUDED.repairs, revives = EXCLUDED.revives,
            heals = EXCLUDED.heals, resupplies = EXCLUDED.resupplies,
            avenger_kills = EXCLUDED.avenger_kills,
            savior_kills = EXCLUDED.savior_kills,
            suppression_assists = EXCLUDED.suppression_assists,
            quit_percentage = EXCLUDED.quit_percentage,
            flags_captured = EXCLUDED.flags_captured,
            flags_defended = EXCLUDED.flags_defended,
            dogtags_taken = EXCLUDED.dogtags_taken,
            vehicles_destroyed = EXCLUDED.vehicles_destroyed,
            vehicle_damage = EXCLUDED.vehicle_damage, headshots = EXCLUDED.headshots,
            longest_headshot = EXCLUDED.longest_headshot,
            highest_kill_streak = EXCLUDED.highest_kill_streak,
            nemesis_kills = EXCLUDED.nemesis_kills,
            highest_nemesis_streak = EXCLUDED.highest_nemesis_streak,
            source_fetched_at = EXCLUDED.source_fetched_at, updated_at = p_now;
END;
$$;


ALTER FUNCTION public.bf4ps_store_detailed(p_soldier_id bigint, p_persona_id bigint, p_data jsonb, p_now timestamp with time zone, OUT changed boolean, OUT history_appended boolean) OWNER TO <migrator>;

--
-- Name: bf4ps_store_profile(bigint, text, jsonb, timestamp with time zone); Type: FUNCTION; Schema: public; Owner: <migrator>
--

CREATE FUNCTION public.bf4ps_store_profile(p_soldier_id bigint, p_current_name text, p_data jsonb, p_now timestamp with time zone, OUT changed boolean) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $_$
#variable_conflict use_column
DECLARE
    v_profile bigint;
BEGIN
    -- The account is the soldier's: its user page was fetched by the
    -- soldier's current name (a lease never writes another account).
    IF lower(btrim(p_data->>'battlelog_username')) IS DISTINCT FROM lower(btrim(p_current_name)) THEN
        RAISE EXCEPTION 'a profile is the account of the job''s soldier (battlelog_username = its current name)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT public.bf4ps_name_ok(p_data->>'battlelog_username', 200)
       OR (p_data->>'access_state') IS NULL
       OR (p_data->>'access_state') NOT IN ('public_country', 'public_no_country',
                                            'friends_only', 'not_found')
       OR (p_data->>'country_code') !~ '^[A-Z]{2}$'
       OR length(p_data->>'country_name') > 200 THEN
        RAISE EXCEPTION 'a profile has a username (1-200 characters), an access_state of public_country, public_no_country, friends_only or not_found, and an upper-case two-letter country_code if any'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT (b.country_code, b.country_name, b.access_state)
           IS DISTINCT FROM (p_data->>'country_code', p_data->>'country_name',
                             p_data->>'access_state')
      INTO changed
    FROM public.battlelog_profiles AS b
    WHERE lower(b.battlelog_username) = lower(btrim(p_data->>'battlelog_username'));
    changed := coalesce(changed, true);
    INSERT INTO public.battlelog_profiles AS b
        (battlelog_username, battlelog_user_id, country_code, country_name, access_state,
         last_checked_at, last_success_at, last_error)
    VALUES (btrim(p_data->>'battlelog_username'), (p_data->>'battlelog_user_id')::bigint,
            p_data->>'country_code', p_data->>'country_name', p_data->>'access_state',
            p_now, p_now, NULL)
    ON CONFLICT ((lower(battlelog_username))) DO UPDATE
    SET battlelog_user_id = coalesce(EXCLUDED.battlelog_user_id, b.battlelog_user_id),
        country_code = EXCLUDED.country_code, country_name = EXCLUDED.country_name,
        access_state = EXCLUDED.access_state, last_checked_at = p_now,
        last_success_at = p_now, last_error = NULL, updated_at = p_now
    RETURNING b.profile_id INTO v_profile;
    INSERT INTO public.profile_soldiers AS ps (profile_id, soldier_id, first_seen_at, last_seen_at)
    VALUES (v_profile, p_soldier_id, p_now, p_now)
    ON CONFLICT (profile_id, soldier_id) DO UPDATE SET last_seen_at = p_now;
END;
$_$;


ALTER FUNCTION public.bf4ps_store_profile(p_soldier_id bigint, p_current_name text, p_data jsonb, p_now timestamp with time zone, OUT changed boolean) OWNER TO <migrator>;

--
-- Name: bf4ps_store_vehicles(bigint, jsonb, timestamp with time zone); Type: FUNCTION; Schema: public; Owner: <migrator>
--

CREATE FUNCTION public.bf4ps_store_vehicles(p_soldier_id bigint, p_data jsonb, p_now timestamp with time zone, OUT changed boolean) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    v_fresh jsonb;
BEGIN
    IF jsonb_typeof(p_data->'vehicles') IS DISTINCT FROM 'array'
       OR jsonb_array_length(p_data->'vehicles') > 5000 THEN
        RAISE EXCEPTION 'vehicles must be an array of at most 5000 entries'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_to_recordset(p_data->'vehicles') AS e(
                   guid text, name text, slug text, category text, kills bigint,
                   time_in_seconds bigint, destroy_x_in_y bigint)
               WHERE NOT public.bf4ps_name_ok(e.guid, 200)
                  OR (e.name IS NOT NULL AND length(e.name) > 500)
                  OR (e.slug IS NOT NULL AND length(e.slug) > 500)
                  OR (e.category IS NOT NULL AND length(e.category) > 500)
                  OR e.kills < 0 OR e.time_in_seconds < 0 OR e.destroy_x_in_y < 0)
       OR (SELECT count(*) <> count(DISTINCT e->>'guid')
           FROM jsonb_array_elements(p_data->'vehicles') AS e) THEN
        RAISE EXCEPTION 'a vehicle has no guid, a guid twice, an overlong text or a negative counter'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM 1 FROM public.bf4ps_locks WHERE lock_name = 'vehicle_catalog' FOR UPDATE;
    WITH e AS (
        SELECT x.* FROM jsonb_to_recordset(p_data->'vehicles') AS x(
            guid text, name text, slug text, category text, kills bigint,
            time_in_seconds bigint, destroy_x_in_y bigint)
    ), cat AS (
        INSERT INTO public.vehicle_catalog AS k
            (vehicle_guid, name, slug, category, first_seen_at, last_seen_at)
        SELECT e.guid, coalesce(nullif(btrim(e.name), ''), nullif(btrim(e.slug), ''), e.guid),
               e.slug, e.category, p_now, p_now
        FROM e ORDER BY e.guid
        ON CONFLICT (vehicle_guid) DO UPDATE
        SET name = EXCLUDED.name, slug = EXCLUDED.slug, category = EXCLUDED.category,
            last_seen_at = greatest(k.last_seen_at, EXCLUDED.last_seen_at)
        RETURNING k.vehicle_id, k.vehicle_guid
    )
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'vehicle_id', cat.vehicle_id, 'kills', coalesce(e.kills, 0),
               'time_in_seconds', coalesce(e.time_in_seconds, 0),
               'destroy_x_in_y', e.destroy_x_in_y)), '[]')
      INTO v_fresh
    FROM e JOIN cat ON cat.vehicle_guid = e.guid;
    WITH old AS (
        DELETE FROM public.soldier_vehicle_stats AS w WHERE w.soldier_id = p_soldier_id
        RETURNING w.vehicle_id, w.kills, w.time_in_seconds, w.destroy_x_in_y
    ), fresh AS (
        SELECT f.* FROM jsonb_to_recordset(v_fresh) AS f(
            vehicle_id bigint, kills bigint, time_in_seconds bigint, destroy_x_in_y bigint)
    )
    SELECT EXISTS ((SELECT * FROM old EXCEPT SELECT * FROM fresh)
                   UNION ALL (SELECT * FROM fresh EXCEPT SELECT * FROM old))
      INTO changed;
    INSERT INTO public.soldier_vehicle_stats
        (soldier_id, vehicle_id, kills, time_in_seconds, destroy_x_in_y,
         source_fetched_at, updated_at)
    SELECT p_soldier_id, f.vehicle_id, f.kills, f.time_in_seconds, f.destroy_x_in_y,
           p_now, p_now
    FROM jsonb_to_recordset(v_fresh) AS f(
        vehicle_id bigint, kills bigint, time_in_seconds bigint, destroy_x_in_y bigint);
END;
$$;


ALTER FUNCTION public.bf4ps_store_vehicles(p_soldier_id bigint, p_data jsonb, p_now timestamp with time zone, OUT changed boolean) OWNER TO <migrator>;

--
-- Name: bf4ps_store_weapons(bigint, jsonb, timestamp with time zone); Type: FUNCTION; Schema: public; Owner: <migrator>
--

CREATE FUNCTION public.bf4ps_store_weapons(p_soldier_id bigint, p_data jsonb, p_now timestamp with time zone, OUT changed boolean) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    v_fresh jsonb;
BEGIN
    IF jsonb_typeof(p_data->'weapons') IS DISTINCT FROM 'array'
       OR jsonb_array_length(p_data->'weapons') > 5000 THEN
        RAISE EXCEPTION 'weapons must be an array of at most 5000 entries'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_to_recordset(p_data->'weapons') AS e(
                   guid text, name text, slug text, category text, kills bigint,
                   headshots bigint, shots_fired bigint, shots_hit bigint,
                   time_equipped_seconds bigint)
               WHERE NOT public.bf4ps_name_ok(e.guid, 200)
                  OR (e.name IS NOT NULL AND length(e.name) > 500)
                  OR (e.slug IS NOT NULL AND length(e.slug) > 500)
                  OR (e.category IS NOT NULL AND length(e.category) > 500)
                  OR e.kills < 0 OR e.headshots < 0 OR e.shots_fired < 0
                  OR e.shots_hit < 0 OR e.time_equipped_seconds < 0)
       OR (SELECT count(*) <> count(DISTINCT e->>'guid')
           FROM jsonb_array_elements(p_data->'weapons') AS e) THEN
        RAISE EXCEPTION 'a weapon has no guid, a guid twice, an overlong text or a negative counter'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- One catalog writer at a time, guids in order.
    PERFORM 1 FROM public.bf4ps_locks WHERE lock_name = 'weapon_catalog' FOR UPDATE;
    WITH e AS (
        SELECT x.* FROM jsonb_to_recordset(p_data->'weapons') AS x(
            guid text, name text, slug text, category text, kills bigint,
            headshots bigint, shots_fired bigint, shots_hit bigint,
            time_equipped_seconds bigint)
    ), cat AS (
        INSERT INTO public.weapon_catalog AS k
            (weapon_guid, name, slug, category, first_seen_at, last_seen_at)
        SELECT e.guid, coalesce(nullif(btrim(e.name), ''), nullif(btrim(e.slug), ''), e.guid),
               e.slug, e.category, p_now, p_now
        FROM e ORDER BY e.guid
        ON CONFLICT (weapon_guid) DO UPDATE
        SET name = EXCLUDED.name, slug = EXCLUDED.slug, category = EXCLUDED.category,
            last_seen_at = greatest(k.last_seen_at, EXCLUDED.last_seen_at)
        RETURNING k.weapon_id, k.weapon_guid
    )
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'weapon_id', cat.weapon_id, 'kills', coalesce(e.kills, 0),
               'headshots', coalesce(e.headshots, 0),
               'shots_fired', coalesce(e.shots_fired, 0),
               'shots_hit', coalesce(e.shots_hit, 0),
               'time_equipped_seconds', coalesce(e.time_equipped_seconds, 0))), '[]')
      INTO v_fresh
    FROM e JOIN cat ON cat.weapon_guid = e.guid;
    -- The soldier's set, replaced as a whole (the old rows first, then
    -- the new: one key is never deleted and inserted by one statement).
    WITH old AS (
        DELETE FROM public.soldier_weapon_stats AS w WHERE w.soldier_id = p_soldier_id
        RETURNING w.weapon_id, w.kills, w.headshots, w.shots_fired, w.shots_hit,
                  w.time_equipped_seconds
    ), fresh AS (
        SELECT f.* FROM jsonb_to_recordset(v_fresh) AS f(
            weapon_id bigint, kills bigint, headshots bigint, shots_fired bigint,
            shots_hit bigint, time_equipped_seconds bigint)
    )
    SELECT EXISTS ((SELECT * FROM old EXCEPT SELECT * FROM fresh)
                   UNION ALL (SELECT * FROM fresh EXCEPT SELECT * FROM old))
      INTO changed;
    INSERT INTO public.soldier_weapon_stats
        (soldier_id, weapon_id, kills, headshots, shots_fired, shots_hit,
         time_equipped_seconds, source_fetched_at, updated_at)
    SELECT p_soldier_id, f.weapon_id, f.kills, f.headshots, f.shots_fired, f.shots_hit,
           f.time_equipped_seconds, p_now, p_now
    FROM jsonb_to_recordset(v_fresh) AS f(
        weapon_id bigint, kills bigint, headshots bigint, shots_fired bigint,
        shots_hit bigint, time_equipped_seconds bigint);
END;
$$;


ALTER FUNCTION public.bf4ps_store_weapons(p_soldier_id bigint, p_data jsonb, p_now timestamp with time zone, OUT changed boolean) OWNER TO <migrator>;

--
-- Name: bf4ps_succeed_job(uuid, bigint, uuid, jsonb, bigint, integer, timestamp with time zone); Type: FUNCTION; Schema: public; Owner: <migrator>
--

CREATE FUNCTION public.bf4ps_succeed_job(p_uuid uuid, p_job_id bigint, p_lease_token uuid, p_data jsonb, p_duration_ms bigint, p_http_status integer, p_now timestamp with time zone) RETURNS TABLE(changed boolean, history_appended boolean, previous_success_at timestamp with time zone, next_due_at timestamp with time zone)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    j record;
    v_changed boolean;
    v_hist boolean := false;
    v_prev timestamptz;
    v_next timestamptz;
    v_state text := 'success';
    v_cadence interval;
BEGIN
    IF p_duration_ms IS NULL OR p_duration_ms < 0 OR p_duration_ms > 86400000 THEN
        RAISE EXCEPTION 'duration_ms must be 0-86400000 (got %)', coalesce(p_duration_ms::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_http_status IS NULL OR NOT (p_http_status BETWEEN 200 AND 299
                                      OR (p_http_status = 404
                                          AND coalesce(p_data->>'access_state' = 'not_found',
                                                       false))) THEN
        RAISE EXCEPTION 'a success has a 2xx http_status, or 404 for a profile not found (got %)',
                coalesce(p_http_status::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_data IS NULL OR jsonb_typeof(p_data) <> 'object' THEN
        RAISE EXCEPTION 'data must be a JSON object'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    SELECT x.job_id, x.soldier_id, so.persona_id, so.platform, so.current_name, x.resource,
           x.lane, x.attempt_count, c.collector_name, c.hostname, c.egress_key
      INTO j
    FROM public.collection_jobs AS x
    JOIN public.soldiers AS so ON so.soldier_id = x.soldier_id
    JOIN public.collectors AS c ON c.collector_uuid = x.collector_uuid
    WHERE x.job_id = p_job_id AND x.collector_uuid = p_uuid AND x.lease_token = p_lease_token
      AND x.status = 'running' AND x.lease_expires_at > p_now
    FOR UPDATE OF x;
    IF NOT FOUND THEN
        RETURN;
    END IF;

    IF p_http_status = 404 AND j.resource <> 'profile' THEN
        RAISE EXCEPTION 'only a profile job succeeds with 404 (an account Battlelog does not know)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    CASE j.resource
        WHEN 'detailed' THEN
            SELECT x.changed, x.history_appended INTO v_changed, v_hist
            FROM public.bf4ps_store_detailed(j.soldier_id, j.persona_id, p_data, p_now) AS x;
        WHEN 'weapons' THEN
            v_changed := public.bf4ps_store_weapons(j.soldier_id, p_data, p_now);
        WHEN 'vehicles' THEN
            v_changed := public.bf4ps_store_vehicles(j.soldier_id, p_data, p_now);
        ELSE
            v_changed := public.bf4ps_store_profile(j.soldier_id, j.current_name, p_data, p_now);
    END CASE;

    SELECT CASE j.resource WHEN 'detailed' THEN s.refresh_detailed
                           WHEN 'profile' THEN s.refresh_profile
                           WHEN 'weapons' THEN s.refresh_weapons
                           ELSE s.refresh_vehicles END
      INTO v_cadence
    FROM public.scheduling_settings AS s;
    SELECT CASE j.resource WHEN 'detailed' THEN st.detailed_last_success_at
                           WHEN 'profile' THEN st.profile_last_success_at
                           WHEN 'weapons' THEN st.weapons_last_success_at
                           ELSE st.vehicles_last_success_at END
      INTO v_prev
    FROM public.collection_state AS st WHERE st.soldier_id = j.soldier_id;
    v_next := CASE WHEN v_state = 'success' THEN p_now + v_cadence END;
    PERFORM public.bf4ps_record_outcome(j.soldier_id, j.resource, v_state, true, v_next, 0,
                                          NULL, NULL, p_now);

    INSERT INTO public.collection_events
        (occurred_at, collector_uuid, collector_name_snapshot, hostname_snapshot,
         egress_key_snapshot, job_id, soldier_id, persona_id, platform, resource, lane,
         event_type, attempt_number, lease_token, result, duration_ms, http_status, metadata)
    VALUES (p_now, p_uuid, j.collector_name, j.hostname, j.egress_key, j.job_id, j.soldier_id,
            j.persona_id, j.platform, j.resource, j.lane, 'succeeded', j.attempt_count,
            p_lease_token, CASE WHEN v_changed THEN 'changed' ELSE 'unchanged' END,
            p_duration_ms, p_http_status,
            jsonb_build_object('previous_success_at', public.bf4ps_sane_time(v_prev),
                               'changed', v_changed, 'history_appended', v_hist));
    UPDATE public.collectors AS c SET current_job_id = NULL, updated_at = p_now
    WHERE c.collector_uuid = p_uuid AND c.current_job_id = p_job_id;
    DELETE FROM public.collection_jobs AS x WHERE x.job_id = p_job_id;
    -- Battlelog answered on this key: its throttle streak ends, unless a pause
    -- is still running (this answer was in flight before it began).
    UPDATE public.egress_gates AS g SET throttle_streak = 0, updated_at = p_now
    WHERE g.egress_key = j.egress_key AND g.throttle_streak > 0
      AND (g.paused_until IS NULL OR g.paused_until <= p_now);

    changed := v_changed;
    history_appended := v_hist;
    previous_success_at := public.bf4ps_sane_time(v_prev);
    next_due_at := v_next;
    RETURN NEXT;
END;
$$;


ALTER FUNCTION public.bf4ps_succeed_job(p_uuid uuid, p_job_id bigint, p_lease_token uuid, p_data jsonb, p_duration_ms bigint, p_http_status integer, p_now timestamp with time zone) OWNER TO <migrator>;

--
-- Name: _sqlx_migrations; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public._sqlx_migrations (
    version bigint NOT NULL,
    description text NOT NULL,
    installed_on timestamp with time zone DEFAULT now() NOT NULL,
    success boolean NOT NULL,
    checksum bytea NOT NULL,
    execution_time bigint NOT NULL
);


ALTER TABLE public._sqlx_migrations OWNER TO <migrator>;

--
-- Name: activity_summary; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.activity_summary (
    singleton boolean DEFAULT true NOT NULL,
    counted_at timestamp with time zone NOT NULL,
    active_window interval NOT NULL,
    active_soldiers bigint NOT NULL,
    fresh_detailed bigint NOT NULL,
    fresh_profile bigint NOT NULL,
    fresh_weapons bigint NOT NULL,
    fresh_vehicles bigint NOT NULL,
    CONSTRAINT activity_summary_singleton_check CHECK (singleton)
);


ALTER TABLE public.activity_summary OWNER TO <migrator>;

--
-- Name: battlelog_profiles; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.battlelog_profiles (
    profile_id bigint NOT NULL,
    battlelog_username text NOT NULL,
    battlelog_user_id bigint,
    country_code character varying(2),
    country_name text,
    access_state text NOT NULL,
    last_checked_at timestamp with time zone,
    last_success_at timestamp with time zone,
    last_error text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT battlelog_profiles_access_state_check CHECK ((access_state = ANY (ARRAY['public_country'::text, 'public_no_country'::text, 'friends_only'::text, 'not_found'::text, 'error'::text]))),
    CONSTRAINT battlelog_profiles_country_upper_check CHECK (((country_code IS NULL) OR ((country_code)::text = upper((country_code)::text))))
);


ALTER TABLE public.battlelog_profiles OWNER TO <migrator>;

--
-- Name: battlelog_profiles_profile_id_seq; Type: SEQUENCE; Schema: public; Owner: <migrator>
--

ALTER TABLE public.battlelog_profiles ALTER COLUMN profile_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.battlelog_profiles_profile_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: bf4ps_leases; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.bf4ps_leases (
    lease_name text NOT NULL,
    holder text,
    holder_detail text,
    acquired_at timestamp with time zone,
    expires_at timestamp with time zone DEFAULT '-infinity'::timestamp with time zone NOT NULL,
    generation bigint DEFAULT 0 NOT NULL,
    CONSTRAINT bf4ps_leases_generation_check CHECK ((generation >= 0)),
    CONSTRAINT bf4ps_leases_name_check CHECK ((lease_name = ANY (ARRAY['projector'::text, 'retention'::text])))
);


ALTER TABLE public.bf4ps_leases OWNER TO <migrator>;

--
-- Name: bf4ps_locks; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.bf4ps_locks (
    lock_name text NOT NULL,
    CONSTRAINT bf4ps_locks_name_check CHECK ((lock_name = ANY (ARRAY['interactive_admission'::text, 'feeder'::text, 'freshness_compaction'::text, 'collector_registration'::text, 'weapon_catalog'::text, 'vehicle_catalog'::text])))
);


ALTER TABLE public.bf4ps_locks OWNER TO <migrator>;

--
-- Name: bf4ps_schema_source_sets; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.bf4ps_schema_source_sets (
    digest bytea NOT NULL,
    first_applied_at timestamp with time zone DEFAULT now() NOT NULL,
    applied_by text NOT NULL,
    CONSTRAINT ck_bf4ps_schema_source_sets_digest CHECK ((octet_length(digest) = 32))
);


ALTER TABLE public.bf4ps_schema_source_sets OWNER TO <migrator>;

--
-- Name: bf4ps_schema_sources; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.bf4ps_schema_sources (
    path text NOT NULL,
    checksum bytea NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL,
    applied_by text NOT NULL,
    CONSTRAINT ck_bf4ps_schema_sources_checksum CHECK ((octet_length(checksum) = 32)),
    CONSTRAINT ck_bf4ps_schema_sources_path CHECK ((path ~ '^[a-z_]+/[a-z0-9_]+\.sql$'::text))
);


ALTER TABLE public.bf4ps_schema_sources OWNER TO <migrator>;

--
-- Name: budget_usage; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.budget_usage (
    minute timestamp with time zone NOT NULL,
    budget_class text NOT NULL,
    grants integer NOT NULL,
    CONSTRAINT budget_usage_class_check CHECK ((budget_class = ANY (ARRAY['active'::text, 'bootstrap'::text, 'retry'::text]))),
    CONSTRAINT budget_usage_grants_check CHECK ((grants >= 0))
);


ALTER TABLE public.budget_usage OWNER TO <migrator>;

--
-- Name: collection_events; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.collection_events (
    event_id bigint NOT NULL,
    occurred_at timestamp with time zone DEFAULT now() NOT NULL,
    collector_uuid uuid,
    collector_name_snapshot text,
    hostname_snapshot text,
    egress_key_snapshot text,
    job_id bigint,
    soldier_id bigint,
    persona_id bigint,
    platform text,
    resource text,
    lane text,
    event_type text NOT NULL,
    attempt_number integer,
    result text,
    duration_ms bigint,
    http_status integer,
    error_class text,
    error_message text,
    lease_token uuid,
    metadata jsonb,
    tx_id xid8 DEFAULT pg_current_xact_id() NOT NULL,
    CONSTRAINT collection_events_attempt_check CHECK (((attempt_number IS NULL) OR (attempt_number >= 0))),
    CONSTRAINT collection_events_duration_check CHECK (((duration_ms IS NULL) OR (duration_ms >= 0))),
    CONSTRAINT collection_events_event_type_nonempty CHECK ((btrim(event_type) <> ''::text)),
    CONSTRAINT collection_events_http_status_check CHECK (((http_status IS NULL) OR ((http_status >= 100) AND (http_status <= 599)))),
    CONSTRAINT collection_events_lane_check CHECK (((lane IS NULL) OR (lane = ANY (ARRAY['background'::text, 'interactive'::text])))),
    CONSTRAINT collection_events_platform_check CHECK (((platform IS NULL) OR (platform = ANY (ARRAY['pc'::text, 'ps4'::text, 'xboxone'::text])))),
    CONSTRAINT collection_events_resource_check CHECK (((resource IS NULL) OR (resource = ANY (ARRAY['detailed'::text, 'profile'::text, 'weapons'::text, 'vehicles'::text]))))
);


ALTER TABLE public.collection_events OWNER TO <migrator>;

--
-- Name: collection_events_event_id_seq; Type: SEQUENCE; Schema: public; Owner: <migrator>
--

ALTER TABLE public.collection_events ALTER COLUMN event_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.collection_events_event_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: collection_jobs; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.collection_jobs (
    job_id bigint NOT NULL,
    soldier_id bigint NOT NULL,
    resource text NOT NULL,
    lane text NOT NULL,
    priority_class text NOT NULL,
    reason text NOT NULL,
    status text DEFAULT 'pending'::text NOT NULL,
    priority_value integer DEFAULT 0 NOT NULL,
    eligible_at timestamp with time zone DEFAULT now() NOT NULL,
    attempt_count integer DEFAULT 0 NOT NULL,
    collector_uuid uuid,
    lease_token uuid,
    claimed_at timestamp with time zone,
    started_at timestamp with time zone,
    lease_expires_at timestamp with time zone,
    last_error_class text,
    last_error_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    throttled_attempts integer DEFAULT 0 NOT NULL,
    CONSTRAINT collection_jobs_attempt_count_check CHECK ((attempt_count >= 0)),
    CONSTRAINT collection_jobs_lane_check CHECK ((lane = ANY (ARRAY['background'::text, 'interactive'::text]))),
    CONSTRAINT collection_jobs_lease_shape_check CHECK ((((status = 'pending'::text) AND (collector_uuid IS NULL) AND (lease_token IS NULL) AND (claimed_at IS NULL) AND (started_at IS NULL) AND (lease_expires_at IS NULL)) OR ((status = 'claimed'::text) AND (collector_uuid IS NOT NULL) AND (lease_token IS NOT NULL) AND (claimed_at IS NOT NULL) AND (started_at IS NULL) AND (lease_expires_at IS NOT NULL)) OR ((status = 'running'::text) AND (collector_uuid IS NOT NULL) AND (lease_token IS NOT NULL) AND (claimed_at IS NOT NULL) AND (started_at IS NOT NULL) AND (lease_expires_at IS NOT NULL)))),
    CONSTRAINT collection_jobs_priority_class_check CHECK ((priority_class = ANY (ARRAY['interactive'::text, 'active'::text, 'recent'::text, 'bootstrap'::text]))),
    CONSTRAINT collection_jobs_resource_check CHECK ((resource = ANY (ARRAY['detailed'::text, 'profile'::text, 'weapons'::text, 'vehicles'::text]))),
    CONSTRAINT collection_jobs_status_check CHECK ((status = ANY (ARRAY['pending'::text, 'claimed'::text, 'running'::text])))
);


ALTER TABLE public.collection_jobs OWNER TO <migrator>;

--
-- Name: collection_jobs_job_id_seq; Type: SEQUENCE; Schema: public; Owner: <migrator>
--

ALTER TABLE public.collection_jobs ALTER COLUMN job_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.collection_jobs_job_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: collection_state; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.collection_state (
    soldier_id bigint NOT NULL,
    detailed_state text DEFAULT 'never_attempted'::text NOT NULL,
    detailed_last_attempt_at timestamp with time zone,
    detailed_last_success_at timestamp with time zone,
    detailed_next_due_at timestamp with time zone,
    detailed_consecutive_failures integer DEFAULT 0 NOT NULL,
    detailed_last_error_class text,
    detailed_last_error_message text,
    profile_state text DEFAULT 'never_attempted'::text NOT NULL,
    profile_last_attempt_at timestamp with time zone,
    profile_last_success_at timestamp with time zone,
    profile_next_due_at timestamp with time zone,
    profile_consecutive_failures integer DEFAULT 0 NOT NULL,
    profile_last_error_class text,
    profile_last_error_message text,
    weapons_state text DEFAULT 'never_attempted'::text NOT NULL,
    weapons_last_attempt_at timestamp with time zone,
    weapons_last_success_at timestamp with time zone,
    weapons_next_due_at timestamp with time zone,
    weapons_consecutive_failures integer DEFAULT 0 NOT NULL,
    weapons_last_error_class text,
    weapons_last_error_message text,
    vehicles_state text DEFAULT 'never_attempted'::text NOT NULL,
    vehicles_last_attempt_at timestamp with time zone,
    vehicles_last_success_at timestamp with time zone,
    vehicles_next_due_at timestamp with time zone,
    vehicles_consecutive_failures integer DEFAULT 0 NOT NULL,
    vehicles_last_error_class text,
    vehicles_last_error_message text,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT collection_state_detailed_failures_check CHECK ((detailed_consecutive_failures >= 0)),
    CONSTRAINT collection_state_detailed_state_check CHECK ((detailed_state = ANY (ARRAY['never_attempted'::text, 'success'::text, 'temporary_failure'::text, 'unavailable'::text]))),
    CONSTRAINT collection_state_profile_failures_check CHECK ((profile_consecutive_failures >= 0)),
    CONSTRAINT collection_state_profile_state_check CHECK ((profile_state = ANY (ARRAY['never_attempted'::text, 'success'::text, 'temporary_failure'::text, 'unavailable'::text]))),
    CONSTRAINT collection_state_vehicles_failures_check CHECK ((vehicles_consecutive_failures >= 0)),
    CONSTRAINT collection_state_vehicles_state_check CHECK ((vehicles_state = ANY (ARRAY['never_attempted'::text, 'success'::text, 'temporary_failure'::text, 'unavailable'::text]))),
    CONSTRAINT collection_state_weapons_failures_check CHECK ((weapons_consecutive_failures >= 0)),
    CONSTRAINT collection_state_weapons_state_check CHECK ((weapons_state = ANY (ARRAY['never_attempted'::text, 'success'::text, 'temporary_failure'::text, 'unavailable'::text])))
);


ALTER TABLE public.collection_state OWNER TO <migrator>;

--
-- Name: detailed_stats_current; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.detailed_stats_current (
    soldier_id bigint NOT NULL,
    rank bigint,
    time_played_seconds bigint,
    assault_score bigint,
    engineer_score bigint,
    support_score bigint,
    recon_score bigint,
    commander_score bigint,
    squad_score bigint,
    vehicle_score bigint,
    award_score bigint,
    unlock_score bigint,
    total_score bigint,
    combat_score bigint,
    conquest_score bigint,
    rush_score bigint,
    team_deathmatch_score bigint,
    domination_score bigint,
    obliteration_score bigint,
    defuse_score bigint,
    capture_the_flag_score bigint,
    air_superiority_score bigint,
    carrier_assault_score bigint,
    chain_link_score bigint,
    kills bigint,
    deaths bigint,
    kill_assists bigint,
    wins bigint,
    losses bigint,
    shots_fired bigint,
    shots_hit bigint,
    repairs bigint,
    revives bigint,
    heals bigint,
    resupplies bigint,
    avenger_kills bigint,
    savior_kills bigint,
    suppression_assists bigint,
    quit_percentage numeric(10,6),
    flags_captured bigint,
    flags_defended bigint,
    dogtags_taken bigint,
    vehicles_destroyed bigint,
    vehicle_damage bigint,
    headshots bigint,
    longest_headshot numeric(14,4),
    highest_kill_streak bigint,
    nemesis_kills bigint,
    highest_nemesis_streak bigint,
    source_fetched_at timestamp with time zone NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);


ALTER TABLE public.detailed_stats_current OWNER TO <migrator>;

--
-- Name: detailed_stats_history; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.detailed_stats_history (
    snapshot_id bigint NOT NULL,
    soldier_id bigint NOT NULL,
    rank bigint,
    time_played_seconds bigint,
    assault_score bigint,
    engineer_score bigint,
    support_score bigint,
    recon_score bigint,
    commander_score bigint,
    squad_score bigint,
    vehicle_score bigint,
    award_score bigint,
    unlock_score bigint,
    total_score bigint,
    combat_score bigint,
    conquest_score bigint,
    rush_score bigint,
    team_deathmatch_score bigint,
    domination_score bigint,
    obliteration_score bigint,
    defuse_score bigint,
    capture_the_flag_score bigint,
    air_superiority_score bigint,
    carrier_assault_score bigint,
    chain_link_score bigint,
    kills bigint,
    deaths bigint,
    kill_assists bigint,
    wins bigint,
    losses bigint,
    shots_fired bigint,
    shots_hit bigint,
    repairs bigint,
    revives bigint,
    heals bigint,
    resupplies bigint,
    avenger_kills bigint,
    savior_kills bigint,
    suppression_assists bigint,
    quit_percentage numeric(10,6),
    flags_captured bigint,
    flags_defended bigint,
    dogtags_taken bigint,
    vehicles_destroyed bigint,
    vehicle_damage bigint,
    headshots bigint,
    longest_headshot numeric(14,4),
    highest_kill_streak bigint,
    nemesis_kills bigint,
    highest_nemesis_streak bigint,
    observed_at timestamp with time zone NOT NULL
);


ALTER TABLE public.detailed_stats_history OWNER TO <migrator>;

--
-- Name: detailed_stats_history_snapshot_id_seq; Type: SEQUENCE; Schema: public; Owner: <migrator>
--

ALTER TABLE public.detailed_stats_history ALTER COLUMN snapshot_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.detailed_stats_history_snapshot_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: discovery_state; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.discovery_state (
    source_name text NOT NULL,
    last_alias_id bigint DEFAULT '0'::bigint NOT NULL,
    last_poll_at timestamp with time zone,
    last_success_at timestamp with time zone,
    last_error text,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT discovery_state_alias_id_check CHECK ((last_alias_id >= 0))
);


ALTER TABLE public.discovery_state OWNER TO <migrator>;

--
-- Name: egress_budget; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.egress_budget (
    singleton boolean DEFAULT true NOT NULL,
    next_slot_at timestamp with time zone DEFAULT now() NOT NULL,
    passes bigint DEFAULT 0 NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT egress_budget_passes_check CHECK ((passes >= 0)),
    CONSTRAINT egress_budget_singleton CHECK (singleton)
);


ALTER TABLE public.egress_budget OWNER TO <migrator>;

--
-- Name: event_rollup_hourly; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.event_rollup_hourly (
    bucket_start timestamp with time zone NOT NULL,
    resource text NOT NULL,
    lane text NOT NULL,
    succeeded bigint DEFAULT 0 NOT NULL,
    failed_transport bigint DEFAULT 0 NOT NULL,
    failed_timeout bigint DEFAULT 0 NOT NULL,
    failed_rate_limited bigint DEFAULT 0 NOT NULL,
    failed_server bigint DEFAULT 0 NOT NULL,
    failed_parse bigint DEFAULT 0 NOT NULL,
    failed_unavailable bigint DEFAULT 0 NOT NULL,
    failed_other bigint DEFAULT 0 NOT NULL,
    gave_up bigint DEFAULT 0 NOT NULL,
    retry_scheduled bigint DEFAULT 0 NOT NULL,
    lease_expired bigint DEFAULT 0 NOT NULL,
    reclaimed bigint DEFAULT 0 NOT NULL,
    duration_count bigint DEFAULT 0 NOT NULL,
    duration_sum_ms bigint DEFAULT 0 NOT NULL,
    duration_max_ms bigint DEFAULT 0 NOT NULL,
    refresh_age_count bigint DEFAULT 0 NOT NULL,
    refresh_age_sum_ms bigint DEFAULT 0 NOT NULL,
    refresh_age_max_ms bigint DEFAULT 0 NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    failed_throttled bigint DEFAULT 0 NOT NULL,
    failed_http bigint DEFAULT 0 NOT NULL,
    CONSTRAINT event_rollup_hourly_bucket_check CHECK ((bucket_start = (date_trunc('hour'::text, (bucket_start AT TIME ZONE 'UTC'::text)) AT TIME ZONE 'UTC'::text)))
);


ALTER TABLE public.event_rollup_hourly OWNER TO <migrator>;

--
-- Name: feeder_pairs; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.feeder_pairs (
    soldier_id bigint NOT NULL,
    resource text NOT NULL,
    kind smallint NOT NULL,
    phase smallint DEFAULT 0 NOT NULL,
    due_at timestamp with time zone,
    live_at timestamp with time zone,
    seen_at timestamp with time zone,
    first_seen_at timestamp with time zone,
    CONSTRAINT feeder_pairs_kind_check CHECK ((kind = ANY (ARRAY[0, 1, 2, 3]))),
    CONSTRAINT feeder_pairs_phase_check CHECK ((phase = ANY (ARRAY[0, 1, 2]))),
    CONSTRAINT feeder_pairs_resource_check CHECK ((resource = ANY (ARRAY['detailed'::text, 'profile'::text, 'weapons'::text, 'vehicles'::text])))
)
WITH (autovacuum_vacuum_scale_factor='0.02', autovacuum_analyze_scale_factor='0.02');


ALTER TABLE public.feeder_pairs OWNER TO <migrator>;

--
-- Name: feeder_usage; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.feeder_usage (
    minute timestamp with time zone NOT NULL,
    manual_bootstrap integer NOT NULL,
    CONSTRAINT feeder_usage_manual_bootstrap_check CHECK ((manual_bootstrap >= 0))
);


ALTER TABLE public.feeder_usage OWNER TO <migrator>;

--
-- Name: freshness_bands; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.freshness_bands (
    resource text NOT NULL,
    band smallint NOT NULL,
    pairs bigint NOT NULL,
    as_of timestamp with time zone NOT NULL,
    CONSTRAINT freshness_bands_resource_check CHECK ((resource = ANY (ARRAY['detailed'::text, 'profile'::text, 'weapons'::text, 'vehicles'::text])))
);


ALTER TABLE public.freshness_bands OWNER TO <migrator>;

--
-- Name: freshness_deltas; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.freshness_deltas (
    resource text NOT NULL,
    slot timestamp with time zone NOT NULL,
    pairs integer NOT NULL
);


ALTER TABLE public.freshness_deltas OWNER TO <migrator>;

--
-- Name: freshness_rollup; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.freshness_rollup (
    resource text NOT NULL,
    slot timestamp with time zone NOT NULL,
    pairs bigint NOT NULL,
    CONSTRAINT freshness_rollup_resource_check CHECK ((resource = ANY (ARRAY['detailed'::text, 'profile'::text, 'weapons'::text, 'vehicles'::text])))
);


ALTER TABLE public.freshness_rollup OWNER TO <migrator>;

--
-- Name: outbound_dispatches; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.outbound_dispatches (
    dispatch_id uuid NOT NULL,
    job_id bigint NOT NULL,
    attempt_number integer NOT NULL,
    resource text NOT NULL,
    lease_token uuid NOT NULL,
    collector_uuid uuid NOT NULL,
    egress_key text NOT NULL,
    lane text NOT NULL,
    payload_fingerprint text NOT NULL,
    admitted_at timestamp with time zone NOT NULL,
    phase text DEFAULT 'admitted'::text NOT NULL,
    send_marked_at timestamp with time zone,
    acknowledged_at timestamp with time zone,
    CONSTRAINT outbound_dispatch_ack_after_send CHECK (((acknowledged_at IS NULL) OR (acknowledged_at >= send_marked_at))),
    CONSTRAINT outbound_dispatch_attempt_positive CHECK (((job_id > 0) AND (attempt_number > 0))),
    CONSTRAINT outbound_dispatch_lane CHECK ((lane = ANY (ARRAY['background'::text, 'interactive'::text]))),
    CONSTRAINT outbound_dispatch_nonempty CHECK (((btrim(egress_key) <> ''::text) AND (btrim(payload_fingerprint) <> ''::text))),
    CONSTRAINT outbound_dispatch_phase CHECK ((phase = ANY (ARRAY['admitted'::text, 'may_have_sent'::text, 'acknowledged'::text, 'ambiguous'::text]))),
    CONSTRAINT outbound_dispatch_phase_timestamps CHECK ((((phase = 'admitted'::text) AND (send_marked_at IS NULL) AND (acknowledged_at IS NULL)) OR ((phase = ANY (ARRAY['may_have_sent'::text, 'ambiguous'::text])) AND (send_marked_at IS NOT NULL) AND (acknowledged_at IS NULL)) OR ((phase = 'acknowledged'::text) AND (send_marked_at IS NOT NULL) AND (acknowledged_at IS NOT NULL)))),
    CONSTRAINT outbound_dispatch_resource CHECK ((resource = ANY (ARRAY['detailed'::text, 'profile'::text, 'weapons'::text, 'vehicles'::text]))),
    CONSTRAINT outbound_dispatch_send_after_admit CHECK (((send_marked_at IS NULL) OR (send_marked_at >= admitted_at)))
);


ALTER TABLE public.outbound_dispatches OWNER TO <migrator>;

--
-- Name: profile_soldiers; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.profile_soldiers (
    profile_id bigint NOT NULL,
    soldier_id bigint NOT NULL,
    first_seen_at timestamp with time zone NOT NULL,
    last_seen_at timestamp with time zone NOT NULL
);


ALTER TABLE public.profile_soldiers OWNER TO <migrator>;

--
-- Name: projector_checkpoint; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.projector_checkpoint (
    projector text DEFAULT 'main'::text NOT NULL,
    tx_id xid8 NOT NULL,
    event_id bigint NOT NULL,
    projected_events bigint DEFAULT 0 NOT NULL,
    last_event_at timestamp with time zone,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT projector_checkpoint_counts_check CHECK (((event_id >= 0) AND (projected_events >= 0))),
    CONSTRAINT projector_checkpoint_name_nonempty CHECK ((btrim(projector) <> ''::text))
);


ALTER TABLE public.projector_checkpoint OWNER TO <migrator>;

--
-- Name: projector_quarantine; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.projector_quarantine (
    event_id bigint NOT NULL,
    tx_id xid8 NOT NULL,
    reason text NOT NULL,
    quarantined_at timestamp with time zone DEFAULT now() NOT NULL
);


ALTER TABLE public.projector_quarantine OWNER TO <migrator>;

--
-- Name: request_gates; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.request_gates (
    egress_key text NOT NULL,
    next_request_at timestamp with time zone NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT request_gates_egress_nonempty CHECK ((btrim(egress_key) <> ''::text))
);


ALTER TABLE public.request_gates OWNER TO <migrator>;

--
-- Name: retention_runs; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.retention_runs (
    run_id bigint NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    cutoff timestamp with time zone NOT NULL,
    deleted bigint DEFAULT 0 NOT NULL,
    dry_run boolean DEFAULT false NOT NULL,
    eligible bigint,
    CONSTRAINT retention_runs_deleted_check CHECK ((deleted >= 0))
);


ALTER TABLE public.retention_runs OWNER TO <migrator>;

--
-- Name: retention_runs_run_id_seq; Type: SEQUENCE; Schema: public; Owner: <migrator>
--

ALTER TABLE public.retention_runs ALTER COLUMN run_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.retention_runs_run_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: soldier_names; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.soldier_names (
    soldier_name_id bigint NOT NULL,
    soldier_id bigint NOT NULL,
    name text NOT NULL,
    first_seen_at timestamp with time zone NOT NULL,
    last_seen_at timestamp with time zone NOT NULL,
    CONSTRAINT soldier_names_name_nonempty CHECK ((btrim(name) <> ''::text))
);


ALTER TABLE public.soldier_names OWNER TO <migrator>;

--
-- Name: soldier_names_soldier_name_id_seq; Type: SEQUENCE; Schema: public; Owner: <migrator>
--

ALTER TABLE public.soldier_names ALTER COLUMN soldier_name_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.soldier_names_soldier_name_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: soldier_sources; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.soldier_sources (
    soldier_id bigint NOT NULL,
    source_type text NOT NULL,
    first_seen_at timestamp with time zone NOT NULL,
    last_seen_at timestamp with time zone NOT NULL,
    CONSTRAINT soldier_sources_type_check CHECK ((source_type = ANY (ARRAY['bf4sw'::text, 'manual'::text])))
);


ALTER TABLE public.soldier_sources OWNER TO <migrator>;

--
-- Name: soldier_vehicle_stats; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.soldier_vehicle_stats (
    soldier_id bigint NOT NULL,
    vehicle_id bigint NOT NULL,
    kills bigint NOT NULL,
    time_in_seconds bigint NOT NULL,
    destroy_x_in_y bigint,
    source_fetched_at timestamp with time zone NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);


ALTER TABLE public.soldier_vehicle_stats OWNER TO <migrator>;

--
-- Name: soldier_weapon_stats; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.soldier_weapon_stats (
    soldier_id bigint NOT NULL,
    weapon_id bigint NOT NULL,
    kills bigint NOT NULL,
    headshots bigint NOT NULL,
    shots_fired bigint NOT NULL,
    shots_hit bigint NOT NULL,
    time_equipped_seconds bigint NOT NULL,
    source_fetched_at timestamp with time zone NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);


ALTER TABLE public.soldier_weapon_stats OWNER TO <migrator>;

--
-- Name: soldiers; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.soldiers (
    soldier_id bigint NOT NULL,
    persona_id bigint NOT NULL,
    platform text NOT NULL,
    current_name text NOT NULL,
    first_seen_at timestamp with time zone NOT NULL,
    last_seen_at timestamp with time zone NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT soldiers_name_nonempty CHECK ((btrim(current_name) <> ''::text)),
    CONSTRAINT soldiers_platform_check CHECK ((platform = ANY (ARRAY['pc'::text, 'ps4'::text, 'xboxone'::text])))
);


ALTER TABLE public.soldiers OWNER TO <migrator>;

--
-- Name: soldiers_soldier_id_seq; Type: SEQUENCE; Schema: public; Owner: <migrator>
--

ALTER TABLE public.soldiers ALTER COLUMN soldier_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.soldiers_soldier_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: stage9c_supervision_runs; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.stage9c_supervision_runs (
    run_id uuid NOT NULL,
    state text NOT NULL,
    cutover_at timestamp with time zone NOT NULL,
    since_event_id bigint NOT NULL,
    started_at timestamp with time zone,
    deadline_at timestamp with time zone,
    watchdog_owner uuid,
    watchdog_generation bigint DEFAULT '0'::bigint NOT NULL,
    heartbeat_at timestamp with time zone,
    lease_expires_at timestamp with time zone,
    abort_at timestamp with time zone,
    abort_reason text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT stage9c_run_abort_pair CHECK ((((abort_at IS NULL) AND (abort_reason IS NULL)) OR ((abort_at IS NOT NULL) AND (abort_reason IS NOT NULL) AND (btrim(abort_reason) <> ''::text)))),
    CONSTRAINT stage9c_run_aborted_reason CHECK (((state <> 'aborted'::text) OR (abort_at IS NOT NULL))),
    CONSTRAINT stage9c_run_activation_dates CHECK (((state = 'prepared'::text) OR ((started_at IS NOT NULL) AND (deadline_at IS NOT NULL)))),
    CONSTRAINT stage9c_run_active_lease CHECK (((state <> 'active'::text) OR ((watchdog_owner IS NOT NULL) AND (heartbeat_at IS NOT NULL) AND (lease_expires_at IS NOT NULL) AND (lease_expires_at > heartbeat_at)))),
    CONSTRAINT stage9c_run_boundary CHECK ((since_event_id >= 0)),
    CONSTRAINT stage9c_run_generation CHECK ((watchdog_generation >= 0)),
    CONSTRAINT stage9c_run_six_hour_deadline CHECK ((((started_at IS NULL) AND (deadline_at IS NULL)) OR ((started_at IS NOT NULL) AND (deadline_at = (started_at + '06:00:00'::interval))))),
    CONSTRAINT stage9c_run_state CHECK ((state = ANY (ARRAY['prepared'::text, 'active'::text, 'aborted'::text, 'completed'::text])))
);


ALTER TABLE public.stage9c_supervision_runs OWNER TO <migrator>;

--
-- Name: vehicle_catalog; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.vehicle_catalog (
    vehicle_id bigint NOT NULL,
    vehicle_guid text NOT NULL,
    name text NOT NULL,
    slug text,
    category text,
    first_seen_at timestamp with time zone NOT NULL,
    last_seen_at timestamp with time zone NOT NULL
);


ALTER TABLE public.vehicle_catalog OWNER TO <migrator>;

--
-- Name: vehicle_catalog_vehicle_id_seq; Type: SEQUENCE; Schema: public; Owner: <migrator>
--

ALTER TABLE public.vehicle_catalog ALTER COLUMN vehicle_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.vehicle_catalog_vehicle_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: weapon_catalog; Type: TABLE; Schema: public; Owner: <migrator>
--

CREATE TABLE public.weapon_catalog (
    weapon_id bigint NOT NULL,
    weapon_guid text NOT NULL,
    name text NOT NULL,
    slug text,
    category text,
    first_seen_at timestamp with time zone NOT NULL,
    last_seen_at timestamp with time zone NOT NULL
);


ALTER TABLE public.weapon_catalog OWNER TO <migrator>;

--
-- Name: weapon_catalog_weapon_id_seq; Type: SEQUENCE; Schema: public; Owner: <migrator>
--

ALTER TABLE public.weapon_catalog ALTER COLUMN weapon_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.weapon_catalog_weapon_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: _sqlx_migrations _sqlx_migrations_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public._sqlx_migrations
    ADD CONSTRAINT _sqlx_migrations_pkey PRIMARY KEY (version);


--
-- Name: activity_summary activity_summary_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.activity_summary
    ADD CONSTRAINT activity_summary_pkey PRIMARY KEY (singleton);


--
-- Name: battlelog_profiles battlelog_profiles_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.battlelog_profiles
    ADD CONSTRAINT battlelog_profiles_pkey PRIMARY KEY (profile_id);


--
-- Name: bf4ps_leases bf4ps_leases_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.bf4ps_leases
    ADD CONSTRAINT bf4ps_leases_pkey PRIMARY KEY (lease_name);


--
-- Name: bf4ps_locks bf4ps_locks_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.bf4ps_locks
    ADD CONSTRAINT bf4ps_locks_pkey PRIMARY KEY (lock_name);


--
-- Name: bf4ps_schema_source_sets bf4ps_schema_source_sets_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.bf4ps_schema_source_sets
    ADD CONSTRAINT bf4ps_schema_source_sets_pkey PRIMARY KEY (digest);


--
-- Name: bf4ps_schema_sources bf4ps_schema_sources_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.bf4ps_schema_sources
    ADD CONSTRAINT bf4ps_schema_sources_pkey PRIMARY KEY (path);


--
-- Name: budget_usage budget_usage_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.budget_usage
    ADD CONSTRAINT budget_usage_pkey PRIMARY KEY (minute, budget_class);


--
-- Name: collection_events collection_events_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.collection_events
    ADD CONSTRAINT collection_events_pkey PRIMARY KEY (event_id);


--
-- Name: collection_jobs collection_jobs_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.collection_jobs
    ADD CONSTRAINT collection_jobs_pkey PRIMARY KEY (job_id);


--
-- Name: collection_state collection_state_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.collection_state
    ADD CONSTRAINT collection_state_pkey PRIMARY KEY (soldier_id);


--
-- Name: collector_secrets collector_secrets_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.collector_secrets
    ADD CONSTRAINT collector_secrets_pkey PRIMARY KEY (collector_uuid);


--
-- Name: collectors collectors_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.collectors
    ADD CONSTRAINT collectors_pkey PRIMARY KEY (collector_uuid);


--
-- Name: detailed_stats_current detailed_stats_current_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.detailed_stats_current
    ADD CONSTRAINT detailed_stats_current_pkey PRIMARY KEY (soldier_id);


--
-- Name: detailed_stats_history detailed_stats_history_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.detailed_stats_history
    ADD CONSTRAINT detailed_stats_history_pkey PRIMARY KEY (snapshot_id);


--
-- Name: discovery_state discovery_state_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.discovery_state
    ADD CONSTRAINT discovery_state_pkey PRIMARY KEY (source_name);


--
-- Name: egress_budget egress_budget_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.egress_budget
    ADD CONSTRAINT egress_budget_pkey PRIMARY KEY (singleton);


--
-- Name: egress_gates egress_gates_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.egress_gates
    ADD CONSTRAINT egress_gates_pkey PRIMARY KEY (egress_key);


--
-- Name: egress_hosts egress_hosts_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.egress_hosts
    ADD CONSTRAINT egress_hosts_pkey PRIMARY KEY (host);


--
-- Name: event_rollup_hourly event_rollup_hourly_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.event_rollup_hourly
    ADD CONSTRAINT event_rollup_hourly_pkey PRIMARY KEY (bucket_start, resource, lane);


--
-- Name: feeder_pairs feeder_pairs_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.feeder_pairs
    ADD CONSTRAINT feeder_pairs_pkey PRIMARY KEY (soldier_id, resource);


--
-- Name: feeder_usage feeder_usage_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.feeder_usage
    ADD CONSTRAINT feeder_usage_pkey PRIMARY KEY (minute);


--
-- Name: freshness_bands freshness_bands_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.freshness_bands
    ADD CONSTRAINT freshness_bands_pkey PRIMARY KEY (resource, band);


--
-- Name: freshness_rollup freshness_rollup_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.freshness_rollup
    ADD CONSTRAINT freshness_rollup_pkey PRIMARY KEY (resource, slot);


--
-- Name: outbound_dispatches outbound_dispatches_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.outbound_dispatches
    ADD CONSTRAINT outbound_dispatches_pkey PRIMARY KEY (dispatch_id);


--
-- Name: profile_soldiers profile_soldiers_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.profile_soldiers
    ADD CONSTRAINT profile_soldiers_pkey PRIMARY KEY (profile_id, soldier_id);


--
-- Name: projector_checkpoint projector_checkpoint_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.projector_checkpoint
    ADD CONSTRAINT projector_checkpoint_pkey PRIMARY KEY (projector);


--
-- Name: projector_quarantine projector_quarantine_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.projector_quarantine
    ADD CONSTRAINT projector_quarantine_pkey PRIMARY KEY (event_id);


--
-- Name: request_gates request_gates_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.request_gates
    ADD CONSTRAINT request_gates_pkey PRIMARY KEY (egress_key);


--
-- Name: retention_runs retention_runs_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.retention_runs
    ADD CONSTRAINT retention_runs_pkey PRIMARY KEY (run_id);


--
-- Name: scheduling_settings scheduling_settings_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.scheduling_settings
    ADD CONSTRAINT scheduling_settings_pkey PRIMARY KEY (singleton);


--
-- Name: soldier_names soldier_names_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.soldier_names
    ADD CONSTRAINT soldier_names_pkey PRIMARY KEY (soldier_name_id);


--
-- Name: soldier_sources soldier_sources_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.soldier_sources
    ADD CONSTRAINT soldier_sources_pkey PRIMARY KEY (soldier_id, source_type);


--
-- Name: soldier_vehicle_stats soldier_vehicle_stats_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.soldier_vehicle_stats
    ADD CONSTRAINT soldier_vehicle_stats_pkey PRIMARY KEY (soldier_id, vehicle_id);


--
-- Name: soldier_weapon_stats soldier_weapon_stats_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.soldier_weapon_stats
    ADD CONSTRAINT soldier_weapon_stats_pkey PRIMARY KEY (soldier_id, weapon_id);


--
-- Name: soldiers soldiers_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.soldiers
    ADD CONSTRAINT soldiers_pkey PRIMARY KEY (soldier_id);


--
-- Name: stage9c_supervision_runs stage9c_supervision_runs_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.stage9c_supervision_runs
    ADD CONSTRAINT stage9c_supervision_runs_pkey PRIMARY KEY (run_id);


--
-- Name: collection_jobs uq_collection_jobs_soldier_resource; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.collection_jobs
    ADD CONSTRAINT uq_collection_jobs_soldier_resource UNIQUE (soldier_id, resource);


--
-- Name: outbound_dispatches uq_outbound_dispatch_identity; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.outbound_dispatches
    ADD CONSTRAINT uq_outbound_dispatch_identity UNIQUE (job_id, attempt_number, resource, lease_token);


--
-- Name: soldier_names uq_soldier_names_soldier_name; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.soldier_names
    ADD CONSTRAINT uq_soldier_names_soldier_name UNIQUE (soldier_id, name);


--
-- Name: soldiers uq_soldiers_persona_platform; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.soldiers
    ADD CONSTRAINT uq_soldiers_persona_platform UNIQUE (persona_id, platform);


--
-- Name: vehicle_catalog vehicle_catalog_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.vehicle_catalog
    ADD CONSTRAINT vehicle_catalog_pkey PRIMARY KEY (vehicle_id);


--
-- Name: vehicle_catalog vehicle_catalog_vehicle_guid_key; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.vehicle_catalog
    ADD CONSTRAINT vehicle_catalog_vehicle_guid_key UNIQUE (vehicle_guid);


--
-- Name: weapon_catalog weapon_catalog_pkey; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.weapon_catalog
    ADD CONSTRAINT weapon_catalog_pkey PRIMARY KEY (weapon_id);


--
-- Name: weapon_catalog weapon_catalog_weapon_guid_key; Type: CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.weapon_catalog
    ADD CONSTRAINT weapon_catalog_weapon_guid_key UNIQUE (weapon_guid);


--
-- Name: ix_collection_events_collector_time; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_collection_events_collector_time ON public.collection_events USING btree (collector_uuid, occurred_at DESC);


--
-- Name: ix_collection_events_http_errors; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_collection_events_http_errors ON public.collection_events USING btree (http_status, occurred_at DESC) WHERE (http_status IS NOT NULL);


--
-- Name: ix_collection_events_interactive_finished; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_collection_events_interactive_finished ON public.collection_events USING btree (occurred_at DESC) WHERE ((lane = 'interactive'::text) AND (event_type = ANY (ARRAY['succeeded'::text, 'failed'::text])));


--
-- Name: ix_collection_events_job; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_collection_events_job ON public.collection_events USING btree (job_id, occurred_at) WHERE (job_id IS NOT NULL);


--
-- Name: ix_collection_events_persona_time; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_collection_events_persona_time ON public.collection_events USING btree (platform, persona_id, occurred_at DESC) WHERE (persona_id IS NOT NULL);


--
-- Name: ix_collection_events_soldier_time; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_collection_events_soldier_time ON public.collection_events USING btree (soldier_id, occurred_at DESC) WHERE (soldier_id IS NOT NULL);


--
-- Name: ix_collection_events_time; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_collection_events_time ON public.collection_events USING btree (occurred_at DESC);


--
-- Name: ix_collection_events_tx; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_collection_events_tx ON public.collection_events USING btree (tx_id, event_id);


--
-- Name: ix_collection_events_type_time; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_collection_events_type_time ON public.collection_events USING btree (event_type, occurred_at DESC);


--
-- Name: ix_collection_jobs_budget_claim_order; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_collection_jobs_budget_claim_order ON public.collection_jobs USING btree (public.bf4ps_budget_class(priority_class, last_error_at), (
CASE priority_class
    WHEN 'interactive'::text THEN 1
    WHEN 'active'::text THEN 2
    WHEN 'recent'::text THEN 3
    WHEN 'bootstrap'::text THEN 4
    ELSE NULL::integer
END), priority_value DESC, eligible_at, created_at, job_id) WHERE ((status = 'pending'::text) AND (lane = 'background'::text));


--
-- Name: ix_collection_jobs_claim; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_collection_jobs_claim ON public.collection_jobs USING btree (lane, priority_class, priority_value DESC, eligible_at, created_at, job_id) WHERE (status = 'pending'::text);


--
-- Name: ix_collection_jobs_claim_order; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_collection_jobs_claim_order ON public.collection_jobs USING btree (lane, (
CASE priority_class
    WHEN 'interactive'::text THEN 1
    WHEN 'active'::text THEN 2
    WHEN 'recent'::text THEN 3
    WHEN 'bootstrap'::text THEN 4
    ELSE NULL::integer
END), priority_value DESC, eligible_at, created_at, job_id) WHERE (status = 'pending'::text);


--
-- Name: ix_collection_jobs_collector; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_collection_jobs_collector ON public.collection_jobs USING btree (collector_uuid) WHERE (collector_uuid IS NOT NULL);


--
-- Name: ix_collection_jobs_expired_lease; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_collection_jobs_expired_lease ON public.collection_jobs USING btree (lease_expires_at, job_id) WHERE (status = ANY (ARRAY['claimed'::text, 'running'::text]));


--
-- Name: ix_collection_state_detailed_due; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_collection_state_detailed_due ON public.collection_state USING btree (detailed_next_due_at) WHERE (detailed_next_due_at IS NOT NULL);


--
-- Name: ix_collection_state_detailed_retry; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_collection_state_detailed_retry ON public.collection_state USING btree (detailed_next_due_at) WHERE (detailed_state = 'temporary_failure'::text);


--
-- Name: ix_collection_state_detailed_success; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_collection_state_detailed_success ON public.collection_state USING btree (detailed_last_success_at) WHERE (detailed_last_success_at IS NOT NULL);


--
-- Name: ix_collection_state_profile_due; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_collection_state_profile_due ON public.collection_state USING btree (profile_next_due_at) WHERE (profile_next_due_at IS NOT NULL);


--
-- Name: ix_collection_state_profile_retry; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_collection_state_profile_retry ON public.collection_state USING btree (profile_next_due_at) WHERE (profile_state = 'temporary_failure'::text);


--
-- Name: ix_collection_state_profile_success; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_collection_state_profile_success ON public.collection_state USING btree (profile_last_success_at) WHERE (profile_last_success_at IS NOT NULL);


--
-- Name: ix_collection_state_vehicles_due; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_collection_state_vehicles_due ON public.collection_state USING btree (vehicles_next_due_at) WHERE (vehicles_next_due_at IS NOT NULL);


--
-- Name: ix_collection_state_vehicles_retry; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_collection_state_vehicles_retry ON public.collection_state USING btree (vehicles_next_due_at) WHERE (vehicles_state = 'temporary_failure'::text);


--
-- Name: ix_collection_state_vehicles_success; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_collection_state_vehicles_success ON public.collection_state USING btree (vehicles_last_success_at) WHERE (vehicles_last_success_at IS NOT NULL);


--
-- Name: ix_collection_state_weapons_due; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_collection_state_weapons_due ON public.collection_state USING btree (weapons_next_due_at) WHERE (weapons_next_due_at IS NOT NULL);


--
-- Name: ix_collection_state_weapons_retry; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_collection_state_weapons_retry ON public.collection_state USING btree (weapons_next_due_at) WHERE (weapons_state = 'temporary_failure'::text);


--
-- Name: ix_collection_state_weapons_success; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_collection_state_weapons_success ON public.collection_state USING btree (weapons_last_success_at) WHERE (weapons_last_success_at IS NOT NULL);


--
-- Name: ix_collector_secrets_registered_by; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_collector_secrets_registered_by ON public.collector_secrets USING btree (registered_by, created_at);


--
-- Name: ix_collectors_egress; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_collectors_egress ON public.collectors USING btree (egress_key) WHERE (retired_at IS NULL);


--
-- Name: ix_collectors_heartbeat; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_collectors_heartbeat ON public.collectors USING btree (heartbeat_state, last_heartbeat_at) WHERE (retired_at IS NULL);


--
-- Name: ix_detailed_history_soldier_observed; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_detailed_history_soldier_observed ON public.detailed_stats_history USING btree (soldier_id, observed_at DESC);


--
-- Name: ix_event_rollup_hourly_resource_time; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_event_rollup_hourly_resource_time ON public.event_rollup_hourly USING btree (resource, bucket_start);


--
-- Name: ix_feeder_pairs_active; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_feeder_pairs_active ON public.feeder_pairs USING btree (resource, seen_at DESC, soldier_id) WHERE ((phase = 2) AND (kind = 2));


--
-- Name: ix_feeder_pairs_bootstrap; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_feeder_pairs_bootstrap ON public.feeder_pairs USING btree (resource, first_seen_at, soldier_id) WHERE ((phase = 2) AND (kind = 1));


--
-- Name: ix_feeder_pairs_due; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_feeder_pairs_due ON public.feeder_pairs USING btree (phase, due_at) WHERE ((kind = 2) AND (phase = 1));


--
-- Name: ix_feeder_pairs_live; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_feeder_pairs_live ON public.feeder_pairs USING btree (phase, live_at) WHERE (kind > 0);


--
-- Name: ix_feeder_pairs_manual; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_feeder_pairs_manual ON public.feeder_pairs USING btree (resource, first_seen_at, soldier_id) WHERE ((phase = 2) AND (kind = 3));


--
-- Name: ix_freshness_rollup_slot; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_freshness_rollup_slot ON public.freshness_rollup USING btree (slot);


--
-- Name: ix_outbound_dispatch_background_admitted; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_outbound_dispatch_background_admitted ON public.outbound_dispatches USING btree (admitted_at) WHERE (lane = 'background'::text);


--
-- Name: ix_outbound_dispatch_egress_admitted; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_outbound_dispatch_egress_admitted ON public.outbound_dispatches USING btree (egress_key, admitted_at);


--
-- Name: ix_retention_runs_started; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_retention_runs_started ON public.retention_runs USING btree (started_at DESC);


--
-- Name: ix_soldier_names_name_lower; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_soldier_names_name_lower ON public.soldier_names USING btree (lower(name));


--
-- Name: ix_soldier_sources_seen; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_soldier_sources_seen ON public.soldier_sources USING btree (last_seen_at);


--
-- Name: ix_soldiers_current_name_lower; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_soldiers_current_name_lower ON public.soldiers USING btree (lower(current_name));


--
-- Name: ix_soldiers_last_seen; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE INDEX ix_soldiers_last_seen ON public.soldiers USING btree (last_seen_at);


--
-- Name: uq_battlelog_profiles_username_lower; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE UNIQUE INDEX uq_battlelog_profiles_username_lower ON public.battlelog_profiles USING btree (lower(battlelog_username));


--
-- Name: uq_collectors_active_name; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE UNIQUE INDEX uq_collectors_active_name ON public.collectors USING btree (lower(collector_name)) WHERE (retired_at IS NULL);


--
-- Name: uq_stage9c_one_active_run; Type: INDEX; Schema: public; Owner: <migrator>
--

CREATE UNIQUE INDEX uq_stage9c_one_active_run ON public.stage9c_supervision_runs USING btree (state) WHERE (state = 'active'::text);


--
-- Name: collection_events trg_collection_events_notify; Type: TRIGGER; Schema: public; Owner: <migrator>
--

CREATE TRIGGER trg_collection_events_notify AFTER INSERT ON public.collection_events FOR EACH ROW WHEN (((COALESCE(current_setting('bf4ps.notify_events'::text, true), ''::text) = 'all'::text) OR ((COALESCE(current_setting('bf4ps.notify_events'::text, true), ''::text) <> 'off'::text) AND (new.event_type <> ALL (ARRAY['claimed'::text, 'started'::text]))))) EXECUTE FUNCTION public.bf4ps_notify_event();


--
-- Name: collection_jobs trg_collection_jobs_notify_claimable; Type: TRIGGER; Schema: public; Owner: <migrator>
--

CREATE TRIGGER trg_collection_jobs_notify_claimable AFTER UPDATE ON public.collection_jobs FOR EACH ROW WHEN (((new.status = 'pending'::text) AND (new.eligible_at <= now()) AND ((old.status <> 'pending'::text) OR (old.lane <> new.lane) OR (old.eligible_at > now())))) EXECUTE FUNCTION public.bf4ps_notify_job_claimable();


--
-- Name: collection_jobs trg_collection_jobs_notify_insert; Type: TRIGGER; Schema: public; Owner: <migrator>
--

CREATE TRIGGER trg_collection_jobs_notify_insert AFTER INSERT ON public.collection_jobs REFERENCING NEW TABLE AS bf4ps_new_jobs FOR EACH STATEMENT EXECUTE FUNCTION public.bf4ps_notify_jobs_claimable();


--
-- Name: collection_state trg_collection_state_feeder_delete; Type: TRIGGER; Schema: public; Owner: <migrator>
--

CREATE TRIGGER trg_collection_state_feeder_delete AFTER DELETE ON public.collection_state REFERENCING OLD TABLE AS bf4ps_rows FOR EACH STATEMENT EXECUTE FUNCTION public.bf4ps_feeder_rows_changed();


--
-- Name: collection_state trg_collection_state_feeder_insert; Type: TRIGGER; Schema: public; Owner: <migrator>
--

CREATE TRIGGER trg_collection_state_feeder_insert AFTER INSERT ON public.collection_state REFERENCING NEW TABLE AS bf4ps_rows FOR EACH STATEMENT EXECUTE FUNCTION public.bf4ps_feeder_rows_changed();


--
-- Name: collection_state trg_collection_state_feeder_truncate; Type: TRIGGER; Schema: public; Owner: <migrator>
--

CREATE TRIGGER trg_collection_state_feeder_truncate AFTER TRUNCATE ON public.collection_state FOR EACH STATEMENT EXECUTE FUNCTION public.bf4ps_feeder_truncated();


--
-- Name: collection_state trg_collection_state_feeder_update; Type: TRIGGER; Schema: public; Owner: <migrator>
--

CREATE TRIGGER trg_collection_state_feeder_update AFTER UPDATE ON public.collection_state FOR EACH ROW WHEN (((old.detailed_state IS DISTINCT FROM new.detailed_state) OR (old.detailed_next_due_at IS DISTINCT FROM new.detailed_next_due_at) OR (old.profile_state IS DISTINCT FROM new.profile_state) OR (old.profile_next_due_at IS DISTINCT FROM new.profile_next_due_at) OR (old.weapons_state IS DISTINCT FROM new.weapons_state) OR (old.weapons_next_due_at IS DISTINCT FROM new.weapons_next_due_at) OR (old.vehicles_state IS DISTINCT FROM new.vehicles_state) OR (old.vehicles_next_due_at IS DISTINCT FROM new.vehicles_next_due_at) OR (old.soldier_id IS DISTINCT FROM new.soldier_id))) EXECUTE FUNCTION public.bf4ps_feeder_row_changed();


--
-- Name: collection_state trg_collection_state_freshness_delete; Type: TRIGGER; Schema: public; Owner: <migrator>
--

CREATE TRIGGER trg_collection_state_freshness_delete AFTER DELETE ON public.collection_state REFERENCING OLD TABLE AS bf4ps_old_state FOR EACH STATEMENT EXECUTE FUNCTION public.bf4ps_freshness_deleted();


--
-- Name: collection_state trg_collection_state_freshness_insert; Type: TRIGGER; Schema: public; Owner: <migrator>
--

CREATE TRIGGER trg_collection_state_freshness_insert AFTER INSERT ON public.collection_state REFERENCING NEW TABLE AS bf4ps_new_state FOR EACH STATEMENT EXECUTE FUNCTION public.bf4ps_freshness_inserted();


--
-- Name: collection_state trg_collection_state_freshness_truncate; Type: TRIGGER; Schema: public; Owner: <migrator>
--

CREATE TRIGGER trg_collection_state_freshness_truncate AFTER TRUNCATE ON public.collection_state FOR EACH STATEMENT EXECUTE FUNCTION public.bf4ps_freshness_truncated();


--
-- Name: collection_state trg_collection_state_freshness_update; Type: TRIGGER; Schema: public; Owner: <migrator>
--

CREATE TRIGGER trg_collection_state_freshness_update AFTER UPDATE ON public.collection_state FOR EACH ROW WHEN (((old.detailed_last_success_at IS DISTINCT FROM new.detailed_last_success_at) OR (old.profile_last_success_at IS DISTINCT FROM new.profile_last_success_at) OR (old.weapons_last_success_at IS DISTINCT FROM new.weapons_last_success_at) OR (old.vehicles_last_success_at IS DISTINCT FROM new.vehicles_last_success_at))) EXECUTE FUNCTION public.bf4ps_freshness_moved();


--
-- Name: soldier_sources trg_soldier_sources_feeder_delete; Type: TRIGGER; Schema: public; Owner: <migrator>
--

CREATE TRIGGER trg_soldier_sources_feeder_delete AFTER DELETE ON public.soldier_sources REFERENCING OLD TABLE AS bf4ps_rows FOR EACH STATEMENT EXECUTE FUNCTION public.bf4ps_feeder_rows_changed();


--
-- Name: soldier_sources trg_soldier_sources_feeder_insert; Type: TRIGGER; Schema: public; Owner: <migrator>
--

CREATE TRIGGER trg_soldier_sources_feeder_insert AFTER INSERT ON public.soldier_sources REFERENCING NEW TABLE AS bf4ps_rows FOR EACH STATEMENT EXECUTE FUNCTION public.bf4ps_feeder_rows_changed();


--
-- Name: soldier_sources trg_soldier_sources_feeder_update; Type: TRIGGER; Schema: public; Owner: <migrator>
--

CREATE TRIGGER trg_soldier_sources_feeder_update AFTER UPDATE ON public.soldier_sources REFERENCING NEW TABLE AS bf4ps_rows FOR EACH STATEMENT EXECUTE FUNCTION public.bf4ps_feeder_rows_changed();


--
-- Name: soldiers trg_soldiers_feeder_first_seen; Type: TRIGGER; Schema: public; Owner: <migrator>
--

CREATE TRIGGER trg_soldiers_feeder_first_seen AFTER UPDATE ON public.soldiers FOR EACH ROW WHEN ((old.first_seen_at IS DISTINCT FROM new.first_seen_at)) EXECUTE FUNCTION public.bf4ps_feeder_row_changed();


--
-- Name: collection_events collection_events_collector_uuid_fkey; Type: FK CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.collection_events
    ADD CONSTRAINT collection_events_collector_uuid_fkey FOREIGN KEY (collector_uuid) REFERENCES public.collectors(collector_uuid) ON DELETE SET NULL;


--
-- Name: collection_events collection_events_soldier_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.collection_events
    ADD CONSTRAINT collection_events_soldier_id_fkey FOREIGN KEY (soldier_id) REFERENCES public.soldiers(soldier_id) ON DELETE SET NULL;


--
-- Name: collection_jobs collection_jobs_collector_uuid_fkey; Type: FK CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.collection_jobs
    ADD CONSTRAINT collection_jobs_collector_uuid_fkey FOREIGN KEY (collector_uuid) REFERENCES public.collectors(collector_uuid) ON DELETE SET NULL;


--
-- Name: collection_jobs collection_jobs_soldier_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.collection_jobs
    ADD CONSTRAINT collection_jobs_soldier_id_fkey FOREIGN KEY (soldier_id) REFERENCES public.soldiers(soldier_id) ON DELETE CASCADE;


--
-- Name: collection_state collection_state_soldier_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.collection_state
    ADD CONSTRAINT collection_state_soldier_id_fkey FOREIGN KEY (soldier_id) REFERENCES public.soldiers(soldier_id) ON DELETE CASCADE;


--
-- Name: collector_secrets collector_secrets_collector_uuid_fkey; Type: FK CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.collector_secrets
    ADD CONSTRAINT collector_secrets_collector_uuid_fkey FOREIGN KEY (collector_uuid) REFERENCES public.collectors(collector_uuid) ON DELETE CASCADE;


--
-- Name: detailed_stats_current detailed_stats_current_soldier_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.detailed_stats_current
    ADD CONSTRAINT detailed_stats_current_soldier_id_fkey FOREIGN KEY (soldier_id) REFERENCES public.soldiers(soldier_id) ON DELETE CASCADE;


--
-- Name: detailed_stats_history detailed_stats_history_soldier_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.detailed_stats_history
    ADD CONSTRAINT detailed_stats_history_soldier_id_fkey FOREIGN KEY (soldier_id) REFERENCES public.soldiers(soldier_id) ON DELETE CASCADE;


--
-- Name: collectors fk_collectors_current_job; Type: FK CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.collectors
    ADD CONSTRAINT fk_collectors_current_job FOREIGN KEY (current_job_id) REFERENCES public.collection_jobs(job_id) ON DELETE SET NULL;


--
-- Name: profile_soldiers profile_soldiers_profile_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.profile_soldiers
    ADD CONSTRAINT profile_soldiers_profile_id_fkey FOREIGN KEY (profile_id) REFERENCES public.battlelog_profiles(profile_id) ON DELETE CASCADE;


--
-- Name: profile_soldiers profile_soldiers_soldier_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.profile_soldiers
    ADD CONSTRAINT profile_soldiers_soldier_id_fkey FOREIGN KEY (soldier_id) REFERENCES public.soldiers(soldier_id) ON DELETE CASCADE;


--
-- Name: soldier_names soldier_names_soldier_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.soldier_names
    ADD CONSTRAINT soldier_names_soldier_id_fkey FOREIGN KEY (soldier_id) REFERENCES public.soldiers(soldier_id) ON DELETE CASCADE;


--
-- Name: soldier_sources soldier_sources_soldier_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.soldier_sources
    ADD CONSTRAINT soldier_sources_soldier_id_fkey FOREIGN KEY (soldier_id) REFERENCES public.soldiers(soldier_id) ON DELETE CASCADE;


--
-- Name: soldier_vehicle_stats soldier_vehicle_stats_soldier_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.soldier_vehicle_stats
    ADD CONSTRAINT soldier_vehicle_stats_soldier_id_fkey FOREIGN KEY (soldier_id) REFERENCES public.soldiers(soldier_id) ON DELETE CASCADE;


--
-- Name: soldier_vehicle_stats soldier_vehicle_stats_vehicle_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.soldier_vehicle_stats
    ADD CONSTRAINT soldier_vehicle_stats_vehicle_id_fkey FOREIGN KEY (vehicle_id) REFERENCES public.vehicle_catalog(vehicle_id) ON DELETE CASCADE;


--
-- Name: soldier_weapon_stats soldier_weapon_stats_soldier_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.soldier_weapon_stats
    ADD CONSTRAINT soldier_weapon_stats_soldier_id_fkey FOREIGN KEY (soldier_id) REFERENCES public.soldiers(soldier_id) ON DELETE CASCADE;


--
-- Name: soldier_weapon_stats soldier_weapon_stats_weapon_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: <migrator>
--

ALTER TABLE ONLY public.soldier_weapon_stats
    ADD CONSTRAINT soldier_weapon_stats_weapon_id_fkey FOREIGN KEY (weapon_id) REFERENCES public.weapon_catalog(weapon_id) ON DELETE CASCADE;


--
-- Name: SCHEMA public; Type: ACL; Schema: -; Owner: pg_database_owner
--

GRANT USAGE ON SCHEMA public TO bf4ps_definer;
GRANT USAGE ON SCHEMA public TO bf4ps_collector;
GRANT USAGE ON SCHEMA public TO bf4ps_website;
GRANT USAGE ON SCHEMA public TO bf4ps_reader;


--
-- Name: FUNCTION bf4ps_check_document(p_resource text, p_data jsonb, p_now timestamp with time zone); Type: ACL; Schema: public; Owner: <migrator>
--

REVOKE ALL ON FUNCTION public.bf4ps_check_document(p_resource text, p_data jsonb, p_now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION public.bf4ps_check_document(p_resource text, p_data jsonb, p_now timestamp with time zone) TO bf4ps_definer;


--
-- Name: FUNCTION bf4ps_claim_job(p_uuid uuid, p_start boolean, p_now timestamp with time zone); Type: ACL; Schema: public; Owner: <migrator>
--

REVOKE ALL ON FUNCTION public.bf4ps_claim_job(p_uuid uuid, p_start boolean, p_now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION public.bf4ps_claim_job(p_uuid uuid, p_start boolean, p_now timestamp with time zone) TO bf4ps_definer;


--
-- Name: FUNCTION bf4ps_collector_check_secret(p_uuid uuid, p_secret uuid); Type: ACL; Schema: public; Owner: bf4ps_definer
--

REVOKE ALL ON FUNCTION public.bf4ps_collector_check_secret(p_uuid uuid, p_secret uuid) FROM PUBLIC;


--
-- Name: FUNCTION bf4ps_collector_claim(p_uuid uuid, p_secret uuid, p_protocol integer, p_start boolean); Type: ACL; Schema: public; Owner: bf4ps_definer
--

REVOKE ALL ON FUNCTION public.bf4ps_collector_claim(p_uuid uuid, p_secret uuid, p_protocol integer, p_start boolean) FROM PUBLIC;
GRANT ALL ON FUNCTION public.bf4ps_collector_claim(p_uuid uuid, p_secret uuid, p_protocol integer, p_start boolean) TO bf4ps_collector;


--
-- Name: FUNCTION bf4ps_collector_fail(p_uuid uuid, p_secret uuid, p_job_id bigint, p_lease_token uuid, p_error_class text, p_http_status integer, p_message text, p_duration_ms bigint); Type: ACL; Schema: public; Owner: bf4ps_definer
--

REVOKE ALL ON FUNCTION public.bf4ps_collector_fail(p_uuid uuid, p_secret uuid, p_job_id bigint, p_lease_token uuid, p_error_class text, p_http_status integer, p_message text, p_duration_ms bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION public.bf4ps_collector_fail(p_uuid uuid, p_secret uuid, p_job_id bigint, p_lease_token uuid, p_error_class text, p_http_status integer, p_message text, p_duration_ms bigint) TO bf4ps_collector;


--
-- Name: FUNCTION bf4ps_collector_heartbeat(p_uuid uuid, p_secret uuid); Type: ACL; Schema: public; Owner: bf4ps_definer
--

REVOKE ALL ON FUNCTION public.bf4ps_collector_heartbeat(p_uuid uuid, p_secret uuid) FROM PUBLIC;
GRANT ALL ON FUNCTION public.bf4ps_collector_heartbeat(p_uuid uuid, p_secret uuid) TO bf4ps_collector;


--
-- Name: FUNCTION bf4ps_collector_next_eligible(p_uuid uuid, p_secret uuid); Type: ACL; Schema: public; Owner: bf4ps_definer
--

REVOKE ALL ON FUNCTION public.bf4ps_collector_next_eligible(p_uuid uuid, p_secret uuid) FROM PUBLIC;
GRANT ALL ON FUNCTION public.bf4ps_collector_next_eligible(p_uuid uuid, p_secret uuid) TO bf4ps_collector;


--
-- Name: FUNCTION bf4ps_collector_register(p_name text, p_hostname text, p_lane text, p_egress_key text, p_software_version text); Type: ACL; Schema: public; Owner: bf4ps_definer
--

REVOKE ALL ON FUNCTION public.bf4ps_collector_register(p_name text, p_hostname text, p_lane text, p_egress_key text, p_software_version text) FROM PUBLIC;
GRANT ALL ON FUNCTION public.bf4ps_collector_register(p_name text, p_hostname text, p_lane text, p_egress_key text, p_software_version text) TO bf4ps_collector;


--
-- Name: FUNCTION bf4ps_collector_renew(p_uuid uuid, p_secret uuid, p_job_id bigint, p_lease_token uuid); Type: ACL; Schema: public; Owner: bf4ps_definer
--

REVOKE ALL ON FUNCTION public.bf4ps_collector_renew(p_uuid uuid, p_secret uuid, p_job_id bigint, p_lease_token uuid) FROM PUBLIC;
GRANT ALL ON FUNCTION public.bf4ps_collector_renew(p_uuid uuid, p_secret uuid, p_job_id bigint, p_lease_token uuid) TO bf4ps_collector;


--
-- Name: FUNCTION bf4ps_collector_start(p_uuid uuid, p_secret uuid, p_job_id bigint, p_lease_token uuid); Type: ACL; Schema: public; Owner: bf4ps_definer
--

REVOKE ALL ON FUNCTION public.bf4ps_collector_start(p_uuid uuid, p_secret uuid, p_job_id bigint, p_lease_token uuid) FROM PUBLIC;
GRANT ALL ON FUNCTION public.bf4ps_collector_start(p_uuid uuid, p_secret uuid, p_job_id bigint, p_lease_token uuid) TO bf4ps_collector;


--
-- Name: FUNCTION bf4ps_collector_stopped(p_uuid uuid, p_secret uuid); Type: ACL; Schema: public; Owner: bf4ps_definer
--

REVOKE ALL ON FUNCTION public.bf4ps_collector_stopped(p_uuid uuid, p_secret uuid) FROM PUBLIC;
GRANT ALL ON FUNCTION public.bf4ps_collector_stopped(p_uuid uuid, p_secret uuid) TO bf4ps_collector;


--
-- Name: FUNCTION bf4ps_collector_succeed(p_uuid uuid, p_secret uuid, p_job_id bigint, p_lease_token uuid, p_data jsonb, p_duration_ms bigint, p_http_status integer); Type: ACL; Schema: public; Owner: bf4ps_definer
--

REVOKE ALL ON FUNCTION public.bf4ps_collector_succeed(p_uuid uuid, p_secret uuid, p_job_id bigint, p_lease_token uuid, p_data jsonb, p_duration_ms bigint, p_http_status integer) FROM PUBLIC;
GRANT ALL ON FUNCTION public.bf4ps_collector_succeed(p_uuid uuid, p_secret uuid, p_job_id bigint, p_lease_token uuid, p_data jsonb, p_duration_ms bigint, p_http_status integer) TO bf4ps_collector;


--
-- Name: TABLE collector_secrets; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT,INSERT ON TABLE public.collector_secrets TO bf4ps_definer;


--
-- Name: TABLE collectors; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT,INSERT,UPDATE ON TABLE public.collectors TO bf4ps_definer;
GRANT SELECT ON TABLE public.collectors TO bf4ps_reader;


--
-- Name: TABLE scheduling_settings; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT ON TABLE public.scheduling_settings TO bf4ps_definer;
GRANT SELECT ON TABLE public.scheduling_settings TO bf4ps_reader;


--
-- Name: FUNCTION bf4ps_live_collectors(p_lane text, p_at timestamp with time zone); Type: ACL; Schema: public; Owner: <migrator>
--

REVOKE ALL ON FUNCTION public.bf4ps_live_collectors(p_lane text, p_at timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION public.bf4ps_live_collectors(p_lane text, p_at timestamp with time zone) TO bf4ps_definer;


--
-- Name: TABLE egress_gates; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT,INSERT,UPDATE ON TABLE public.egress_gates TO bf4ps_definer;
GRANT SELECT ON TABLE public.egress_gates TO bf4ps_reader;


--
-- Name: TABLE egress_hosts; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT,INSERT,UPDATE ON TABLE public.egress_hosts TO bf4ps_definer;
GRANT SELECT ON TABLE public.egress_hosts TO bf4ps_reader;


--
-- Name: FUNCTION bf4ps_egress_budget_newcomer(p_host text, p_at timestamp with time zone, p_budget_spacing interval); Type: ACL; Schema: public; Owner: <migrator>
--

REVOKE ALL ON FUNCTION public.bf4ps_egress_budget_newcomer(p_host text, p_at timestamp with time zone, p_budget_spacing interval) FROM PUBLIC;
GRANT ALL ON FUNCTION public.bf4ps_egress_budget_newcomer(p_host text, p_at timestamp with time zone, p_budget_spacing interval) TO bf4ps_definer;


--
-- Name: FUNCTION bf4ps_egress_gate(p_key text, p_host text, p_budget_spacing interval, p_interactive boolean, p_now timestamp with time zone, OUT claim_at timestamp with time zone, OUT go_at timestamp with time zone, OUT paused boolean, OUT entitled boolean, OUT locked boolean); Type: ACL; Schema: public; Owner: <migrator>
--

REVOKE ALL ON FUNCTION public.bf4ps_egress_gate(p_key text, p_host text, p_budget_spacing interval, p_interactive boolean, p_now timestamp with time zone, OUT claim_at timestamp with time zone, OUT go_at timestamp with time zone, OUT paused boolean, OUT entitled boolean, OUT locked boolean) FROM PUBLIC;
GRANT ALL ON FUNCTION public.bf4ps_egress_gate(p_key text, p_host text, p_budget_spacing interval, p_interactive boolean, p_now timestamp with time zone, OUT claim_at timestamp with time zone, OUT go_at timestamp with time zone, OUT paused boolean, OUT entitled boolean, OUT locked boolean) TO bf4ps_definer;


--
-- Name: FUNCTION bf4ps_egress_newcomer(p_host text, p_at timestamp with time zone); Type: ACL; Schema: public; Owner: <migrator>
--

REVOKE ALL ON FUNCTION public.bf4ps_egress_newcomer(p_host text, p_at timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION public.bf4ps_egress_newcomer(p_host text, p_at timestamp with time zone) TO bf4ps_definer;


--
-- Name: FUNCTION bf4ps_egress_spend(p_key text, p_host text, p_spacing interval, p_budget_spacing interval, p_interactive boolean, p_entitled boolean, p_at timestamp with time zone); Type: ACL; Schema: public; Owner: <migrator>
--

REVOKE ALL ON FUNCTION public.bf4ps_egress_spend(p_key text, p_host text, p_spacing interval, p_budget_spacing interval, p_interactive boolean, p_entitled boolean, p_at timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION public.bf4ps_egress_spend(p_key text, p_host text, p_spacing interval, p_budget_spacing interval, p_interactive boolean, p_entitled boolean, p_at timestamp with time zone) TO bf4ps_definer;


--
-- Name: FUNCTION bf4ps_eta_schedule(p_jobs bigint[], p_window interval, p_egress_rate double precision); Type: ACL; Schema: public; Owner: <migrator>
--

REVOKE ALL ON FUNCTION public.bf4ps_eta_schedule(p_jobs bigint[], p_window interval, p_egress_rate double precision) FROM PUBLIC;
GRANT ALL ON FUNCTION public.bf4ps_eta_schedule(p_jobs bigint[], p_window interval, p_egress_rate double precision) TO bf4ps_definer;


--
-- Name: FUNCTION bf4ps_fail_job(p_uuid uuid, p_job_id bigint, p_lease_token uuid, p_error_class text, p_http_status integer, p_message text, p_duration_ms bigint, p_now timestamp with time zone); Type: ACL; Schema: public; Owner: <migrator>
--

REVOKE ALL ON FUNCTION public.bf4ps_fail_job(p_uuid uuid, p_job_id bigint, p_lease_token uuid, p_error_class text, p_http_status integer, p_message text, p_duration_ms bigint, p_now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION public.bf4ps_fail_job(p_uuid uuid, p_job_id bigint, p_lease_token uuid, p_error_class text, p_http_status integer, p_message text, p_duration_ms bigint, p_now timestamp with time zone) TO bf4ps_definer;


--
-- Name: FUNCTION bf4ps_feeder_row_changed(); Type: ACL; Schema: public; Owner: bf4ps_definer
--

REVOKE ALL ON FUNCTION public.bf4ps_feeder_row_changed() FROM PUBLIC;


--
-- Name: FUNCTION bf4ps_feeder_rows_changed(); Type: ACL; Schema: public; Owner: bf4ps_definer
--

REVOKE ALL ON FUNCTION public.bf4ps_feeder_rows_changed() FROM PUBLIC;


--
-- Name: FUNCTION bf4ps_feeder_sync(p_ids bigint[]); Type: ACL; Schema: public; Owner: bf4ps_definer
--

REVOKE ALL ON FUNCTION public.bf4ps_feeder_sync(p_ids bigint[]) FROM PUBLIC;


--
-- Name: FUNCTION bf4ps_feeder_truncated(); Type: ACL; Schema: public; Owner: bf4ps_definer
--

REVOKE ALL ON FUNCTION public.bf4ps_feeder_truncated() FROM PUBLIC;


--
-- Name: FUNCTION bf4ps_freshness_deleted(); Type: ACL; Schema: public; Owner: bf4ps_definer
--

REVOKE ALL ON FUNCTION public.bf4ps_freshness_deleted() FROM PUBLIC;


--
-- Name: FUNCTION bf4ps_freshness_inserted(); Type: ACL; Schema: public; Owner: bf4ps_definer
--

REVOKE ALL ON FUNCTION public.bf4ps_freshness_inserted() FROM PUBLIC;


--
-- Name: FUNCTION bf4ps_freshness_moved(); Type: ACL; Schema: public; Owner: bf4ps_definer
--

REVOKE ALL ON FUNCTION public.bf4ps_freshness_moved() FROM PUBLIC;


--
-- Name: FUNCTION bf4ps_freshness_truncated(); Type: ACL; Schema: public; Owner: bf4ps_definer
--

REVOKE ALL ON FUNCTION public.bf4ps_freshness_truncated() FROM PUBLIC;


--
-- Name: FUNCTION bf4ps_record_outcome(p_soldier_id bigint, p_resource text, p_state text, p_success boolean, p_next_due_at timestamp with time zone, p_failures integer, p_error_class text, p_error_message text, p_now timestamp with time zone); Type: ACL; Schema: public; Owner: <migrator>
--

REVOKE ALL ON FUNCTION public.bf4ps_record_outcome(p_soldier_id bigint, p_resource text, p_state text, p_success boolean, p_next_due_at timestamp with time zone, p_failures integer, p_error_class text, p_error_message text, p_now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION public.bf4ps_record_outcome(p_soldier_id bigint, p_resource text, p_state text, p_success boolean, p_next_due_at timestamp with time zone, p_failures integer, p_error_class text, p_error_message text, p_now timestamp with time zone) TO bf4ps_definer;


--
-- Name: FUNCTION bf4ps_request_refresh(platform text, persona_id bigint, resources text[], eta_window interval, egress_rate double precision, soldier_name text); Type: ACL; Schema: public; Owner: bf4ps_definer
--

REVOKE ALL ON FUNCTION public.bf4ps_request_refresh(platform text, persona_id bigint, resources text[], eta_window interval, egress_rate double precision, soldier_name text) FROM PUBLIC;
GRANT ALL ON FUNCTION public.bf4ps_request_refresh(platform text, persona_id bigint, resources text[], eta_window interval, egress_rate double precision, soldier_name text) TO bf4ps_website;


--
-- Name: FUNCTION bf4ps_store_detailed(p_soldier_id bigint, p_persona_id bigint, p_data jsonb, p_now timestamp with time zone, OUT changed boolean, OUT history_appended boolean); Type: ACL; Schema: public; Owner: <migrator>
--

REVOKE ALL ON FUNCTION public.bf4ps_store_detailed(p_soldier_id bigint, p_persona_id bigint, p_data jsonb, p_now timestamp with time zone, OUT changed boolean, OUT history_appended boolean) FROM PUBLIC;
GRANT ALL ON FUNCTION public.bf4ps_store_detailed(p_soldier_id bigint, p_persona_id bigint, p_data jsonb, p_now timestamp with time zone, OUT changed boolean, OUT history_appended boolean) TO bf4ps_definer;


--
-- Name: FUNCTION bf4ps_store_profile(p_soldier_id bigint, p_current_name text, p_data jsonb, p_now timestamp with time zone, OUT changed boolean); Type: ACL; Schema: public; Owner: <migrator>
--

REVOKE ALL ON FUNCTION public.bf4ps_store_profile(p_soldier_id bigint, p_current_name text, p_data jsonb, p_now timestamp with time zone, OUT changed boolean) FROM PUBLIC;
GRANT ALL ON FUNCTION public.bf4ps_store_profile(p_soldier_id bigint, p_current_name text, p_data jsonb, p_now timestamp with time zone, OUT changed boolean) TO bf4ps_definer;


--
-- Name: FUNCTION bf4ps_store_vehicles(p_soldier_id bigint, p_data jsonb, p_now timestamp with time zone, OUT changed boolean); Type: ACL; Schema: public; Owner: <migrator>
--

REVOKE ALL ON FUNCTION public.bf4ps_store_vehicles(p_soldier_id bigint, p_data jsonb, p_now timestamp with time zone, OUT changed boolean) FROM PUBLIC;
GRANT ALL ON FUNCTION public.bf4ps_store_vehicles(p_soldier_id bigint, p_data jsonb, p_now timestamp with time zone, OUT changed boolean) TO bf4ps_definer;


--
-- Name: FUNCTION bf4ps_store_weapons(p_soldier_id bigint, p_data jsonb, p_now timestamp with time zone, OUT changed boolean); Type: ACL; Schema: public; Owner: <migrator>
--

REVOKE ALL ON FUNCTION public.bf4ps_store_weapons(p_soldier_id bigint, p_data jsonb, p_now timestamp with time zone, OUT changed boolean) FROM PUBLIC;
GRANT ALL ON FUNCTION public.bf4ps_store_weapons(p_soldier_id bigint, p_data jsonb, p_now timestamp with time zone, OUT changed boolean) TO bf4ps_definer;


--
-- Name: FUNCTION bf4ps_succeed_job(p_uuid uuid, p_job_id bigint, p_lease_token uuid, p_data jsonb, p_duration_ms bigint, p_http_status integer, p_now timestamp with time zone); Type: ACL; Schema: public; Owner: <migrator>
--

REVOKE ALL ON FUNCTION public.bf4ps_succeed_job(p_uuid uuid, p_job_id bigint, p_lease_token uuid, p_data jsonb, p_duration_ms bigint, p_http_status integer, p_now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION public.bf4ps_succeed_job(p_uuid uuid, p_job_id bigint, p_lease_token uuid, p_data jsonb, p_duration_ms bigint, p_http_status integer, p_now timestamp with time zone) TO bf4ps_definer;


--
-- Name: TABLE _sqlx_migrations; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT ON TABLE public._sqlx_migrations TO bf4ps_collector;
GRANT SELECT ON TABLE public._sqlx_migrations TO bf4ps_reader;


--
-- Name: TABLE activity_summary; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT ON TABLE public.activity_summary TO bf4ps_reader;


--
-- Name: TABLE battlelog_profiles; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT,INSERT,UPDATE ON TABLE public.battlelog_profiles TO bf4ps_definer;
GRANT SELECT ON TABLE public.battlelog_profiles TO bf4ps_reader;


--
-- Name: TABLE bf4ps_locks; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT,UPDATE ON TABLE public.bf4ps_locks TO bf4ps_definer;


--
-- Name: TABLE bf4ps_schema_source_sets; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT ON TABLE public.bf4ps_schema_source_sets TO bf4ps_reader;


--
-- Name: TABLE bf4ps_schema_sources; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT ON TABLE public.bf4ps_schema_sources TO bf4ps_collector;
GRANT SELECT ON TABLE public.bf4ps_schema_sources TO bf4ps_reader;


--
-- Name: TABLE budget_usage; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.budget_usage TO bf4ps_definer;
GRANT SELECT ON TABLE public.budget_usage TO bf4ps_reader;


--
-- Name: TABLE collection_events; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT,INSERT ON TABLE public.collection_events TO bf4ps_definer;
GRANT SELECT ON TABLE public.collection_events TO bf4ps_reader;


--
-- Name: TABLE collection_jobs; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.collection_jobs TO bf4ps_definer;
GRANT SELECT ON TABLE public.collection_jobs TO bf4ps_reader;


--
-- Name: TABLE collection_state; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT,INSERT,UPDATE ON TABLE public.collection_state TO bf4ps_definer;
GRANT SELECT ON TABLE public.collection_state TO bf4ps_reader;


--
-- Name: TABLE detailed_stats_current; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT,INSERT,UPDATE ON TABLE public.detailed_stats_current TO bf4ps_definer;
GRANT SELECT ON TABLE public.detailed_stats_current TO bf4ps_reader;


--
-- Name: TABLE detailed_stats_history; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT,INSERT ON TABLE public.detailed_stats_history TO bf4ps_definer;
GRANT SELECT ON TABLE public.detailed_stats_history TO bf4ps_reader;


--
-- Name: TABLE discovery_state; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT ON TABLE public.discovery_state TO bf4ps_reader;


--
-- Name: TABLE egress_budget; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT,INSERT,UPDATE ON TABLE public.egress_budget TO bf4ps_definer;
GRANT SELECT ON TABLE public.egress_budget TO bf4ps_reader;


--
-- Name: TABLE event_rollup_hourly; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT ON TABLE public.event_rollup_hourly TO bf4ps_reader;


--
-- Name: TABLE feeder_pairs; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.feeder_pairs TO bf4ps_definer;
GRANT SELECT ON TABLE public.feeder_pairs TO bf4ps_reader;


--
-- Name: TABLE feeder_usage; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT ON TABLE public.feeder_usage TO bf4ps_reader;


--
-- Name: TABLE freshness_bands; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT,INSERT,DELETE ON TABLE public.freshness_bands TO bf4ps_definer;
GRANT SELECT ON TABLE public.freshness_bands TO bf4ps_reader;


--
-- Name: TABLE freshness_deltas; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT,INSERT,DELETE ON TABLE public.freshness_deltas TO bf4ps_definer;
GRANT SELECT ON TABLE public.freshness_deltas TO bf4ps_reader;


--
-- Name: TABLE freshness_rollup; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT,INSERT,DELETE ON TABLE public.freshness_rollup TO bf4ps_definer;
GRANT SELECT ON TABLE public.freshness_rollup TO bf4ps_reader;


--
-- Name: TABLE outbound_dispatches; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT ON TABLE public.outbound_dispatches TO bf4ps_reader;


--
-- Name: TABLE profile_soldiers; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT,INSERT,UPDATE ON TABLE public.profile_soldiers TO bf4ps_definer;
GRANT SELECT ON TABLE public.profile_soldiers TO bf4ps_reader;


--
-- Name: TABLE projector_checkpoint; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT ON TABLE public.projector_checkpoint TO bf4ps_reader;


--
-- Name: TABLE projector_quarantine; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT ON TABLE public.projector_quarantine TO bf4ps_reader;


--
-- Name: TABLE request_gates; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT ON TABLE public.request_gates TO bf4ps_reader;


--
-- Name: TABLE retention_runs; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT ON TABLE public.retention_runs TO bf4ps_reader;


--
-- Name: TABLE soldier_names; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT,INSERT,UPDATE ON TABLE public.soldier_names TO bf4ps_definer;
GRANT SELECT ON TABLE public.soldier_names TO bf4ps_reader;


--
-- Name: TABLE soldier_sources; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT,INSERT,UPDATE ON TABLE public.soldier_sources TO bf4ps_definer;
GRANT SELECT ON TABLE public.soldier_sources TO bf4ps_reader;


--
-- Name: TABLE soldier_vehicle_stats; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT,INSERT,DELETE ON TABLE public.soldier_vehicle_stats TO bf4ps_definer;
GRANT SELECT ON TABLE public.soldier_vehicle_stats TO bf4ps_reader;


--
-- Name: TABLE soldier_weapon_stats; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT,INSERT,DELETE ON TABLE public.soldier_weapon_stats TO bf4ps_definer;
GRANT SELECT ON TABLE public.soldier_weapon_stats TO bf4ps_reader;


--
-- Name: TABLE soldiers; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT,INSERT,UPDATE ON TABLE public.soldiers TO bf4ps_definer;
GRANT SELECT ON TABLE public.soldiers TO bf4ps_reader;


--
-- Name: TABLE stage9c_supervision_runs; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT ON TABLE public.stage9c_supervision_runs TO bf4ps_reader;


--
-- Name: TABLE vehicle_catalog; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT,INSERT,UPDATE ON TABLE public.vehicle_catalog TO bf4ps_definer;
GRANT SELECT ON TABLE public.vehicle_catalog TO bf4ps_reader;


--
-- Name: TABLE weapon_catalog; Type: ACL; Schema: public; Owner: <migrator>
--

GRANT SELECT,INSERT,UPDATE ON TABLE public.weapon_catalog TO bf4ps_definer;
GRANT SELECT ON TABLE public.weapon_catalog TO bf4ps_reader;


--
-- PostgreSQL database dump complete
--


