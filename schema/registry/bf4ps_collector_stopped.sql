-- The clean-stop mark (0006): drained, so the incarnation is neither swept to
-- lost nor blocks a restart under its name.
--
-- owner: bf4ps_definer
-- execute: bf4ps_collector
CREATE OR REPLACE FUNCTION @schema@.bf4ps_collector_stopped(p_uuid uuid, p_secret uuid)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    PERFORM @schema@.bf4ps_collector_check_secret(p_uuid, p_secret);
    UPDATE @schema@.collectors AS x
    SET drained = true, updated_at = now()
    WHERE x.collector_uuid = p_uuid;
END;
$$;
