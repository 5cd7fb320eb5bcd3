-- 0004: scheduling — what interactive refresh requests need in SQL, so the
-- website can call them inside its own transaction.
--   * scheduling_settings: the ETA inputs the website cannot know (published
--     by `serve`'s feeder from its runtime configuration);
--   * ix_collection_events_interactive_finished: recent interactive outcome
--     durations without scanning background events;
--   * bf4ps_eta_seconds(): the ETA formula, in one place (IMMUTABLE);
--   * bf4ps_request_refresh(): create or promote interactive jobs, with
--     queue position and ETA.
--
-- RELEASED once merged: never edit this file. Add a new migration instead.

-- One row. `serve` (the feeder) overwrites it at start with its effective
-- BF4PS_ETA_WINDOW and BF4PS_EGRESS_RATE; until then the defaults below hold.
-- Arguments of bf4ps_request_refresh() override it per call.
CREATE TABLE scheduling_settings (
    singleton boolean PRIMARY KEY DEFAULT true,
    -- Window of interactive succeeded/failed events the ETA learns from.
    eta_window interval NOT NULL DEFAULT interval '15 minutes',
    -- Battlelog requests per second per egress key.
    egress_rate double precision NOT NULL DEFAULT 5,
    updated_at timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT scheduling_settings_singleton CHECK (singleton),
    CONSTRAINT scheduling_settings_eta_window_check CHECK (eta_window > interval '0'),
    -- NaN compares greater than Infinity in PostgreSQL, so this rejects it too.
    CONSTRAINT scheduling_settings_egress_rate_check
        CHECK (egress_rate > 0 AND egress_rate < 'Infinity'::double precision)
);

INSERT INTO scheduling_settings DEFAULT VALUES;

-- Mean interactive duration: a handful of rows per ETA window, never the
-- background lane's outcome stream.
CREATE INDEX ix_collection_events_interactive_finished
    ON collection_events (occurred_at DESC)
    WHERE lane = 'interactive' AND event_type IN ('succeeded', 'failed');

-- The ETA, in seconds, of the job at `queue_position` among pending
-- interactive jobs in claim order (1 = claimed next; 0 = already claimed or
-- running). Completion of the job is bounded below by two things:
--   * collector parallelism: ceil(position / collectors) rounds of one mean
--     job duration each;
--   * the egress rate: the (position - 1) requests ahead of it are spaced
--     1/egress_rate apart, then it takes one mean duration itself.
-- The estimate is the larger of the two.
-- Inputs are sanitised rather than rejected, so the answer is always finite
-- and >= 0 or NULL:
--   * NULL position, or NULL / <= 0 healthy collectors -> NULL ("no collector
--     can take it now");
--   * position < 1 counts as 1 (in flight: about one mean duration left);
--   * mean duration NULL, negative, NaN or infinite -> 2 s (no recent
--     interactive outcomes); capped at 1 h;
--   * egress rate NULL, <= 0, NaN or infinite -> no rate term; floored at
--     1e-6 requests/s.
-- Monotone: non-decreasing in position, non-increasing in collectors and in
-- egress rate (tests/it/request.rs checks these through the database).
CREATE FUNCTION bf4ps_eta_seconds(
    queue_position bigint,
    healthy_collectors integer,
    mean_duration_s double precision,
    egress_rate double precision
) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE
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

-- Interactive refresh of one soldier, for the website (inside its own
-- transaction) and `bf4ps-ops request`.
--
-- Creates the soldier if unknown, with its four collection_state rows, then
-- per requested resource (returned in the canonical order detailed, profile,
-- weapons, vehicles):
--   * no live job       -> a new interactive job, `created` event   (state 'created')
--   * pending background -> promoted to the interactive lane and class and
--                          made eligible now, `promoted` event       (state 'promoted')
--   * pending interactive -> left alone                              (state 'pending')
--   * claimed / running  -> left alone                               (state 'claimed' | 'running')
-- New and promoted jobs wake interactive collectors through the 0002 trigger
-- when the caller commits. Calling it again changes nothing.
--
-- position: 1-based place among pending interactive jobs in claim order
-- (0 for claimed/running jobs). eta_seconds: bf4ps_eta_seconds() of that
-- position with the healthy, enabled, non-drained interactive collectors, the
-- mean duration of interactive succeeded/failed events within the ETA window,
-- and egress_rate x the number of distinct egress keys among those
-- collectors; never less than the wait until the job is eligible; NULL when
-- no interactive collector is available (claimed/running jobs count the
-- collector that holds them).
--
-- eta_window / egress_rate: NULL means scheduling_settings.
-- Errors (SQLSTATE 22023 invalid_parameter_value): unknown platform, unknown
-- resource, empty resource list, persona_id <= 0, bad eta_window/egress_rate.
-- SECURITY DEFINER: the website's role needs only EXECUTE (granted by the
-- operator; revoked from PUBLIC below).
CREATE FUNCTION bf4ps_request_refresh(
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
SET search_path FROM CURRENT
AS $fn$
#variable_conflict use_column
DECLARE
    all_resources constant text[] := ARRAY['detailed', 'profile', 'weapons', 'vehicles'];
    v_platform text := bf4ps_request_refresh.platform;
    v_persona bigint := bf4ps_request_refresh.persona_id;
    v_window interval;
    v_rate double precision;
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
           coalesce(bf4ps_request_refresh.egress_rate, s.egress_rate)
      INTO v_window, v_rate
    FROM scheduling_settings AS s;
    v_window := coalesce(v_window, interval '15 minutes');
    v_rate := coalesce(v_rate, 5);
    IF v_window <= interval '0' THEN
        RAISE EXCEPTION 'eta_window must be positive (got %)', v_window
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT (v_rate > 0 AND v_rate < 'Infinity'::double precision) THEN
        RAISE EXCEPTION 'egress_rate must be a finite number > 0 (got %)', v_rate
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- The soldier and its backlog rows.
    INSERT INTO soldiers AS s (platform, persona_id)
    VALUES (v_platform, v_persona)
    ON CONFLICT (platform, persona_id) DO NOTHING
    RETURNING s.soldier_id INTO v_soldier;
    IF v_soldier IS NULL THEN
        SELECT s.soldier_id INTO v_soldier
        FROM soldiers AS s
        WHERE s.platform = v_platform AND s.persona_id = v_persona;
    END IF;
    INSERT INTO collection_state (soldier_id, resource)
    SELECT v_soldier, r FROM unnest(all_resources) AS r
    ON CONFLICT DO NOTHING;

    -- One job per resource. A job can be finalized (deleted) or fed between
    -- our statements; each pass re-reads and settles within a few tries.
    FOREACH v_resource IN ARRAY v_wanted LOOP
        v_settled := false;
        FOR attempt IN 1..5 LOOP
            SELECT j.job_id, j.status, j.lane, j.priority_class, j.attempt_count
              INTO v_job, v_status, v_lane, v_class, v_attempts
            FROM collection_jobs AS j
            WHERE j.soldier_id = v_soldier AND j.resource = v_resource;

            IF NOT FOUND THEN
                INSERT INTO collection_jobs AS j
                    (soldier_id, resource, lane, priority_class, reason, priority_value)
                VALUES (v_soldier, v_resource, 'interactive', 'interactive', 'requested', 0)
                ON CONFLICT (soldier_id, resource) DO NOTHING
                RETURNING j.job_id, j.attempt_count INTO v_job, v_attempts;
                IF v_job IS NOT NULL THEN
                    INSERT INTO collection_events
                        (job_id, soldier_id, persona_id, platform, resource, lane,
                         event_type, attempt_number, metadata)
                    VALUES (v_job, v_soldier, v_persona, v_platform, v_resource, 'interactive',
                            'created', v_attempts,
                            jsonb_build_object('priority_class', 'interactive',
                                               'reason', 'requested'));
                    v_state := 'created';
                    v_settled := true;
                END IF;
            ELSIF v_status = 'pending' AND v_lane = 'background' THEN
                UPDATE collection_jobs AS j
                SET lane = 'interactive',
                    priority_class = 'interactive',
                    reason = 'requested',
                    priority_value = 0,
                    eligible_at = now(),
                    updated_at = now()
                WHERE j.job_id = v_job AND j.status = 'pending' AND j.lane = 'background'
                RETURNING j.attempt_count INTO v_attempts;
                IF FOUND THEN
                    INSERT INTO collection_events
                        (job_id, soldier_id, persona_id, platform, resource, lane,
                         event_type, attempt_number, metadata)
                    VALUES (v_job, v_soldier, v_persona, v_platform, v_resource, 'interactive',
                            'promoted', v_attempts,
                            jsonb_build_object('from_lane', 'background',
                                               'from_priority_class', v_class,
                                               'reason', 'requested'));
                    v_state := 'promoted';
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

    -- ETA inputs, once per call.
    SELECT count(*)::integer, count(DISTINCT c.egress_key)::integer
      INTO v_collectors, v_egress_keys
    FROM collectors AS c
    WHERE c.lane = 'interactive'
      AND c.retired_at IS NULL
      AND c.enabled
      AND NOT c.drained
      AND c.heartbeat_state = 'healthy';
    SELECT avg(e.duration_ms) / 1000.0 INTO v_mean
    FROM (
        SELECT e.duration_ms
        FROM collection_events AS e
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
            eta_seconds := bf4ps_eta_seconds(0, 1, v_mean, NULL);
        ELSE
            SELECT count(*) INTO "position"
            FROM collection_jobs AS me, collection_jobs AS o
            WHERE me.job_id = v_jobs[i]
              AND o.lane = 'interactive'
              AND o.status = 'pending'
              AND (o.claim_rank < me.claim_rank
                   OR (o.claim_rank = me.claim_rank
                       AND (o.priority_value > me.priority_value
                            OR (o.priority_value = me.priority_value
                                AND (o.eligible_at, o.created_at, o.job_id)
                                    <= (me.eligible_at, me.created_at, me.job_id)))));
            eta_seconds := bf4ps_eta_seconds("position", v_collectors, v_mean,
                                             v_rate * greatest(v_egress_keys, 1));
            IF eta_seconds IS NOT NULL THEN
                SELECT greatest(eta_seconds,
                                extract(epoch FROM (j.eligible_at - now()))::double precision)
                  INTO eta_seconds
                FROM collection_jobs AS j
                WHERE j.job_id = v_jobs[i];
            END IF;
        END IF;
        RETURN NEXT;
    END LOOP;
END;
$fn$;

REVOKE EXECUTE ON FUNCTION bf4ps_request_refresh(text, bigint, text[], interval, double precision)
    FROM PUBLIC;
