-- Successful finalization of a `profile` job, its tables (a part of
-- bf4ps_succeed_job): the Battlelog account behind the soldier, fetched by
-- its current name `p_current_name` (a lease never writes another
-- account), into battlelog_profiles (by username) and profile_soldiers.
-- A `not_found` account is an answer too (0018). Returns whether the
-- country or the access state changed. Bad input is refused (SQLSTATE
-- 22023), writing nothing.
--
-- owner: migrator
-- execute: bf4ps_definer
CREATE OR REPLACE FUNCTION @schema@.bf4ps_store_profile(
    p_soldier_id bigint, p_current_name text, p_data jsonb, p_now timestamptz,
    OUT changed boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_profile bigint;
BEGIN
    -- The account is the soldier's: its user page was fetched by the
    -- soldier's current name (a lease never writes another account).
    IF lower(btrim(p_data->>'battlelog_username')) IS DISTINCT FROM lower(btrim(p_current_name)) THEN
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
      INTO changed
    FROM @schema@.battlelog_profiles AS b
    WHERE lower(b.battlelog_username) = lower(btrim(p_data->>'battlelog_username'));
    changed := coalesce(changed, true);
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
    VALUES (v_profile, p_soldier_id, p_now, p_now)
    ON CONFLICT (profile_id, soldier_id) DO UPDATE SET last_seen_at = p_now;
END;
$$;
