-- The collector's claim (bf4ps_claim_job on the database's clock: the grant
-- and the claim in one statement), for the incarnation holding `p_secret`;
-- it commits without waiting for the WAL flush (losing it in a crash loses
-- the claim and its grant whole; recovery returns the job). Rows: none
-- (nothing claimable, or the caller may not claim), one with granted false
-- and no job (wait wait_us: the key's rate, its pause, the budget or the
-- key's share of it), or the job. A collector speaking an older protocol
-- than the schema's is refused with SQLSTATE BF001 (it drains; see
-- bf4ps_collector_protocol).
--
-- owner: bf4ps_definer
-- execute: bf4ps_collector
CREATE OR REPLACE FUNCTION @schema@.bf4ps_collector_claim(
    p_uuid uuid, p_secret uuid, p_protocol integer, p_start boolean DEFAULT true)
RETURNS TABLE (
    job_id bigint,
    soldier_id bigint,
    persona_id bigint,
    platform text,
    soldier_name text,
    resource text,
    lane text,
    priority_class text,
    attempt_count integer,
    lease_token uuid,
    lease_expires_at timestamptz,
    claimed_at timestamptz,
    created_at timestamptz,
    eligible_at timestamptz,
    budget_class text,
    granted boolean,
    wait_us bigint,
    paused boolean
)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    IF p_protocol IS NULL OR p_protocol < @schema@.bf4ps_collector_protocol() THEN
        RAISE EXCEPTION 'this collector speaks protocol %, the schema protocol %: upgrade bf4ps-ops on this host',
                coalesce(p_protocol::text, 'NULL'), @schema@.bf4ps_collector_protocol()
            USING ERRCODE = 'BF001';
    END IF;
    PERFORM @schema@.bf4ps_collector_check_secret(p_uuid, p_secret);
    PERFORM set_config('synchronous_commit', 'off', true);
    RETURN QUERY SELECT * FROM @schema@.bf4ps_claim_job(p_uuid, p_start, NULL);
END;
$$;
