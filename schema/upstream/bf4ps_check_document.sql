-- Checks what a `p_resource` document brings into tables others read
-- (bf4ps_succeed_job checks its shape and ranges): every catalog string
-- (name, slug, category) and profile string passes bf4ps_text_ok (a slug
-- is also [A-Za-z0-9._-] only and a catalog string has no < or >), a
-- country code is ISO 3166-1 alpha-2, battlelog_user_id is > 0 (SQLSTATE
-- 22023 otherwise). New catalog entries are bounded (SQLSTATE 53400
-- beyond): a catalog fills up to its seed, scheduling_settings.catalog_seed
-- (weapons, 200) or vehicle_catalog_seed (vehicles, 100), sized to
-- Battlelog's real lists (about 174 weapons, 82 vehicles; migration 0026),
-- then takes at most catalog_new_per_day new ones a day (Battlelog adds
-- weapons a few times a year); counted (again) under the catalog's row lock,
-- which the finalization takes next anyway, so honest lists finalized
-- together count each new entry once.
--
-- owner: migrator
-- execute: bf4ps_definer
CREATE OR REPLACE FUNCTION @schema@.bf4ps_check_document(p_resource text, p_data jsonb, p_now timestamptz)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
DECLARE
    v_list text := CASE p_resource WHEN 'weapons' THEN 'weapons'
                                   WHEN 'vehicles' THEN 'vehicles' END;
    v_seed integer;
    v_per_day integer;
    v_new bigint;
    v_size bigint;
    v_recent bigint;
    v_bad text;
BEGIN
    -- (An oversized or malformed list is bf4ps_succeed_job's to refuse.)
    IF v_list IS NOT NULL AND jsonb_typeof(p_data->v_list) = 'array'
       AND jsonb_array_length(p_data->v_list) <= 5000 THEN
        SELECT format('entry %s', e.guid) INTO v_bad
        FROM jsonb_to_recordset(p_data->v_list) AS e(guid text, name text, slug text, category text)
        WHERE NOT @schema@.bf4ps_text_ok(e.name, 200) OR NOT @schema@.bf4ps_text_ok(e.category, 200)
           OR e.name ~ '[<>]' OR e.category ~ '[<>]'
           OR e.slug !~ '^[A-Za-z0-9._-]{1,200}$' OR e.slug ~ '\.\.'
        LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'a % % has a name, slug or category with characters others must not be shown (control, bidirectional, zero-width or invisible characters, < or >; a slug is [A-Za-z0-9._-] without ..)',
                    p_resource, left(v_bad, 80)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT CASE v_list WHEN 'weapons' THEN s.catalog_seed ELSE s.vehicle_catalog_seed END,
               s.catalog_new_per_day
          INTO v_seed, v_per_day
        FROM @schema@.scheduling_settings AS s;
        IF p_resource = 'weapons' THEN
            SELECT count(DISTINCT e.guid) INTO v_new
            FROM jsonb_to_recordset(p_data->'weapons') AS e(guid text)
            WHERE NOT EXISTS (SELECT 1 FROM @schema@.weapon_catalog AS k
                              WHERE k.weapon_guid = e.guid);
            IF v_new > 0 THEN
                PERFORM 1 FROM @schema@.bf4ps_locks WHERE lock_name = 'weapon_catalog' FOR UPDATE;
                -- Counted again under the lock: a concurrent finalization
                -- may have added the same entries meanwhile.
                SELECT count(DISTINCT e.guid) INTO v_new
                FROM jsonb_to_recordset(p_data->'weapons') AS e(guid text)
                WHERE NOT EXISTS (SELECT 1 FROM @schema@.weapon_catalog AS k
                                  WHERE k.weapon_guid = e.guid);
                SELECT count(*), count(*) FILTER (WHERE k.first_seen_at > p_now - interval '1 day')
                  INTO v_size, v_recent
                FROM @schema@.weapon_catalog AS k;
            END IF;
        ELSE
            SELECT count(DISTINCT e.guid) INTO v_new
            FROM jsonb_to_recordset(p_data->'vehicles') AS e(guid text)
            WHERE NOT EXISTS (SELECT 1 FROM @schema@.vehicle_catalog AS k
                              WHERE k.vehicle_guid = e.guid);
            IF v_new > 0 THEN
                PERFORM 1 FROM @schema@.bf4ps_locks WHERE lock_name = 'vehicle_catalog' FOR UPDATE;
                SELECT count(DISTINCT e.guid) INTO v_new
                FROM jsonb_to_recordset(p_data->'vehicles') AS e(guid text)
                WHERE NOT EXISTS (SELECT 1 FROM @schema@.vehicle_catalog AS k
                                  WHERE k.vehicle_guid = e.guid);
                SELECT count(*), count(*) FILTER (WHERE k.first_seen_at > p_now - interval '1 day')
                  INTO v_size, v_recent
                FROM @schema@.vehicle_catalog AS k;
            END IF;
        END IF;
        IF v_new > 0
           AND v_new > greatest(v_seed - v_size, 0) + greatest(v_per_day - v_recent, 0) THEN
            RAISE EXCEPTION 'this % list adds % new catalog entries; the catalog holds % and took % in the last day (it fills up to % entries, then takes % a day: scheduling_settings.%, catalog_new_per_day)',
                    p_resource, v_new, v_size, v_recent, v_seed, v_per_day,
                    CASE v_list WHEN 'weapons' THEN 'catalog_seed' ELSE 'vehicle_catalog_seed' END
                USING ERRCODE = 'configuration_limit_exceeded';
        END IF;
    ELSIF p_resource = 'profile' THEN
        IF NOT @schema@.bf4ps_text_ok(p_data->>'battlelog_username', 200)
           OR NOT @schema@.bf4ps_text_ok(p_data->>'country_name', 200)
           OR NOT coalesce(@schema@.bf4ps_country_ok(p_data->>'country_code'), true)
           OR jsonb_typeof(p_data->'battlelog_user_id') = 'number'
              AND (p_data->>'battlelog_user_id')::numeric <= 0 THEN
            RAISE EXCEPTION 'a profile has a username and country name without control, bidirectional, zero-width or invisible characters, an ISO 3166-1 alpha-2 country_code if any, and a battlelog_user_id > 0 if any'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
END;
$$;
