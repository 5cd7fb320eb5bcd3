-- Raises 42501 unless `p_secret` is the secret of incarnation `p_uuid`.
-- (Called by the interface functions; granted to nobody.)
--
-- owner: bf4ps_definer
-- execute: owner only
CREATE OR REPLACE FUNCTION @schema@.bf4ps_collector_check_secret(p_uuid uuid, p_secret uuid)
RETURNS void
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    IF p_uuid IS NULL OR p_secret IS NULL OR NOT EXISTS (
        SELECT 1 FROM @schema@.collector_secrets AS cs
        WHERE cs.collector_uuid = p_uuid
          AND cs.secret_sha256 = sha256(convert_to(p_secret::text, 'UTF8')))
    THEN
        RAISE EXCEPTION 'collector % did not prove it is this incarnation (wrong secret)', p_uuid
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END;
$$;
