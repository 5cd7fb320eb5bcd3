-- Spends the grant of a claim made at `p_at` (after bf4ps_egress_gate said
-- the key may go, and only when a job was claimed with it): the key's next
-- slot moves `p_spacing` (the published egress_spacing) on; under the
-- budget (`p_budget_spacing` given), the budget's next slot moves
-- budget_spacing on and the key's own next budget slot budget_spacing x
-- (the unpaused keys that wanted the budget in the last minute, at least 1)
-- on: no key takes more than its fair share while others want it, and a
-- lone key may take the whole budget. The caller holds the rows' locks
-- (the gate took them).
--
-- owner: migrator
-- execute: bf4ps_definer
CREATE OR REPLACE FUNCTION @schema@.bf4ps_egress_spend(
    p_key text, p_spacing interval, p_budget_spacing interval, p_at timestamptz)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
DECLARE
    v_keys bigint;
BEGIN
    IF p_budget_spacing IS NOT NULL THEN
        -- (A paused key wants it but may not use it: not counted.)
        SELECT count(*) INTO v_keys
        FROM @schema@.egress_gates AS g
        WHERE g.budget_wanted_at > p_at - interval '1 minute'
          AND (g.paused_until IS NULL OR g.paused_until <= p_at);
        UPDATE @schema@.egress_budget AS b
        SET next_slot_at = p_at + p_budget_spacing, passes = b.passes + 1, updated_at = p_at
        WHERE b.singleton;
    END IF;
    UPDATE @schema@.egress_gates AS g
    SET next_slot_at = p_at + p_spacing, passes = g.passes + 1, updated_at = p_at,
        budget_next_at = CASE WHEN p_budget_spacing IS NULL THEN g.budget_next_at
                              ELSE p_at + p_budget_spacing * greatest(v_keys, 1) END
    WHERE g.egress_key = p_key;
END;
$$;
