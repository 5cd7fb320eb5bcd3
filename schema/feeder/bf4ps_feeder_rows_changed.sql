-- Statement triggers with a transition table named bf4ps_rows (inserted,
-- updated or deleted rows of collection_state or soldier_sources).
--
-- owner: bf4ps_definer
-- execute: owner only
CREATE OR REPLACE FUNCTION @schema@.bf4ps_feeder_rows_changed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    PERFORM @schema@.bf4ps_feeder_sync(
        ARRAY(SELECT DISTINCT r.soldier_id FROM bf4ps_rows AS r ORDER BY 1));
    RETURN NULL;
END;
$$;

-- The triggers, then the fill from the rows as they are now: creating a
-- trigger takes a SHARE ROW EXCLUSIVE lock on its table until this
-- migration commits, so nothing slips between the fill and the first
-- trigger call (BF4PS's discovery waits for the fill: ~1 s per 200,000
-- soldiers).
CREATE OR REPLACE TRIGGER trg_collection_state_feeder_insert
    AFTER INSERT ON @schema@.collection_state
    REFERENCING NEW TABLE AS bf4ps_rows
    FOR EACH STATEMENT EXECUTE FUNCTION @schema@.bf4ps_feeder_rows_changed();

CREATE OR REPLACE TRIGGER trg_collection_state_feeder_delete
    AFTER DELETE ON @schema@.collection_state
    REFERENCING OLD TABLE AS bf4ps_rows
    FOR EACH STATEMENT EXECUTE FUNCTION @schema@.bf4ps_feeder_rows_changed();

CREATE OR REPLACE TRIGGER trg_soldier_sources_feeder_insert
    AFTER INSERT ON @schema@.soldier_sources
    REFERENCING NEW TABLE AS bf4ps_rows
    FOR EACH STATEMENT EXECUTE FUNCTION @schema@.bf4ps_feeder_rows_changed();

CREATE OR REPLACE TRIGGER trg_soldier_sources_feeder_update
    AFTER UPDATE ON @schema@.soldier_sources
    REFERENCING NEW TABLE AS bf4ps_rows
    FOR EACH STATEMENT EXECUTE FUNCTION @schema@.bf4ps_feeder_rows_changed();

CREATE OR REPLACE TRIGGER trg_soldier_sources_feeder_delete
    AFTER DELETE ON @schema@.soldier_sources
    REFERENCING OLD TABLE AS bf4ps_rows
    FOR EACH STATEMENT EXECUTE FUNCTION @schema@.bf4ps_feeder_rows_changed();
