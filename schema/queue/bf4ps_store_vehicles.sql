-- Successful finalization of a `vehicles` job, its tables (a part of
-- bf4ps_succeed_job): as bf4ps_store_weapons, for `p_data.vehicles`,
-- vehicle_catalog and soldier_vehicle_stats (destroy_x_in_y stays null
-- when Battlelog omits it: BF4PS's column allows it). Returns whether the
-- set changed.
--
-- owner: migrator
-- execute: bf4ps_definer
CREATE OR REPLACE FUNCTION @schema@.bf4ps_store_vehicles(
    p_soldier_id bigint, p_data jsonb, p_now timestamptz, OUT changed boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_fresh jsonb;
BEGIN
    IF jsonb_typeof(p_data->'vehicles') IS DISTINCT FROM 'array'
       OR jsonb_array_length(p_data->'vehicles') > 5000 THEN
        RAISE EXCEPTION 'vehicles must be an array of at most 5000 entries'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_to_recordset(p_data->'vehicles') AS e(
                   guid text, name text, slug text, category text, kills bigint,
                   time_in_seconds bigint, destroy_x_in_y bigint)
               WHERE NOT @schema@.bf4ps_name_ok(e.guid, 200)
                  OR (e.name IS NOT NULL AND length(e.name) > 500)
                  OR (e.slug IS NOT NULL AND length(e.slug) > 500)
                  OR (e.category IS NOT NULL AND length(e.category) > 500)
                  OR e.kills < 0 OR e.time_in_seconds < 0 OR e.destroy_x_in_y < 0)
       OR (SELECT count(*) <> count(DISTINCT e->>'guid')
           FROM jsonb_array_elements(p_data->'vehicles') AS e) THEN
        RAISE EXCEPTION 'a vehicle has no guid, a guid twice, an overlong text or a negative counter'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM 1 FROM @schema@.bf4ps_locks WHERE lock_name = 'vehicle_catalog' FOR UPDATE;
    WITH e AS (
        SELECT x.* FROM jsonb_to_recordset(p_data->'vehicles') AS x(
            guid text, name text, slug text, category text, kills bigint,
            time_in_seconds bigint, destroy_x_in_y bigint)
    ), cat AS (
        INSERT INTO @schema@.vehicle_catalog AS k
            (vehicle_guid, name, slug, category, first_seen_at, last_seen_at)
        SELECT e.guid, coalesce(nullif(btrim(e.name), ''), nullif(btrim(e.slug), ''), e.guid),
               e.slug, e.category, p_now, p_now
        FROM e ORDER BY e.guid
        ON CONFLICT (vehicle_guid) DO UPDATE
        SET name = EXCLUDED.name, slug = EXCLUDED.slug, category = EXCLUDED.category,
            last_seen_at = greatest(k.last_seen_at, EXCLUDED.last_seen_at)
        RETURNING k.vehicle_id, k.vehicle_guid
    )
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'vehicle_id', cat.vehicle_id, 'kills', coalesce(e.kills, 0),
               'time_in_seconds', coalesce(e.time_in_seconds, 0),
               'destroy_x_in_y', e.destroy_x_in_y)), '[]')
      INTO v_fresh
    FROM e JOIN cat ON cat.vehicle_guid = e.guid;
    WITH old AS (
        DELETE FROM @schema@.soldier_vehicle_stats AS w WHERE w.soldier_id = p_soldier_id
        RETURNING w.vehicle_id, w.kills, w.time_in_seconds, w.destroy_x_in_y
    ), fresh AS (
        SELECT f.* FROM jsonb_to_recordset(v_fresh) AS f(
            vehicle_id bigint, kills bigint, time_in_seconds bigint, destroy_x_in_y bigint)
    )
    SELECT EXISTS ((SELECT * FROM old EXCEPT SELECT * FROM fresh)
                   UNION ALL (SELECT * FROM fresh EXCEPT SELECT * FROM old))
      INTO changed;
    INSERT INTO @schema@.soldier_vehicle_stats
        (soldier_id, vehicle_id, kills, time_in_seconds, destroy_x_in_y,
         source_fetched_at, updated_at)
    SELECT p_soldier_id, f.vehicle_id, f.kills, f.time_in_seconds, f.destroy_x_in_y,
           p_now, p_now
    FROM jsonb_to_recordset(v_fresh) AS f(
        vehicle_id bigint, kills bigint, time_in_seconds bigint, destroy_x_in_y bigint);
END;
$$;
