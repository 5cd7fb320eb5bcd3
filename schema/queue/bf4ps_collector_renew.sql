-- Extends the caller's unexpired lease by the published lease_duration.
-- Writes no event. NULL: the lease is lost.
--
-- owner: bf4ps_definer
-- execute: bf4ps_collector
CREATE OR REPLACE FUNCTION @schema@.bf4ps_collector_renew(
    p_uuid uuid, p_secret uuid, p_job_id bigint, p_lease_token uuid)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
DECLARE
    v_expires timestamptz;
BEGIN
    PERFORM @schema@.bf4ps_collector_check_secret(p_uuid, p_secret);
    UPDATE @schema@.collection_jobs AS j
    SET lease_expires_at = now() + (SELECT s.lease_duration FROM @schema@.scheduling_settings AS s),
        updated_at = now()
    WHERE j.job_id = p_job_id AND j.collector_uuid = p_uuid AND j.lease_token = p_lease_token
      AND j.status IN ('claimed', 'running') AND j.lease_expires_at > now()
    RETURNING j.lease_expires_at INTO v_expires;
    RETURN v_expires;
END;
$$;
