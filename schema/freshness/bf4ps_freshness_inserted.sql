-- Freshness rollup: inserted collection_state rows (BF4PS's discovery
-- inserting default rows, an interactive request's new soldier) add their
-- four pairs to their slots (a +1 per pair in freshness_deltas, in the
-- writer's own transaction). It runs with its owner's rights and a pinned
-- search_path, as the other freshness triggers.
--
-- owner: bf4ps_definer
-- execute: owner only
CREATE OR REPLACE FUNCTION @schema@.bf4ps_freshness_inserted() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    INSERT INTO @schema@.freshness_deltas (resource, slot, pairs)
    SELECT p.resource, p.slot, count(*)
    FROM bf4ps_new_state AS n
    CROSS JOIN LATERAL (VALUES
        ('detailed', @schema@.bf4ps_freshness_slot(n.detailed_last_success_at)),
        ('profile', @schema@.bf4ps_freshness_slot(n.profile_last_success_at)),
        ('weapons', @schema@.bf4ps_freshness_slot(n.weapons_last_success_at)),
        ('vehicles', @schema@.bf4ps_freshness_slot(n.vehicles_last_success_at))
    ) AS p(resource, slot)
    GROUP BY 1, 2;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER trg_collection_state_freshness_insert
    AFTER INSERT ON @schema@.collection_state
    REFERENCING NEW TABLE AS bf4ps_new_state
    FOR EACH STATEMENT EXECUTE FUNCTION @schema@.bf4ps_freshness_inserted();
