-- Successful finalization, the contract's steps in one transaction, for the
-- unexpired running lease of incarnation `p_uuid` (no row: the lease is
-- lost, nothing is written), as of `p_now` (bf4ps_collector_succeed: the
-- database's clock). `p_data` is the normalized document of the job's resource
-- (docs/battlelog.md), written into BF4PS's tables as of p_now by the
-- resource's own function: bf4ps_store_detailed, bf4ps_store_weapons,
-- bf4ps_store_vehicles, bf4ps_store_profile.
-- Then collection_state (success; next due after the published cadence of
-- the resource, a `not_found` profile too: 0018), `succeeded` with
-- the registry's snapshots, current_job_id cleared, the job deleted, and
-- the key's throttle streak ended (Battlelog answered). Bad input is
-- refused (SQLSTATE 22023), writing nothing.
--
-- owner: migrator
-- execute: bf4ps_definer
CREATE OR REPLACE FUNCTION @schema@.bf4ps_succeed_job(
    p_uuid uuid, p_job_id bigint, p_lease_token uuid,
    p_data jsonb, p_duration_ms bigint, p_http_status integer, p_now timestamptz)
RETURNS TABLE (
    changed boolean,
    history_appended boolean,
    previous_success_at timestamptz,
    next_due_at timestamptz
)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @schema@, pg_temp
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
    FROM @schema@.collection_jobs AS x
    JOIN @schema@.soldiers AS so ON so.soldier_id = x.soldier_id
    JOIN @schema@.collectors AS c ON c.collector_uuid = x.collector_uuid
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
            FROM @schema@.bf4ps_store_detailed(j.soldier_id, j.persona_id, p_data, p_now) AS x;
        WHEN 'weapons' THEN
            v_changed := @schema@.bf4ps_store_weapons(j.soldier_id, p_data, p_now);
        WHEN 'vehicles' THEN
            v_changed := @schema@.bf4ps_store_vehicles(j.soldier_id, p_data, p_now);
        ELSE
            v_changed := @schema@.bf4ps_store_profile(j.soldier_id, j.current_name, p_data, p_now);
    END CASE;

    SELECT CASE j.resource WHEN 'detailed' THEN s.refresh_detailed
                           WHEN 'profile' THEN s.refresh_profile
                           WHEN 'weapons' THEN s.refresh_weapons
                           ELSE s.refresh_vehicles END
      INTO v_cadence
    FROM @schema@.scheduling_settings AS s;
    SELECT CASE j.resource WHEN 'detailed' THEN st.detailed_last_success_at
                           WHEN 'profile' THEN st.profile_last_success_at
                           WHEN 'weapons' THEN st.weapons_last_success_at
                           ELSE st.vehicles_last_success_at END
      INTO v_prev
    FROM @schema@.collection_state AS st WHERE st.soldier_id = j.soldier_id;
    v_next := CASE WHEN v_state = 'success' THEN p_now + v_cadence END;
    PERFORM @schema@.bf4ps_record_outcome(j.soldier_id, j.resource, v_state, true, v_next, 0,
                                          NULL, NULL, p_now);

    INSERT INTO @schema@.collection_events
        (occurred_at, collector_uuid, collector_name_snapshot, hostname_snapshot,
         egress_key_snapshot, job_id, soldier_id, persona_id, platform, resource, lane,
         event_type, attempt_number, lease_token, result, duration_ms, http_status, metadata)
    VALUES (p_now, p_uuid, j.collector_name, j.hostname, j.egress_key, j.job_id, j.soldier_id,
            j.persona_id, j.platform, j.resource, j.lane, 'succeeded', j.attempt_count,
            p_lease_token, CASE WHEN v_changed THEN 'changed' ELSE 'unchanged' END,
            p_duration_ms, p_http_status,
            jsonb_build_object('previous_success_at', @schema@.bf4ps_sane_time(v_prev),
                               'changed', v_changed, 'history_appended', v_hist));
    UPDATE @schema@.collectors AS c SET current_job_id = NULL, updated_at = p_now
    WHERE c.collector_uuid = p_uuid AND c.current_job_id = p_job_id;
    DELETE FROM @schema@.collection_jobs AS x WHERE x.job_id = p_job_id;
    -- Battlelog answered on this key: its throttle streak ends, unless a pause
    -- is still running (this answer was in flight before it began).
    UPDATE @schema@.egress_gates AS g SET throttle_streak = 0, updated_at = p_now
    WHERE g.egress_key = j.egress_key AND g.throttle_streak > 0
      AND (g.paused_until IS NULL OR g.paused_until <= p_now);

    changed := v_changed;
    history_appended := v_hist;
    previous_success_at := @schema@.bf4ps_sane_time(v_prev);
    next_due_at := v_next;
    RETURN NEXT;
END;
$$;
