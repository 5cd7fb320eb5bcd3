-- claimed -> running under the lease (the contract's start guard); writes
-- `started`. NULL: the lease is not the caller's (nothing written).
--
-- owner: bf4ps_definer
-- execute: bf4ps_collector
CREATE OR REPLACE FUNCTION @schema@.bf4ps_collector_start(
    p_uuid uuid, p_secret uuid, p_job_id bigint, p_lease_token uuid)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
DECLARE
    v_expires timestamptz;
BEGIN
    PERFORM @schema@.bf4ps_collector_check_secret(p_uuid, p_secret);
    PERFORM set_config('synchronous_commit', 'off', true);
    WITH started AS (
        UPDATE @schema@.collection_jobs AS j
        SET status = 'running', started_at = now(), updated_at = now()
        WHERE j.job_id = p_job_id AND j.status = 'claimed' AND j.collector_uuid = p_uuid
          AND j.lease_token = p_lease_token AND j.lease_expires_at > now()
        RETURNING j.job_id, j.soldier_id, j.resource, j.lane, j.attempt_count, j.lease_token,
                  j.lease_expires_at, j.claimed_at
    ), event AS (
        INSERT INTO @schema@.collection_events
            (collector_uuid, collector_name_snapshot, hostname_snapshot, egress_key_snapshot,
             job_id, soldier_id, persona_id, platform, resource, lane, event_type,
             attempt_number, lease_token, metadata)
        SELECT p_uuid, c.collector_name, c.hostname, c.egress_key,
               j.job_id, j.soldier_id, s.persona_id, s.platform, j.resource, j.lane,
               'started', j.attempt_count, j.lease_token,
               jsonb_build_object('claim_to_start_ms',
                                  floor(extract(epoch FROM now() - j.claimed_at) * 1000))
        FROM started AS j
        JOIN @schema@.soldiers AS s ON s.soldier_id = j.soldier_id
        JOIN @schema@.collectors AS c ON c.collector_uuid = p_uuid
    )
    SELECT started.lease_expires_at INTO v_expires FROM started;
    RETURN v_expires;
END;
$$;
