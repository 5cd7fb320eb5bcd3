-- TRUNCATE bypasses row and statement triggers: clear the rollup with it.
--
-- owner: bf4ps_definer
-- execute: owner only
CREATE OR REPLACE FUNCTION @schema@.bf4ps_freshness_truncated() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    DELETE FROM @schema@.freshness_deltas;
    DELETE FROM @schema@.freshness_rollup;
    DELETE FROM @schema@.freshness_bands;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER trg_collection_state_freshness_truncate
    AFTER TRUNCATE ON @schema@.collection_state
    FOR EACH STATEMENT EXECUTE FUNCTION @schema@.bf4ps_freshness_truncated();
