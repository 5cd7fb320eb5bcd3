-- Successful finalization, the contract's steps in one transaction, for the
-- unexpired running lease of incarnation `p_uuid` (no row: the lease is
-- lost, nothing is written), as of `p_now` (bf4ps_collector_succeed: the
-- database's clock). `p_data` is the normalized document of the job's resource
-- (docs/battlelog.md), written into BF4PS's tables as of p_now:
--   detailed  detailed_stats_current (quit_percentage and longest_headshot
--             rounded half-even to the column scale), and a
--             detailed_stats_history snapshot only when a quantized counter
--             differs from the latest snapshot (observed_at = p_now);
--   weapons / vehicles  the catalog upserted in guid order under the
--             catalog's row lock (one writer at a time, so concurrent
--             finalizations never deadlock), then the soldier's set
--             replaced as a whole (a null counter is 0 where BF4PS's column
--             is NOT NULL);
--   profile   battlelog_profiles (by username) and profile_soldiers.
-- Then collection_state (success; next due after the published cadence of
-- the resource, a `not_found` profile too: 0018), `succeeded` with
-- the registry's snapshots, current_job_id cleared, the job deleted, and
-- the key's throttle streak ended (Battlelog answered). Bad input is
-- refused (SQLSTATE 22023), writing nothing.
--
-- owner: migrator
-- execute: bf4ps_definer
CREATE OR REPLACE FUNCTION @schema@.bf4ps_succeed_job(
    p_uuid uuid, p_job_id bigint, p_lease_token uuid,
    p_data jsonb, p_duration_ms bigint, p_http_status integer, p_now timestamptz)
RETURNS TABLE (
    changed boolean,
    history_appended boolean,
    previous_success_at timestamptz,
    next_due_at timestamptz
)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    j record;
    v detailed_stats_current;
    v_changed boolean;
    v_hist boolean := false;
    v_prev timestamptz;
    v_next timestamptz;
    v_state text := 'success';
    v_cadence interval;
    v_profile bigint;
    v_fresh jsonb;
