-- Freshness rollup: deleted collection_state rows take their four pairs
-- out of their slots (a -1 per pair in freshness_deltas, in the writer's
-- own transaction). It runs with its owner's rights, so no writer needs a
-- privilege on our tables, and its search_path is pinned, so no writer's
-- temporary table gets the deltas.
--
-- owner: bf4ps_definer
-- execute: owner only
CREATE OR REPLACE FUNCTION @schema@.bf4ps_freshness_deleted() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    INSERT INTO @schema@.freshness_deltas (resource, slot, pairs)
    SELECT p.resource, p.slot, -count(*)
    FROM bf4ps_old_state AS o
    CROSS JOIN LATERAL (VALUES
        ('detailed', @schema@.bf4ps_freshness_slot(o.detailed_last_success_at)),
        ('profile', @schema@.bf4ps_freshness_slot(o.profile_last_success_at)),
        ('weapons', @schema@.bf4ps_freshness_slot(o.weapons_last_success_at)),
        ('vehicles', @schema@.bf4ps_freshness_slot(o.vehicles_last_success_at))
    ) AS p(resource, slot)
    GROUP BY 1, 2;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER trg_collection_state_freshness_delete
    AFTER DELETE ON @schema@.collection_state
    REFERENCING OLD TABLE AS bf4ps_old_state
    FOR EACH STATEMENT EXECUTE FUNCTION @schema@.bf4ps_freshness_deleted();
