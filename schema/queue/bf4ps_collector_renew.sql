-- Extends the caller's unexpired lease by the published lease_duration.
-- Writes no event. NULL: the lease is lost.
--
-- Rated (issue 37): while more than three quarters of lease_duration is
-- left, the lease is answered as it stands and nothing is written (the
-- collector renews every third of it, when two thirds are left; a loop of
-- calls costs reads, not WAL).
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
    v_duration interval;
BEGIN
    PERFORM @schema@.bf4ps_collector_check_secret(p_uuid, p_secret);
    SELECT s.lease_duration INTO v_duration FROM @schema@.scheduling_settings AS s;
    SELECT j.lease_expires_at INTO v_expires
    FROM @schema@.collection_jobs AS j
    WHERE j.job_id = p_job_id AND j.collector_uuid = p_uuid AND j.lease_token = p_lease_token
      AND j.status IN ('claimed', 'running') AND j.lease_expires_at > now();
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF v_expires > now() + v_duration * 0.75 AND v_expires <= now() + v_duration THEN
        -- Renewed recently enough: answer only.
        RETURN v_expires;
    END IF;
    UPDATE @schema@.collection_jobs AS j
    SET lease_expires_at = now() + v_duration,
        updated_at = now()
    WHERE j.job_id = p_job_id AND j.collector_uuid = p_uuid AND j.lease_token = p_lease_token
      AND j.status IN ('claimed', 'running') AND j.lease_expires_at > now()
    RETURNING j.lease_expires_at INTO v_expires;
    RETURN v_expires;
END;
$$;
