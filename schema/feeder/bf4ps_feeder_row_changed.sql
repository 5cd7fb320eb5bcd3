-- Row triggers (a finalization's state row, a soldier's first sighting).
--
-- owner: bf4ps_definer
-- execute: owner only
CREATE OR REPLACE FUNCTION @schema@.bf4ps_feeder_row_changed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    PERFORM @schema@.bf4ps_feeder_sync(ARRAY[NEW.soldier_id]);
    RETURN NULL;
END;
$$;

-- Row level with a WHEN on the raw columns: a finalization calls PL/pgSQL
-- only when a state or a due time changed.
CREATE OR REPLACE TRIGGER trg_collection_state_feeder_update
    AFTER UPDATE ON @schema@.collection_state
    FOR EACH ROW
    WHEN (OLD.detailed_state IS DISTINCT FROM NEW.detailed_state
          OR OLD.detailed_next_due_at IS DISTINCT FROM NEW.detailed_next_due_at
          OR OLD.profile_state IS DISTINCT FROM NEW.profile_state
          OR OLD.profile_next_due_at IS DISTINCT FROM NEW.profile_next_due_at
          OR OLD.weapons_state IS DISTINCT FROM NEW.weapons_state
          OR OLD.weapons_next_due_at IS DISTINCT FROM NEW.weapons_next_due_at
          OR OLD.vehicles_state IS DISTINCT FROM NEW.vehicles_state
          OR OLD.vehicles_next_due_at IS DISTINCT FROM NEW.vehicles_next_due_at
          OR OLD.soldier_id IS DISTINCT FROM NEW.soldier_id)
    EXECUTE FUNCTION @schema@.bf4ps_feeder_row_changed();

CREATE OR REPLACE TRIGGER trg_soldiers_feeder_first_seen
    AFTER UPDATE ON @schema@.soldiers
    FOR EACH ROW
    WHEN (OLD.first_seen_at IS DISTINCT FROM NEW.first_seen_at)
    EXECUTE FUNCTION @schema@.bf4ps_feeder_row_changed();
