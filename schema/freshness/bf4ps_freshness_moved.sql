-- A pair whose last success moved to another slot: -1 from the old slot,
-- +1 to the new one. Called only for updates that change a last success
-- (the trigger's WHEN compares the raw columns; 0009).
--
-- owner: bf4ps_definer
-- execute: owner only
CREATE OR REPLACE FUNCTION @schema@.bf4ps_freshness_moved() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    INSERT INTO @schema@.freshness_deltas (resource, slot, pairs)
    SELECT m.resource, s.slot, s.pairs
    FROM (VALUES
        ('detailed', OLD.detailed_last_success_at, NEW.detailed_last_success_at),
        ('profile', OLD.profile_last_success_at, NEW.profile_last_success_at),
        ('weapons', OLD.weapons_last_success_at, NEW.weapons_last_success_at),
        ('vehicles', OLD.vehicles_last_success_at, NEW.vehicles_last_success_at)
    ) AS m(resource, old_at, new_at)
    CROSS JOIN LATERAL (VALUES
        (@schema@.bf4ps_freshness_slot(m.old_at), -1),
        (@schema@.bf4ps_freshness_slot(m.new_at), 1)
    ) AS s(slot, pairs)
    WHERE @schema@.bf4ps_freshness_slot(m.old_at)
          IS DISTINCT FROM @schema@.bf4ps_freshness_slot(m.new_at);
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER trg_collection_state_freshness_update
    AFTER UPDATE ON @schema@.collection_state
    FOR EACH ROW
    WHEN (OLD.detailed_last_success_at IS DISTINCT FROM NEW.detailed_last_success_at
          OR OLD.profile_last_success_at IS DISTINCT FROM NEW.profile_last_success_at
          OR OLD.weapons_last_success_at IS DISTINCT FROM NEW.weapons_last_success_at
          OR OLD.vehicles_last_success_at IS DISTINCT FROM NEW.vehicles_last_success_at)
    EXECUTE FUNCTION @schema@.bf4ps_freshness_moved();
