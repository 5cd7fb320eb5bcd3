-- Successful finalization of a `weapons` job, its tables (a part of
-- bf4ps_succeed_job): `p_data.weapons`, at most 5,000 entries, each with a
-- guid (once), texts of at most 500 characters and non-negative counters.
-- The catalog is upserted in guid order under the catalog's row lock (one
-- writer at a time, so concurrent finalizations never deadlock), then the
-- soldier's set is replaced as a whole (a null counter is 0 where BF4PS's
-- column is NOT NULL). Returns whether the set changed. Bad input is
-- refused (SQLSTATE 22023), writing nothing.
--
-- owner: migrator
-- execute: bf4ps_definer
CREATE OR REPLACE FUNCTION @schema@.bf4ps_store_weapons(
    p_soldier_id bigint, p_data jsonb, p_now timestamptz, OUT changed boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_fresh jsonb;
BEGIN
    IF jsonb_typeof(p_data->'weapons') IS DISTINCT FROM 'array'
       OR jsonb_array_length(p_data->'weapons') > 5000 THEN
        RAISE EXCEPTION 'weapons must be an array of at most 5000 entries'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_to_recordset(p_data->'weapons') AS e(
                   guid text, name text, slug text, category text, kills bigint,
                   headshots bigint, shots_fired bigint, shots_hit bigint,
                   time_equipped_seconds bigint)
               WHERE NOT @schema@.bf4ps_name_ok(e.guid, 200)
                  OR (e.name IS NOT NULL AND length(e.name) > 500)
                  OR (e.slug IS NOT NULL AND length(e.slug) > 500)
                  OR (e.category IS NOT NULL AND length(e.category) > 500)
                  OR e.kills < 0 OR e.headshots < 0 OR e.shots_fired < 0
                  OR e.shots_hit < 0 OR e.time_equipped_seconds < 0)
       OR (SELECT count(*) <> count(DISTINCT e->>'guid')
           FROM jsonb_array_elements(p_data->'weapons') AS e) THEN
        RAISE EXCEPTION 'a weapon has no guid, a guid twice, an overlong text or a negative counter'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- One catalog writer at a time, guids in order.
    PERFORM 1 FROM @schema@.bf4ps_locks WHERE lock_name = 'weapon_catalog' FOR UPDATE;
    WITH e AS (
        SELECT x.* FROM jsonb_to_recordset(p_data->'weapons') AS x(
            guid text, name text, slug text, category text, kills bigint,
            headshots bigint, shots_fired bigint, shots_hit bigint,
            time_equipped_seconds bigint)
    ), cat AS (
        INSERT INTO @schema@.weapon_catalog AS k
            (weapon_guid, name, slug, category, first_seen_at, last_seen_at)
        SELECT e.guid, coalesce(nullif(btrim(e.name), ''), nullif(btrim(e.slug), ''), e.guid),
               e.slug, e.category, p_now, p_now
        FROM e ORDER BY e.guid
        ON CONFLICT (weapon_guid) DO UPDATE
        SET name = EXCLUDED.name, slug = EXCLUDED.slug, category = EXCLUDED.category,
            last_seen_at = greatest(k.last_seen_at, EXCLUDED.last_seen_at)
        RETURNING k.weapon_id, k.weapon_guid
    )
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'weapon_id', cat.weapon_id, 'kills', coalesce(e.kills, 0),
               'headshots', coalesce(e.headshots, 0),
               'shots_fired', coalesce(e.shots_fired, 0),
               'shots_hit', coalesce(e.shots_hit, 0),
               'time_equipped_seconds', coalesce(e.time_equipped_seconds, 0))), '[]')
      INTO v_fresh
    FROM e JOIN cat ON cat.weapon_guid = e.guid;
    -- The soldier's set, replaced as a whole (the old rows first, then
    -- the new: one key is never deleted and inserted by one statement).
    WITH old AS (
        DELETE FROM @schema@.soldier_weapon_stats AS w WHERE w.soldier_id = p_soldier_id
        RETURNING w.weapon_id, w.kills, w.headshots, w.shots_fired, w.shots_hit,
                  w.time_equipped_seconds
    ), fresh AS (
        SELECT f.* FROM jsonb_to_recordset(v_fresh) AS f(
            weapon_id bigint, kills bigint, headshots bigint, shots_fired bigint,
            shots_hit bigint, time_equipped_seconds bigint)
    )
    SELECT EXISTS ((SELECT * FROM old EXCEPT SELECT * FROM fresh)
                   UNION ALL (SELECT * FROM fresh EXCEPT SELECT * FROM old))
      INTO changed;
    INSERT INTO @schema@.soldier_weapon_stats
        (soldier_id, weapon_id, kills, headshots, shots_fired, shots_hit,
         time_equipped_seconds, source_fetched_at, updated_at)
    SELECT p_soldier_id, f.weapon_id, f.kills, f.headshots, f.shots_fired, f.shots_hit,
           f.time_equipped_seconds, p_now, p_now
    FROM jsonb_to_recordset(v_fresh) AS f(
        weapon_id bigint, kills bigint, headshots bigint, shots_fired bigint,
        shots_hit bigint, time_equipped_seconds bigint);
END;
$$;
