-- Successful finalization of a `detailed` job, its tables (a part of
-- bf4ps_succeed_job, which holds the job's lease and writes the state and
-- the event): `p_data`, the normalized document (docs/battlelog.md), must
-- hold detailed_stats_current's columns only (and the soldier's
-- `p_persona_id`), non-negative counters, at least one of them. Written
-- into detailed_stats_current as of `p_now`, quit_percentage and
-- longest_headshot rounded half-even to the column scale, and into
-- detailed_stats_history only when a quantized value differs from the
-- latest snapshot (observed_at = p_now). Bad input is refused (SQLSTATE
-- 22023), writing nothing.
--
-- owner: migrator
-- execute: bf4ps_definer
CREATE OR REPLACE FUNCTION @schema@.bf4ps_store_detailed(
    p_soldier_id bigint, p_persona_id bigint, p_data jsonb, p_now timestamptz,
    OUT changed boolean, OUT history_appended boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v detailed_stats_current;
BEGIN
    history_appended := false;
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
           AND (p_data->'persona_id') IS DISTINCT FROM to_jsonb(p_persona_id)) THEN
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
    v.soldier_id := p_soldier_id;
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
      INTO changed
    FROM @schema@.detailed_stats_history AS h
    WHERE h.soldier_id = p_soldier_id
    ORDER BY h.observed_at DESC, h.snapshot_id DESC
    LIMIT 1;
    changed := coalesce(changed, true);
    IF changed THEN
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
        history_appended := true;
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
END;
$$;
