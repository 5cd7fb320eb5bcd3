-- Brings the feeder_pairs rows of the soldiers `p_ids` in line with BF4PS's
-- tables (collection_state, soldier_sources, soldiers): each pair's kind
-- (0 parked, 1 never attempted, 2 success, 3 never attempted of a soldier
-- only submitted by hand), due time, when it last entered the active window
-- and when the soldier was first seen. A soldier without a `bf4sw` source
-- (the website's, `request --name`'s, `soldiers import`'s) may not exist:
-- its never-attempted pairs (kind 3) other than `detailed` (the small
-- request that confirms it) have no sighting (live_at NULL, never woken)
-- until Battlelog confirmed it, one of its stats resources (detailed,
-- weapons, vehicles) succeeded (migration 0026); the feeder bounds kind 3
-- per hour. Called by the
-- feeder's triggers in the writer's own transaction, whoever the writer is
-- (bf4ps-ops or BF4PS's discovery); BF4PS's tables stay the truth.
--
-- Generic plans (plan_cache_mode): for one soldier (the row triggers' case)
-- PostgreSQL kept planning the insert anew at every call (~0.4 ms, twice the
-- insert); the generic plan probes the indexes per id, as a bulk call needs.
--
-- owner: bf4ps_definer
-- execute: owner only
CREATE OR REPLACE FUNCTION @schema@.bf4ps_feeder_sync(p_ids bigint[]) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    -- (Each id probes the indexes, never `= ANY (p_ids)` against every row:
    -- a bulk statement passes thousands.)
    DELETE FROM @schema@.feeder_pairs AS f
    WHERE f.soldier_id IN (
        SELECT i.id FROM unnest(p_ids) AS i(id)
        WHERE NOT EXISTS (SELECT 1 FROM @schema@.collection_state AS cs
                          WHERE cs.soldier_id = i.id));
    INSERT INTO @schema@.feeder_pairs AS f
        (soldier_id, resource, kind, phase, due_at, live_at, seen_at, first_seen_at)
    SELECT cs.soldier_id, p.resource, p.kind, 0, p.due_at,
           CASE p.kind WHEN 1 THEN src.seen_any
                       WHEN 3 THEN CASE WHEN confirmed.yes OR p.resource = 'detailed'
                                        THEN src.seen_any END
                       ELSE src.seen_bf4sw END,
           src.seen_any, so.first_seen_at
    FROM (SELECT DISTINCT i.id FROM unnest(p_ids) AS i(id)) AS i
    JOIN @schema@.collection_state AS cs ON cs.soldier_id = i.id
    LEFT JOIN @schema@.soldiers AS so ON so.soldier_id = cs.soldier_id
    LEFT JOIN LATERAL (
        SELECT max(s.last_seen_at) AS seen_any,
               max(s.last_seen_at) FILTER (WHERE s.source_type = 'bf4sw') AS seen_bf4sw,
               bool_or(s.source_type = 'bf4sw') AS bf4sw
        FROM @schema@.soldier_sources AS s WHERE s.soldier_id = cs.soldier_id
    ) AS src ON true
    CROSS JOIN LATERAL (SELECT (cs.detailed_state = 'success' OR cs.weapons_state = 'success'
                                OR cs.vehicles_state = 'success'
                                OR cs.detailed_last_success_at IS NOT NULL
                                OR cs.weapons_last_success_at IS NOT NULL
                                OR cs.vehicles_last_success_at IS NOT NULL) AS yes
    ) AS confirmed
    CROSS JOIN LATERAL (VALUES
        ('detailed', cs.detailed_state, cs.detailed_next_due_at),
        ('profile', cs.profile_state, cs.profile_next_due_at),
        ('weapons', cs.weapons_state, cs.weapons_next_due_at),
        ('vehicles', cs.vehicles_state, cs.vehicles_next_due_at)
    ) AS x(resource, state, due_at)
    CROSS JOIN LATERAL (SELECT x.resource,
                               (CASE WHEN x.state = 'never_attempted'
                                          AND NOT coalesce(src.bf4sw, false) THEN 3
                                     WHEN x.state = 'never_attempted' THEN 1
                                     WHEN x.state = 'success' THEN 2 ELSE 0 END)::smallint AS kind,
                               x.due_at) AS p
    ORDER BY cs.soldier_id, p.resource
    ON CONFLICT (soldier_id, resource) DO UPDATE
    SET kind = EXCLUDED.kind, due_at = EXCLUDED.due_at, live_at = EXCLUDED.live_at,
        seen_at = EXCLUDED.seen_at, first_seen_at = EXCLUDED.first_seen_at,
        phase = CASE WHEN f.kind = EXCLUDED.kind
                          AND f.due_at IS NOT DISTINCT FROM EXCLUDED.due_at
                          AND EXCLUDED.live_at IS NOT NULL
                     THEN f.phase ELSE 0 END
    WHERE (f.kind, f.due_at, f.live_at, f.seen_at, f.first_seen_at)
          IS DISTINCT FROM (EXCLUDED.kind, EXCLUDED.due_at, EXCLUDED.live_at,
                            EXCLUDED.seen_at, EXCLUDED.first_seen_at);
END;
$$;
