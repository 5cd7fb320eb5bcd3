-- The state columns of one resource after an outcome, in the one statement
-- every outcome uses: the group of `p_resource` gets the new values (as of
-- `p_now`), the three others keep theirs. Creates the row if the soldier
-- has none. (0019) The soldier's row is locked first, as BF4PS's
-- discovery locks it first (its sighting upserts the soldier, then its
-- source and state, whose triggers touch feeder_pairs): an outcome and a
-- sighting of one soldier queue on that row and never deadlock through
-- collection_state and feeder_pairs.
--
-- owner: migrator
-- execute: bf4ps_definer
CREATE OR REPLACE FUNCTION @schema@.bf4ps_record_outcome(
    p_soldier_id bigint, p_resource text, p_state text, p_success boolean,
    p_next_due_at timestamptz, p_failures integer, p_error_class text, p_error_message text,
    p_now timestamptz)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    PERFORM 1 FROM @schema@.soldiers AS so WHERE so.soldier_id = p_soldier_id
    FOR NO KEY UPDATE;
    FOR attempt IN 1..2 LOOP
        UPDATE @schema@.collection_state AS s SET
            detailed_state = CASE WHEN p_resource = 'detailed' THEN p_state ELSE s.detailed_state END,
            detailed_last_attempt_at = CASE WHEN p_resource = 'detailed' THEN p_now ELSE s.detailed_last_attempt_at END,
            detailed_last_success_at = CASE WHEN p_resource = 'detailed' AND p_success THEN p_now ELSE s.detailed_last_success_at END,
            detailed_next_due_at = CASE WHEN p_resource = 'detailed' THEN p_next_due_at ELSE s.detailed_next_due_at END,
            detailed_consecutive_failures = CASE WHEN p_resource = 'detailed' THEN p_failures ELSE s.detailed_consecutive_failures END,
            detailed_last_error_class = CASE WHEN p_resource = 'detailed' THEN p_error_class ELSE s.detailed_last_error_class END,
            detailed_last_error_message = CASE WHEN p_resource = 'detailed' THEN p_error_message ELSE s.detailed_last_error_message END,
            profile_state = CASE WHEN p_resource = 'profile' THEN p_state ELSE s.profile_state END,
            profile_last_attempt_at = CASE WHEN p_resource = 'profile' THEN p_now ELSE s.profile_last_attempt_at END,
            profile_last_success_at = CASE WHEN p_resource = 'profile' AND p_success THEN p_now ELSE s.profile_last_success_at END,
            profile_next_due_at = CASE WHEN p_resource = 'profile' THEN p_next_due_at ELSE s.profile_next_due_at END,
            profile_consecutive_failures = CASE WHEN p_resource = 'profile' THEN p_failures ELSE s.profile_consecutive_failures END,
            profile_last_error_class = CASE WHEN p_resource = 'profile' THEN p_error_class ELSE s.profile_last_error_class END,
            profile_last_error_message = CASE WHEN p_resource = 'profile' THEN p_error_message ELSE s.profile_last_error_message END,
            weapons_state = CASE WHEN p_resource = 'weapons' THEN p_state ELSE s.weapons_state END,
            weapons_last_attempt_at = CASE WHEN p_resource = 'weapons' THEN p_now ELSE s.weapons_last_attempt_at END,
            weapons_last_success_at = CASE WHEN p_resource = 'weapons' AND p_success THEN p_now ELSE s.weapons_last_success_at END,
            weapons_next_due_at = CASE WHEN p_resource = 'weapons' THEN p_next_due_at ELSE s.weapons_next_due_at END,
            weapons_consecutive_failures = CASE WHEN p_resource = 'weapons' THEN p_failures ELSE s.weapons_consecutive_failures END,
            weapons_last_error_class = CASE WHEN p_resource = 'weapons' THEN p_error_class ELSE s.weapons_last_error_class END,
            weapons_last_error_message = CASE WHEN p_resource = 'weapons' THEN p_error_message ELSE s.weapons_last_error_message END,
            vehicles_state = CASE WHEN p_resource = 'vehicles' THEN p_state ELSE s.vehicles_state END,
            vehicles_last_attempt_at = CASE WHEN p_resource = 'vehicles' THEN p_now ELSE s.vehicles_last_attempt_at END,
            vehicles_last_success_at = CASE WHEN p_resource = 'vehicles' AND p_success THEN p_now ELSE s.vehicles_last_success_at END,
            vehicles_next_due_at = CASE WHEN p_resource = 'vehicles' THEN p_next_due_at ELSE s.vehicles_next_due_at END,
            vehicles_consecutive_failures = CASE WHEN p_resource = 'vehicles' THEN p_failures ELSE s.vehicles_consecutive_failures END,
            vehicles_last_error_class = CASE WHEN p_resource = 'vehicles' THEN p_error_class ELSE s.vehicles_last_error_class END,
            vehicles_last_error_message = CASE WHEN p_resource = 'vehicles' THEN p_error_message ELSE s.vehicles_last_error_message END,
            updated_at = p_now
        WHERE s.soldier_id = p_soldier_id;
        EXIT WHEN FOUND;
        INSERT INTO @schema@.collection_state (soldier_id) VALUES (p_soldier_id)
        ON CONFLICT (soldier_id) DO NOTHING;
    END LOOP;
END;
$$;
