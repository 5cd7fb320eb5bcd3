-- TRUNCATE of collection_state bypasses row and statement triggers.
--
-- owner: bf4ps_definer
-- execute: owner only
CREATE OR REPLACE FUNCTION @schema@.bf4ps_feeder_truncated() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    DELETE FROM @schema@.feeder_pairs;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER trg_collection_state_feeder_truncate
    AFTER TRUNCATE ON @schema@.collection_state
    FOR EACH STATEMENT EXECUTE FUNCTION @schema@.bf4ps_feeder_truncated();
