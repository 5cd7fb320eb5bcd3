-- One claim with its grant, for incarnation `p_uuid` (enabled, undrained,
-- unretired, holding no job) at `p_now` (NULL: the database's clock read
-- after the locks, so a wait for them never makes a slot stale; the
-- scheduling simulation passes its virtual one).
--
-- The egress gate (0007) and the claim (bf4ps_claim_job) in one
-- transaction: the request may go when the key's next slot and pause have
-- passed and, for the background lane while the budget is on, the fleet
-- budget's next slot and the key's own next budget slot too. Then, and only
-- if a job is claimed, the grant is spent: the key's slot moves the
-- published egress_spacing on, the budget's budget_spacing on, and the
-- key's own budget slot budget_spacing x (unpaused keys that wanted the
-- budget in the last minute, at least 1) on, so no key takes more than its fair share
-- while others want it, and a lone key may take the whole budget.
--
-- Rows: none (nothing claimable, or the caller may not claim; nothing
-- spent); one without a job (granted false: wait wait_us, at most a day;
-- paused: Battlelog throttled the key); or the claimed job (granted true).
-- A caller the database says holds a job holds none (it claims): that
-- lease ends now and the caller claims anyway (after a restore or a lost
-- answer, the fleet collects again at once, not after the lease).
-- Locks: the budget row, then the key row (every caller alike); the
-- caller's collector row only when a job is claimed (or a lease freed), so
-- a claim waiting for the budget never holds up its own heartbeat.
--
-- owner: migrator
-- execute: bf4ps_definer
CREATE OR REPLACE FUNCTION @schema@.bf4ps_take_job(p_uuid uuid, p_start boolean, p_now timestamptz)
RETURNS TABLE (
    job_id bigint,
    soldier_id bigint,
    persona_id bigint,
    platform text,
    soldier_name text,
    resource text,
    lane text,
    priority_class text,
    attempt_count integer,
    lease_token uuid,
    lease_expires_at timestamptz,
    claimed_at timestamptz,
    created_at timestamptz,
    eligible_at timestamptz,
    budget_class text,
    granted boolean,
    wait_us bigint,
    paused boolean
)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_key text;
    v_lane text;
    v_spacing interval;
    v_budget_spacing interval;
    v_budget timestamptz;
    v_next timestamptz;
    v_paused timestamptz;
    v_own timestamptz;
    v_at timestamptz;
    v_now timestamptz;
    v_keys bigint;
    v_held bigint;
BEGIN
    SELECT c.egress_key, c.lane, c.current_job_id INTO v_key, v_lane, v_held
    FROM @schema@.collectors AS c
    WHERE c.collector_uuid = p_uuid AND c.enabled AND NOT c.drained AND c.retired_at IS NULL;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v_held IS NOT NULL THEN
        -- A collector claims only when it holds nothing, so the job the
        -- database says it holds is not held: the database went back in
        -- time (a restore, a failover that lost its tail) or the answer to
        -- an earlier claim was lost. That lease ends now (the monitor
        -- returns the job with lease_expired + reclaimed) and the caller
        -- claims at once.
        UPDATE @schema@.collection_jobs AS j
        SET lease_expires_at = least(j.lease_expires_at, clock_timestamp()),
            updated_at = clock_timestamp()
        WHERE j.job_id = v_held AND j.collector_uuid = p_uuid
          AND j.status IN ('claimed', 'running');
        UPDATE @schema@.collectors AS c SET current_job_id = NULL, updated_at = clock_timestamp()
        WHERE c.collector_uuid = p_uuid AND c.current_job_id = v_held;
    END IF;
    SELECT s.egress_spacing, CASE WHEN v_lane = 'background' THEN s.budget_spacing END
      INTO v_spacing, v_budget_spacing
    FROM @schema@.scheduling_settings AS s;
    IF v_budget_spacing IS NOT NULL THEN
        SELECT b.next_slot_at INTO v_budget
        FROM @schema@.egress_budget AS b WHERE b.singleton FOR UPDATE;
    END IF;
    SELECT g.next_slot_at, g.paused_until, g.budget_next_at INTO v_next, v_paused, v_own
    FROM @schema@.egress_gates AS g WHERE g.egress_key = v_key FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO @schema@.egress_gates (egress_key, next_slot_at, passes)
        VALUES (v_key, '-infinity', 0)
        ON CONFLICT (egress_key) DO NOTHING;
        SELECT g.next_slot_at, g.paused_until, g.budget_next_at INTO v_next, v_paused, v_own
        FROM @schema@.egress_gates AS g WHERE g.egress_key = v_key FOR UPDATE;
    END IF;
    v_now := coalesce(p_now, clock_timestamp());
    IF v_budget_spacing IS NOT NULL THEN
        -- This key wants the budget: it counts in everyone's fair share.
        UPDATE @schema@.egress_gates AS g SET budget_wanted_at = v_now
        WHERE g.egress_key = v_key;
    ELSE
        v_own := NULL;
    END IF;
    -- greatest() ignores NULLs (no pause, budget off).
    v_at := greatest(v_next, v_paused, v_budget, v_own);
    IF v_at > v_now THEN
        RETURN QUERY SELECT NULL::bigint, NULL::bigint, NULL::bigint, NULL::text, NULL::text,
            NULL::text, NULL::text, NULL::text, NULL::integer, NULL::uuid, NULL::timestamptz,
            NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::text, false,
            CASE WHEN v_at >= v_now + interval '1 day' THEN 86400000000::bigint
                 ELSE ceil(extract(epoch FROM v_at - v_now) * 1000000)::bigint END,
            coalesce(v_paused > v_now, false);
        RETURN;
    END IF;
    RETURN QUERY
    SELECT c.*, true, 0::bigint, false
    FROM @schema@.bf4ps_claim_job(p_uuid, p_start, v_now) AS c;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- The grant, spent by this claim.
    IF v_budget_spacing IS NOT NULL THEN
        -- (A paused key wants it but may not use it: not counted.)
        SELECT count(*) INTO v_keys
        FROM @schema@.egress_gates AS g
        WHERE g.budget_wanted_at > v_now - interval '1 minute'
          AND (g.paused_until IS NULL OR g.paused_until <= v_now);
        UPDATE @schema@.egress_budget AS b
        SET next_slot_at = v_now + v_budget_spacing, passes = b.passes + 1, updated_at = v_now
        WHERE b.singleton;
    END IF;
    UPDATE @schema@.egress_gates AS g
    SET next_slot_at = v_now + v_spacing, passes = g.passes + 1, updated_at = v_now,
        budget_next_at = CASE WHEN v_budget_spacing IS NULL THEN g.budget_next_at
                              ELSE v_now + v_budget_spacing * greatest(v_keys, 1) END
    WHERE g.egress_key = v_key;
END;
$$;
