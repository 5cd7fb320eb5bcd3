-- The egress gate of one claim (0007, 0019): locks what the grant will
-- spend (the fleet budget's row first when `p_budget_spacing` is given,
-- that is for a background claim while the budget is on, then the key's
-- row, created at first use; every caller in this order) and says when the
-- key may send its next request.
--
-- `claim_at` is the time of the claim: `p_now`, or the database's clock read
-- after the locks (NULL: so a wait for them never makes a slot stale; the
-- scheduling simulation passes its virtual clock). `go_at` is the latest of
-- the key's next slot, its throttle pause and, under the budget, the
-- budget's next slot and the key's own next budget slot (NULL: nothing
-- restricts); the request may go when it is not after `claim_at`. `paused`: the
-- key is in a throttle pause. A key under the budget is marked as wanting
-- it, so it counts in everyone's fair share (bf4ps_egress_spend).
--
-- owner: migrator
-- execute: bf4ps_definer
CREATE OR REPLACE FUNCTION @schema@.bf4ps_egress_gate(
    p_key text, p_budget_spacing interval, p_now timestamptz,
    OUT claim_at timestamptz, OUT go_at timestamptz, OUT paused boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
DECLARE
    v_budget timestamptz;
    v_next timestamptz;
    v_paused timestamptz;
    v_own timestamptz;
BEGIN
    IF p_budget_spacing IS NOT NULL THEN
        SELECT b.next_slot_at INTO v_budget
        FROM @schema@.egress_budget AS b WHERE b.singleton FOR UPDATE;
    END IF;
    SELECT g.next_slot_at, g.paused_until, g.budget_next_at INTO v_next, v_paused, v_own
    FROM @schema@.egress_gates AS g WHERE g.egress_key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO @schema@.egress_gates (egress_key, next_slot_at, passes)
        VALUES (p_key, '-infinity', 0)
        ON CONFLICT (egress_key) DO NOTHING;
        SELECT g.next_slot_at, g.paused_until, g.budget_next_at INTO v_next, v_paused, v_own
        FROM @schema@.egress_gates AS g WHERE g.egress_key = p_key FOR UPDATE;
    END IF;
    claim_at := coalesce(p_now, clock_timestamp());
    IF p_budget_spacing IS NOT NULL THEN
        -- This key wants the budget: it counts in everyone's fair share.
        UPDATE @schema@.egress_gates AS g SET budget_wanted_at = claim_at
        WHERE g.egress_key = p_key;
    ELSE
        v_own := NULL;
    END IF;
    -- greatest() ignores NULLs (no pause, budget off).
    go_at := greatest(v_next, v_paused, v_budget, v_own);
    paused := coalesce(v_paused > claim_at, false);
END;
$$;
