-- Successful finalization for the caller's lease (bf4ps_succeed_job on the
-- database's clock), after bf4ps_check_document (0019) on the job's
-- resource: no row when the lease is not the caller's.
--
-- owner: bf4ps_definer
-- execute: bf4ps_collector
CREATE OR REPLACE FUNCTION @schema@.bf4ps_collector_succeed(
    p_uuid uuid, p_secret uuid, p_job_id bigint, p_lease_token uuid,
    p_data jsonb, p_duration_ms bigint, p_http_status integer)
RETURNS TABLE (
    changed boolean,
    history_appended boolean,
    previous_success_at timestamptz,
    next_due_at timestamptz
)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
DECLARE
    v_resource text;
BEGIN
    PERFORM @schema@.bf4ps_collector_check_secret(p_uuid, p_secret);
    SELECT j.resource INTO v_resource
    FROM @schema@.collection_jobs AS j
    WHERE j.job_id = p_job_id AND j.collector_uuid = p_uuid AND j.lease_token = p_lease_token
      AND j.status = 'running' AND j.lease_expires_at > now();
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM @schema@.bf4ps_check_document(v_resource, p_data, now());
    RETURN QUERY SELECT * FROM @schema@.bf4ps_succeed_job(
        p_uuid, p_job_id, p_lease_token, p_data, p_duration_ms, p_http_status, now());
END;
$$;
