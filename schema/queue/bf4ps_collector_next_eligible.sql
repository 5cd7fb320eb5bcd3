-- When the next pending job of the caller's lane becomes eligible (a
-- collector sleeps until then when nothing is claimable); NULL: none.
--
-- owner: bf4ps_definer
-- execute: bf4ps_collector
CREATE OR REPLACE FUNCTION @schema@.bf4ps_collector_next_eligible(p_uuid uuid, p_secret uuid)
RETURNS timestamptz
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    PERFORM @schema@.bf4ps_collector_check_secret(p_uuid, p_secret);
    RETURN (SELECT @schema@.bf4ps_sane_time(min(j.eligible_at))
            FROM @schema@.collection_jobs AS j
            WHERE j.status = 'pending'
              AND j.lane = (SELECT c.lane FROM @schema@.collectors AS c
                            WHERE c.collector_uuid = p_uuid));
END;
$$;
