-- 0026: the website's soldiers and the catalogs' seeds (issue 37, findings
-- 10 and 11).
--
-- - A soldier whose only source is 'manual' (the website's refresh of an
--   unknown persona, `request --name`, `soldiers import`) costs background
--   budget only once Battlelog confirmed it exists, and then within a bounded
--   share. Its never-attempted pairs are feeder_pairs kind 3 (kind 1 stays
--   the bootstrap of a soldier discovery saw: BF4PS's own). Its `detailed`
--   pair (the small request that confirms it; the website's refresh asks
--   for it itself) is ready like a bootstrap pair; its other pairs have no
--   sighting (live_at NULL, never woken) until one of its stats resources
--   (detailed, weapons, vehicles; a profile 404 is a success, 0018, so not
--   the profile) succeeded. The feeder gives kind 3 pairs at most
--   `BF4PS_FEEDER_MANUAL_BOOTSTRAP_PER_HOUR` jobs an hour, counted per
--   minute in feeder_usage. An `unavailable` detailed verdict confirms
--   nothing: such a soldier's lists never bootstrap in the background.
-- - The catalogs' seeds are sized to Battlelog's real lists (about 174
--   weapons, 82 vehicles): 200 weapons (catalog_seed) and 100 vehicles (the
--   new vehicle_catalog_seed), instead of 1,000 for both. A database still on
--   the old default gets the new ones; an operator's own catalog_seed is kept
--   and applies to both catalogs.
--
-- RELEASED once merged: never edit this file. Add a new migration instead.

ALTER TABLE feeder_pairs DROP CONSTRAINT feeder_pairs_kind_check;
ALTER TABLE feeder_pairs ADD CONSTRAINT feeder_pairs_kind_check CHECK (kind IN (0, 1, 2, 3));

CREATE INDEX ix_feeder_pairs_manual ON feeder_pairs (resource, first_seen_at, soldier_id)
    WHERE phase = 2 AND kind = 3;

-- Bootstrap jobs the feeder gave soldiers only the website (or an operator)
-- submitted, per minute; the cycle prunes what is older than an hour.
CREATE TABLE feeder_usage (
    minute timestamptz PRIMARY KEY,
    manual_bootstrap integer NOT NULL,

    CONSTRAINT feeder_usage_manual_bootstrap_check CHECK (manual_bootstrap >= 0)
);
GRANT SELECT ON feeder_usage TO bf4ps_reader;

-- The pairs as bf4ps_feeder_sync now computes them: never-attempted pairs of
-- soldiers without a `bf4sw` source become kind 3, without a sighting until
-- confirmed, parked (the next cycle wakes the confirmed ones).
UPDATE feeder_pairs AS f
SET kind = 3, phase = 0,
    live_at = CASE WHEN c.confirmed OR f.resource = 'detailed' THEN f.live_at END
FROM (
    SELECT cs.soldier_id,
           (cs.detailed_state = 'success' OR cs.weapons_state = 'success'
            OR cs.vehicles_state = 'success'
            OR cs.detailed_last_success_at IS NOT NULL
            OR cs.weapons_last_success_at IS NOT NULL
            OR cs.vehicles_last_success_at IS NOT NULL) AS confirmed
    FROM collection_state AS cs
    WHERE NOT EXISTS (SELECT 1 FROM soldier_sources AS s
                      WHERE s.soldier_id = cs.soldier_id AND s.source_type = 'bf4sw')
) AS c
WHERE f.soldier_id = c.soldier_id AND f.kind = 1;

ALTER TABLE scheduling_settings
    ADD COLUMN vehicle_catalog_seed integer NOT NULL DEFAULT 100,
    ADD CONSTRAINT scheduling_settings_vehicle_catalog_seed_check
        CHECK (vehicle_catalog_seed >= 0);
UPDATE scheduling_settings SET vehicle_catalog_seed = catalog_seed WHERE catalog_seed <> 1000;
UPDATE scheduling_settings SET catalog_seed = 200 WHERE catalog_seed = 1000;
ALTER TABLE scheduling_settings ALTER COLUMN catalog_seed SET DEFAULT 200;
