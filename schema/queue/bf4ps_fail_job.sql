-- Failure finalization for the unexpired running lease of incarnation
-- `p_uuid` as of `p_now` (no row: the lease is lost, nothing written;
-- bf4ps_collector_fail: the database's clock). Never touches gameplay data. The pair's
-- collection_state columns become what BF4PS's scheduler expects:
--   throttled    the caller's egress key pauses (for throttle_pause, doubling
--                while throttling continues, up to throttle_pause_max; a pause
--                already running is kept); the job is pending again from the
--                pause's end plus jitter and the attempt does not count;
--                temporary_failure, due again then;
--   unavailable  the persona does not exist. One host's word parks nothing
--                (0019): the verdict is confirmed when the pair's latest
--                outcome is an `unavailable` verdict given through another
--                login role, or through the same role when no other role has
--                a live collector on the job's lane. Confirmed: unavailable,
--                out of the retry loop (no due time), the job removed.
--                Unconfirmed: temporary_failure, the job pending again after
--                scheduling_settings.unavailable_recheck (the attempt counts
--                toward nothing else; the `failed` event's metadata says
--                verdict: unconfirmed);
--   other        temporary_failure, the failure count and class, and the
--                retry time: the retry ladder's step for this failure in a
--                row (+-retry_jitter); the job pending again then, or, past
--                retry_max_attempts, removed (the feeder brings the pair back
--                when it is due).
-- Events: `failed` (+ `retry_scheduled` when the job waits). Bad input is
-- refused (SQLSTATE 22023), writing nothing.
--
-- owner: migrator
-- execute: bf4ps_definer
CREATE OR REPLACE FUNCTION @schema@.bf4ps_fail_job(
    p_uuid uuid, p_job_id bigint, p_lease_token uuid,
    p_error_class text, p_http_status integer, p_message text, p_duration_ms bigint,
    p_now timestamptz)
RETURNS TABLE (
    outcome text,
    eligible_at timestamptz,
    next_due_at timestamptz,
    paused_until timestamptz
)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @schema@, pg_temp
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
    FROM @schema@.collection_jobs AS x
    JOIN @schema@.soldiers AS so ON so.soldier_id = x.soldier_id
    JOIN @schema@.collectors AS c ON c.collector_uuid = x.collector_uuid
    LEFT JOIN @schema@.collection_state AS st ON st.soldier_id = x.soldier_id
    WHERE x.job_id = p_job_id AND x.collector_uuid = p_uuid AND x.lease_token = p_lease_token
      AND x.status = 'running' AND x.lease_expires_at > p_now
    FOR UPDATE OF x;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT x.throttle_pause, x.throttle_pause_max, x.retry_ladder, x.retry_jitter,
           x.retry_max_attempts, x.unavailable_recheck
      INTO s
    FROM @schema@.scheduling_settings AS x;
    v_failures := least(coalesce(j.failures, 0), 1000000) + 1;

    IF p_error_class = 'throttled' THEN
        -- The whole key pauses (every collector on it), unless a pause is
        -- running already: this answer was in flight before it began.
        INSERT INTO @schema@.egress_gates AS g (egress_key, next_slot_at, paused_until, throttle_streak)
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
        FROM @schema@.collector_secrets AS cs WHERE cs.collector_uuid = p_uuid;
        -- The pair's latest outcome (a soldier's few events, newest first).
        SELECT e.event_type = 'failed' AND e.error_class = 'unavailable' AS verdict,
               cs.registered_by
          INTO v_prev
        FROM @schema@.collection_events AS e
        LEFT JOIN @schema@.collector_secrets AS cs ON cs.collector_uuid = e.collector_uuid
        WHERE e.soldier_id = j.soldier_id AND e.resource = j.resource
          AND e.event_type IN ('succeeded', 'failed')
        ORDER BY e.occurred_at DESC, e.event_id DESC
        LIMIT 1;
        v_unconfirmed := NOT coalesce(
            v_prev.verdict
            AND (v_prev.registered_by <> v_role
                 OR NOT EXISTS (
                     SELECT 1
                     FROM @schema@.collectors AS c
                     JOIN @schema@.collector_secrets AS cs ON cs.collector_uuid = c.collector_uuid
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

    PERFORM @schema@.bf4ps_record_outcome(
        j.soldier_id, j.resource,
        CASE WHEN v_outcome = 'unavailable' THEN 'unavailable' ELSE 'temporary_failure' END,
        false, v_next, v_failures, p_error_class, v_message, p_now);

    IF v_retry THEN
        UPDATE @schema@.collection_jobs AS x
        SET status = 'pending', collector_uuid = NULL, lease_token = NULL,
            claimed_at = NULL, started_at = NULL, lease_expires_at = NULL,
            eligible_at = v_next,
            throttled_attempts = x.throttled_attempts
                                 + CASE WHEN p_error_class = 'throttled' THEN 1 ELSE 0 END,
            last_error_class = p_error_class, last_error_at = p_now, updated_at = p_now
        WHERE x.job_id = p_job_id;
        v_eligible := v_next;
    ELSE
        DELETE FROM @schema@.collection_jobs AS x WHERE x.job_id = p_job_id;
    END IF;
    UPDATE @schema@.collectors AS c SET current_job_id = NULL, updated_at = p_now
    WHERE c.collector_uuid = p_uuid AND c.current_job_id = p_job_id;

    INSERT INTO @schema@.collection_events
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