BEGIN
    IF p_duration_ms IS NULL OR p_duration_ms < 0 OR p_duration_ms > 86400000 THEN
        RAISE EXCEPTION 'duration_ms must be 0-86400000 (got %)', coalesce(p_duration_ms::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_http_status IS NULL OR NOT (p_http_status BETWEEN 200 AND 299
                                      OR (p_http_status = 404
                                          AND coalesce(p_data->>'access_state' = 'not_found',
                                                       false))) THEN
        RAISE EXCEPTION 'a success has a 2xx http_status, or 404 for a profile not found (got %)',
                coalesce(p_http_status::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_data IS NULL OR jsonb_typeof(p_data) <> 'object' THEN
        RAISE EXCEPTION 'data must be a JSON object'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    SELECT x.job_id, x.soldier_id, so.persona_id, so.platform, so.current_name, x.resource,
           x.lane, x.attempt_count, c.collector_name, c.hostname, c.egress_key
      INTO j
    FROM @schema@.collection_jobs AS x
    JOIN @schema@.soldiers AS so ON so.soldier_id = x.soldier_id
    JOIN @schema@.collectors AS c ON c.collector_uuid = x.collector_uuid
    WHERE x.job_id = p_job_id AND x.collector_uuid = p_uuid AND x.lease_token = p_lease_token
      AND x.status = 'running' AND x.lease_expires_at > p_now
    FOR UPDATE OF x;
    IF NOT FOUND THEN
        RETURN;
    END IF;

    IF p_http_status = 404 AND j.resource <> 'profile' THEN
        RAISE EXCEPTION 'only a profile job succeeds with 404 (an account Battlelog does not know)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    IF j.resource = 'detailed' THEN
        -- A detailed document: BF4PS's columns (and the persona it is for,
        -- which must be the job's), at least one of them.
        IF NOT ARRAY(SELECT jsonb_object_keys(p_data)) <@ (
               SELECT array_agg(a.attname::text) || 'persona_id'::text
               FROM pg_catalog.pg_attribute AS a
               WHERE a.attrelid = '@schema@.detailed_stats_current'::regclass
                 AND a.attnum > 0 AND NOT a.attisdropped
                 AND a.attname NOT IN ('soldier_id', 'source_fetched_at', 'updated_at'))
           OR NOT EXISTS (SELECT 1 FROM jsonb_object_keys(p_data) AS k(key)
                          WHERE k.key <> 'persona_id')
           OR (p_data ? 'persona_id'
               AND (p_data->'persona_id') IS DISTINCT FROM to_jsonb(j.persona_id)) THEN
            RAISE EXCEPTION 'detailed data must hold detailed_stats_current columns only (and the job''s persona_id)'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v := jsonb_populate_record(NULL::detailed_stats_current,
                 p_data - 'soldier_id' - 'source_fetched_at' - 'updated_at');
        IF EXISTS (SELECT 1 FROM jsonb_each(to_jsonb(v)) AS e
                   WHERE jsonb_typeof(e.value) = 'number' AND (e.value)::text::numeric < 0) THEN
            RAISE EXCEPTION 'detailed counters must not be negative'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v.soldier_id := j.soldier_id;
        v.quit_percentage := @schema@.bf4ps_round_half_even((p_data->>'quit_percentage')::numeric, 6);
        v.longest_headshot := @schema@.bf4ps_round_half_even((p_data->>'longest_headshot')::numeric, 4);
        IF v.quit_percentage = 'NaN'::numeric OR v.longest_headshot = 'NaN'::numeric THEN
            RAISE EXCEPTION 'quit_percentage and longest_headshot must be numbers'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v.source_fetched_at := p_now;
        v.updated_at := p_now;
        -- History only when a retained (quantized) value differs from the
        -- latest snapshot.
        SELECT (to_jsonb(h) - 'snapshot_id' - 'soldier_id' - 'observed_at')
               IS DISTINCT FROM (to_jsonb(v) - 'soldier_id' - 'source_fetched_at' - 'updated_at')
          INTO v_changed
        FROM @schema@.detailed_stats_history AS h
        WHERE h.soldier_id = j.soldier_id
        ORDER BY h.observed_at DESC, h.snapshot_id DESC
        LIMIT 1;
        v_changed := coalesce(v_changed, true);
        IF v_changed THEN
            INSERT INTO @schema@.detailed_stats_history (soldier_id,
                rank, time_played_seconds, assault_score, engineer_score, support_score,
                recon_score, commander_score, squad_score, vehicle_score, award_score,
                unlock_score, total_score, combat_score, conquest_score, rush_score,
                team_deathmatch_score, domination_score, obliteration_score, defuse_score,
                capture_the_flag_score, air_superiority_score, carrier_assault_score,
                chain_link_score, kills, deaths, kill_assists, wins, losses, shots_fired,
                shots_hit, repairs, revives, heals, resupplies, avenger_kills, savior_kills,
                suppression_assists, quit_percentage, flags_captured, flags_defended,
                dogtags_taken, vehicles_destroyed, vehicle_damage, headshots,
                longest_headshot, highest_kill_streak, nemesis_kills, highest_nemesis_streak,
                observed_at)
            VALUES (v.soldier_id,
                v.rank, v.time_played_seconds, v.assault_score, v.engineer_score,
                v.support_score, v.recon_score, v.commander_score, v.squad_score,
                v.vehicle_score, v.award_score, v.unlock_score, v.total_score,
                v.combat_score, v.conquest_score, v.rush_score, v.team_deathmatch_score,
                v.domination_score, v.obliteration_score, v.defuse_score,
                v.capture_the_flag_score, v.air_superiority_score, v.carrier_assault_score,
                v.chain_link_score, v.kills, v.deaths, v.kill_assists, v.wins, v.losses,
                v.shots_fired, v.shots_hit, v.repairs, v.revives, v.heals, v.resupplies,
                v.avenger_kills, v.savior_kills, v.suppression_assists, v.quit_percentage,
                v.flags_captured, v.flags_defended, v.dogtags_taken, v.vehicles_destroyed,
                v.vehicle_damage, v.headshots, v.longest_headshot, v.highest_kill_streak,
                v.nemesis_kills, v.highest_nemesis_streak,
                p_now);
            v_hist := true;
        END IF;
        INSERT INTO @schema@.detailed_stats_current AS d
        SELECT v.*
        ON CONFLICT (soldier_id) DO UPDATE SET
                rank = EXCLUDED.rank, time_played_seconds = EXCLUDED.time_played_seconds,
                assault_score = EXCLUDED.assault_score,
                engineer_score = EXCLUDED.engineer_score,
                support_score = EXCLUDED.support_score, recon_score = EXCLUDED.recon_score,
                commander_score = EXCLUDED.commander_score,
                squad_score = EXCLUDED.squad_score, vehicle_score = EXCLUDED.vehicle_score,
                award_score = EXCLUDED.award_score, unlock_score = EXCLUDED.unlock_score,
                total_score = EXCLUDED.total_score, combat_score = EXCLUDED.combat_score,
                conquest_score = EXCLUDED.conquest_score, rush_score = EXCLUDED.rush_score,
                team_deathmatch_score = EXCLUDED.team_deathmatch_score,
                domination_score = EXCLUDED.domination_score,
                obliteration_score = EXCLUDED.obliteration_score,
                defuse_score = EXCLUDED.defuse_score,
                capture_the_flag_score = EXCLUDED.capture_the_flag_score,
                air_superiority_score = EXCLUDED.air_superiority_score,
                carrier_assault_score = EXCLUDED.carrier_assault_score,
                chain_link_score = EXCLUDED.chain_link_score, kills = EXCLUDED.kills,
                deaths = EXCLUDED.deaths, kill_assists = EXCLUDED.kill_assists,
                wins = EXCLUDED.wins, losses = EXCLUDED.losses,
                shots_fired = EXCLUDED.shots_fired, shots_hit = EXCLUDED.shots_hit,
                repairs = EXCLUDED.repairs, revives = EXCLUDED.revives,
                heals = EXCLUDED.heals, resupplies = EXCLUDED.resupplies,
                avenger_kills = EXCLUDED.avenger_kills,
                savior_kills = EXCLUDED.savior_kills,
                suppression_assists = EXCLUDED.suppression_assists,
                quit_percentage = EXCLUDED.quit_percentage,
                flags_captured = EXCLUDED.flags_captured,
                flags_defended = EXCLUDED.flags_defended,
                dogtags_taken = EXCLUDED.dogtags_taken,
                vehicles_destroyed = EXCLUDED.vehicles_destroyed,
                vehicle_damage = EXCLUDED.vehicle_damage, headshots = EXCLUDED.headshots,
                longest_headshot = EXCLUDED.longest_headshot,
                highest_kill_streak = EXCLUDED.highest_kill_streak,
                nemesis_kills = EXCLUDED.nemesis_kills,
                highest_nemesis_streak = EXCLUDED.highest_nemesis_streak,
                source_fetched_at = EXCLUDED.source_fetched_at, updated_at = p_now;
    ELSIF j.resource = 'weapons' THEN
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
            DELETE FROM @schema@.soldier_weapon_stats AS w WHERE w.soldier_id = j.soldier_id
            RETURNING w.weapon_id, w.kills, w.headshots, w.shots_fired, w.shots_hit,
                      w.time_equipped_seconds
        ), fresh AS (
            SELECT f.* FROM jsonb_to_recordset(v_fresh) AS f(
                weapon_id bigint, kills bigint, headshots bigint, shots_fired bigint,
                shots_hit bigint, time_equipped_seconds bigint)
        )
        SELECT EXISTS ((SELECT * FROM old EXCEPT SELECT * FROM fresh)
                       UNION ALL (SELECT * FROM fresh EXCEPT SELECT * FROM old))
          INTO v_changed;
        INSERT INTO @schema@.soldier_weapon_stats
            (soldier_id, weapon_id, kills, headshots, shots_fired, shots_hit,
             time_equipped_seconds, source_fetched_at, updated_at)
        SELECT j.soldier_id, f.weapon_id, f.kills, f.headshots, f.shots_fired, f.shots_hit,
               f.time_equipped_seconds, p_now, p_now
        FROM jsonb_to_recordset(v_fresh) AS f(
            weapon_id bigint, kills bigint, headshots bigint, shots_fired bigint,
            shots_hit bigint, time_equipped_seconds bigint);
    ELSIF j.resource = 'vehicles' THEN
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
            DELETE FROM @schema@.soldier_vehicle_stats AS w WHERE w.soldier_id = j.soldier_id
            RETURNING w.vehicle_id, w.kills, w.time_in_seconds, w.destroy_x_in_y
        ), fresh AS (
            SELECT f.* FROM jsonb_to_recordset(v_fresh) AS f(
                vehicle_id bigint, kills bigint, time_in_seconds bigint, destroy_x_in_y bigint)
        )
        SELECT EXISTS ((SELECT * FROM old EXCEPT SELECT * FROM fresh)
                       UNION ALL (SELECT * FROM fresh EXCEPT SELECT * FROM old))
          INTO v_changed;
        INSERT INTO @schema@.soldier_vehicle_stats
            (soldier_id, vehicle_id, kills, time_in_seconds, destroy_x_in_y,
             source_fetched_at, updated_at)
        SELECT j.soldier_id, f.vehicle_id, f.kills, f.time_in_seconds, f.destroy_x_in_y,
               p_now, p_now
        FROM jsonb_to_recordset(v_fresh) AS f(
            vehicle_id bigint, kills bigint, time_in_seconds bigint, destroy_x_in_y bigint);
    ELSE
        -- profile: the Battlelog account behind the soldier.
        -- The account is the soldier's: its user page was fetched by the
        -- soldier's current name (a lease never writes another account).
        IF lower(btrim(p_data->>'battlelog_username')) IS DISTINCT FROM lower(btrim(j.current_name)) THEN
            RAISE EXCEPTION 'a profile is the account of the job''s soldier (battlelog_username = its current name)'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF NOT @schema@.bf4ps_name_ok(p_data->>'battlelog_username', 200)
           OR (p_data->>'access_state') IS NULL
           OR (p_data->>'access_state') NOT IN ('public_country', 'public_no_country',
                                                'friends_only', 'not_found')
           OR (p_data->>'country_code') !~ '^[A-Z]{2}$'
           OR length(p_data->>'country_name') > 200 THEN
            RAISE EXCEPTION 'a profile has a username (1-200 characters), an access_state of public_country, public_no_country, friends_only or not_found, and an upper-case two-letter country_code if any'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT (b.country_code, b.country_name, b.access_state)
               IS DISTINCT FROM (p_data->>'country_code', p_data->>'country_name',
                                 p_data->>'access_state')
          INTO v_changed
        FROM @schema@.battlelog_profiles AS b
        WHERE lower(b.battlelog_username) = lower(btrim(p_data->>'battlelog_username'));
        v_changed := coalesce(v_changed, true);
        INSERT INTO @schema@.battlelog_profiles AS b
            (battlelog_username, battlelog_user_id, country_code, country_name, access_state,
             last_checked_at, last_success_at, last_error)
        VALUES (btrim(p_data->>'battlelog_username'), (p_data->>'battlelog_user_id')::bigint,
                p_data->>'country_code', p_data->>'country_name', p_data->>'access_state',
                p_now, p_now, NULL)
        ON CONFLICT ((lower(battlelog_username))) DO UPDATE
        SET battlelog_user_id = coalesce(EXCLUDED.battlelog_user_id, b.battlelog_user_id),
            country_code = EXCLUDED.country_code, country_name = EXCLUDED.country_name,
            access_state = EXCLUDED.access_state, last_checked_at = p_now,
            last_success_at = p_now, last_error = NULL, updated_at = p_now
        RETURNING b.profile_id INTO v_profile;
        INSERT INTO @schema@.profile_soldiers AS ps (profile_id, soldier_id, first_seen_at, last_seen_at)
        VALUES (v_profile, j.soldier_id, p_now, p_now)
        ON CONFLICT (profile_id, soldier_id) DO UPDATE SET last_seen_at = p_now;
    END IF;

    SELECT CASE j.resource WHEN 'detailed' THEN s.refresh_detailed
                           WHEN 'profile' THEN s.refresh_profile
                           WHEN 'weapons' THEN s.refresh_weapons
                           ELSE s.refresh_vehicles END
      INTO v_cadence
    FROM @schema@.scheduling_settings AS s;
    SELECT CASE j.resource WHEN 'detailed' THEN st.detailed_last_success_at
                           WHEN 'profile' THEN st.profile_last_success_at
                           WHEN 'weapons' THEN st.weapons_last_success_at
                           ELSE st.vehicles_last_success_at END
      INTO v_prev
    FROM @schema@.collection_state AS st WHERE st.soldier_id = j.soldier_id;
    v_next := CASE WHEN v_state = 'success' THEN p_now + v_cadence END;
    PERFORM @schema@.bf4ps_record_outcome(j.soldier_id, j.resource, v_state, true, v_next, 0,
                                          NULL, NULL, p_now);

    INSERT INTO @schema@.collection_events
        (occurred_at, collector_uuid, collector_name_snapshot, hostname_snapshot,
         egress_key_snapshot, job_id, soldier_id, persona_id, platform, resource, lane,
         event_type, attempt_number, lease_token, result, duration_ms, http_status, metadata)
    VALUES (p_now, p_uuid, j.collector_name, j.hostname, j.egress_key, j.job_id, j.soldier_id,
            j.persona_id, j.platform, j.resource, j.lane, 'succeeded', j.attempt_count,
            p_lease_token, CASE WHEN v_changed THEN 'changed' ELSE 'unchanged' END,
            p_duration_ms, p_http_status,
            jsonb_build_object('previous_success_at', @schema@.bf4ps_sane_time(v_prev),
                               'changed', v_changed, 'history_appended', v_hist));
    UPDATE @schema@.collectors AS c SET current_job_id = NULL, updated_at = p_now
    WHERE c.collector_uuid = p_uuid AND c.current_job_id = p_job_id;
    DELETE FROM @schema@.collection_jobs AS x WHERE x.job_id = p_job_id;
    -- Battlelog answered on this key: its throttle streak ends, unless a pause
    -- is still running (this answer was in flight before it began).
    UPDATE @schema@.egress_gates AS g SET throttle_streak = 0, updated_at = p_now
    WHERE g.egress_key = j.egress_key AND g.throttle_streak > 0
      AND (g.paused_until IS NULL OR g.paused_until <= p_now);

    changed := v_changed;
    history_appended := v_hist;
    previous_success_at := @schema@.bf4ps_sane_time(v_prev);
    next_due_at := v_next;
    RETURN NEXT;
END;
$$;
