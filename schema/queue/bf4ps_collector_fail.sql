-- The collector's failure finalization (bf4ps_fail_job on the database's
-- clock) for the incarnation holding `p_secret`.
--
-- owner: bf4ps_definer
-- execute: bf4ps_collector
CREATE OR REPLACE FUNCTION @schema@.bf4ps_collector_fail(
    p_uuid uuid, p_secret uuid, p_job_id bigint, p_lease_token uuid,
    p_error_class text, p_http_status integer, p_message text, p_duration_ms bigint)
RETURNS TABLE (
    outcome text,
    eligible_at timestamptz,
    next_due_at timestamptz,
    paused_until timestamptz
)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    PERFORM @schema@.bf4ps_collector_check_secret(p_uuid, p_secret);
    RETURN QUERY SELECT * FROM @schema@.bf4ps_fail_job(
        p_uuid, p_job_id, p_lease_token, p_error_class, p_http_status, p_message, p_duration_ms,
        now());
END;
$$;
