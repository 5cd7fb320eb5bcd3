-- Interactive refresh of one soldier, for the website (inside its own
-- transaction) and `bf4ps-ops request` (0004, 0006; now on BF4PS's tables).
--
-- The soldier is written as BF4PS writes a manual submission: an unknown one
-- is created with `soldier_name` (required for it: the website passes the
-- name from the Battlelog soldier URL; SQLSTATE 22023 without one) as
-- current_name, first and last seen now, a soldier_names row and source
-- 'manual'; a known one gets its 'manual' source row refreshed and nothing
-- else: a name passed for it changes nothing (0019: discovery and BF4PS's
-- own sources own names; the website asks, it never renames). Its default
-- collection_state row is created if missing. Then per requested resource
-- (canonical order detailed, profile, weapons, vehicles):
--   * no live job, a success less than scheduling_settings.interactive_cooldown
--     ago                 -> nothing queued                     (state 'fresh')
--   * no live job         -> a new interactive job, `created`  (state 'created')
--   * pending background  -> promoted to the interactive lane and class,
--                            eligible now, `promoted`            (state 'promoted')
--   * pending interactive -> left alone                          (state 'pending')
--   * claimed / running   -> left alone                          (state 'claimed' | 'running')
-- Calling it again changes nothing. New and promoted jobs wake interactive
-- collectors when the caller commits.
--
-- Admission: a call that added pending interactive jobs takes the row lock
-- bf4ps_locks 'interactive_admission' (no role but ours can hold it) and
-- counts the pending interactive jobs; beyond
-- scheduling_settings.max_pending_interactive it raises SQLSTATE 53400 and
-- nothing it wrote survives. Concurrent admissions are serialized from that
-- count until the caller commits (call it in a short transaction); a call
-- waits at most 2 s for the lock, then fails with SQLSTATE 55P03
-- (lock_not_available), writing nothing.
--
-- position: 1-based place among pending interactive jobs in claim order, 0
-- for claimed/running. eta_seconds: the job's ETA in the interactive lane's
-- simulated schedule (bf4ps_eta_schedule: per-resource service times
-- learned from outcomes within eta_window, the live collectors, the egress
-- key spacing 1 / egress_rate); NULL when no interactive collector can take
-- a pending job. Both NULL for a fresh one (job_id NULL too).
-- last_success_at: the pair's last success (NULL: never), whatever the state.
-- Errors (22023): unknown platform or resource, empty resource list,
-- persona_id <= 0, a bad eta_window/egress_rate, a bad or missing name.
-- It runs with its owner's rights: the website's role needs only EXECUTE.
--
-- Generic plans (plan_cache_mode, reaching bf4ps_eta_schedule): PostgreSQL
-- planned four of its statements anew at every call (pgbench, a small
-- database: 2.9 ms a call, 1.5 ms with generic plans).
--
-- owner: bf4ps_definer
-- execute: bf4ps_website
CREATE OR REPLACE FUNCTION @schema@.bf4ps_request_refresh(
    platform text,
    persona_id bigint,
    resources text[] DEFAULT ARRAY['detailed', 'profile', 'weapons', 'vehicles'],
    eta_window interval DEFAULT NULL,
    egress_rate double precision DEFAULT NULL,
    soldier_name text DEFAULT NULL
) RETURNS TABLE (
    resource text,
    job_id bigint,
    state text,
    "position" bigint,
    eta_seconds double precision,
    last_success_at timestamptz
)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
SET plan_cache_mode = force_generic_plan
AS $fn$
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
       AND NOT @schema@.bf4ps_name_ok(bf4ps_request_refresh.soldier_name, 200) THEN
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
    FROM @schema@.scheduling_settings AS s;
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
    FROM @schema@.soldiers AS s
    WHERE s.persona_id = v_persona AND s.platform = v_platform;
    IF v_soldier IS NULL AND v_name IS NULL THEN
        RAISE EXCEPTION 'soldier %/% is not known yet: pass its name (soldier_name)',
                v_platform, v_persona
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_soldier IS NULL THEN
        INSERT INTO @schema@.soldiers AS s
            (persona_id, platform, current_name, first_seen_at, last_seen_at)
        VALUES (v_persona, v_platform, v_name, now(), now())
        ON CONFLICT (persona_id, platform) DO UPDATE
        -- Created concurrently: known now, so not renamed.
        SET first_seen_at = least(s.first_seen_at, EXCLUDED.first_seen_at),
            last_seen_at = greatest(s.last_seen_at, EXCLUDED.last_seen_at),
            updated_at = now()
        RETURNING s.soldier_id INTO v_soldier;
        INSERT INTO @schema@.soldier_names AS n (soldier_id, name, first_seen_at, last_seen_at)
        VALUES (v_soldier, v_name, now(), now())
        ON CONFLICT (soldier_id, name) DO UPDATE
        SET first_seen_at = least(n.first_seen_at, EXCLUDED.first_seen_at),
            last_seen_at = greatest(n.last_seen_at, EXCLUDED.last_seen_at);
    ELSE
        UPDATE @schema@.soldiers AS s
        SET last_seen_at = greatest(s.last_seen_at, now()), updated_at = now()
        WHERE s.soldier_id = v_soldier;
    END IF;
    INSERT INTO @schema@.soldier_sources AS o (soldier_id, source_type, first_seen_at, last_seen_at)
    VALUES (v_soldier, 'manual', now(), now())
    ON CONFLICT (soldier_id, source_type) DO UPDATE
    SET first_seen_at = least(o.first_seen_at, EXCLUDED.first_seen_at),
        last_seen_at = greatest(o.last_seen_at, EXCLUDED.last_seen_at);
    INSERT INTO @schema@.collection_state (soldier_id) VALUES (v_soldier)
    ON CONFLICT (soldier_id) DO NOTHING;

    -- One job per resource. A job can be finalized (deleted) or fed between
    -- our statements; each pass re-reads and settles within a few tries.
    FOREACH v_resource IN ARRAY v_wanted LOOP
        v_settled := false;
        SELECT @schema@.bf4ps_sane_time(CASE v_resource
                   WHEN 'detailed' THEN cs.detailed_last_success_at
                   WHEN 'profile' THEN cs.profile_last_success_at
                   WHEN 'weapons' THEN cs.weapons_last_success_at
                   WHEN 'vehicles' THEN cs.vehicles_last_success_at END)
          INTO v_last
        FROM @schema@.collection_state AS cs WHERE cs.soldier_id = v_soldier;
        FOR attempt IN 1..5 LOOP
            SELECT j.job_id, j.status, j.lane, j.priority_class, j.attempt_count
              INTO v_job, v_status, v_lane, v_class, v_attempts
            FROM @schema@.collection_jobs AS j
            WHERE j.soldier_id = v_soldier AND j.resource = v_resource;

            IF NOT FOUND AND v_last > now() - v_cooldown THEN
                -- Fetched moments ago: answered as fresh, nothing spent.
                v_job := NULL;
                v_state := 'fresh';
                v_settled := true;
            ELSIF NOT FOUND THEN
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
        v_lasts := v_lasts || v_last;
    END LOOP;

    -- Admission: every call that added pending interactive jobs counts them
    -- under one row lock held until its caller commits, so concurrent
    -- callers see each other's admissions and the cap is exact.
    IF v_admitted > 0 THEN
        v_lock_timeout := current_setting('lock_timeout');
        PERFORM set_config('lock_timeout', '2s', true);
        PERFORM 1 FROM @schema@.bf4ps_locks AS l
        WHERE l.lock_name = 'interactive_admission' FOR UPDATE;
        PERFORM set_config('lock_timeout', v_lock_timeout, true);
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

    -- The ETAs: the interactive lane's schedule, simulated once per call.
    SELECT array_agg(x.eta_seconds ORDER BY x.n) INTO v_etas
    FROM @schema@.bf4ps_eta_schedule(v_jobs, v_window, v_rate)
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
            FROM @schema@.collection_jobs AS me, @schema@.collection_jobs AS o
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
$fn$;
