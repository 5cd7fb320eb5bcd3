-- 0007: Battlelog as it really behaves (issue 13).
--   * egress_gates.paused_until / throttle_streak: a throttled answer
--     (HTTP 401/403/429) pauses the whole egress key, for a cool-down that
--     doubles while throttling continues; a success resets the streak;
--   * egress_budget: the slot of the fleet-wide budget of background
--     requests (one row), spaced window / budget apart;
--   * bf4ps_egress_pass(): the gate in one statement — it grants a request
--     now, or reserves nothing and says how long to wait;
--   * collection_jobs.throttled_attempts: attempts that ended throttled;
--     they never count towards the attempt limit;
--   * event_rollup_hourly.failed_throttled / failed_http: the new classes
--     (failed_rate_limited stays for events of older versions);
--   * scheduling_settings.egress_rate (the ETA's input until serve
--     publishes its own) defaults to the safe rate, 0.2 requests/s.
--
-- RELEASED once merged: never edit this file. Add a new migration instead.

ALTER TABLE egress_gates
    ADD COLUMN paused_until timestamptz,
    ADD COLUMN throttle_streak integer NOT NULL DEFAULT 0,
    ADD CONSTRAINT egress_gates_throttle_streak_check CHECK (throttle_streak >= 0);

-- One row: the next instant a background request may go, fleet-wide.
CREATE TABLE egress_budget (
    singleton boolean PRIMARY KEY DEFAULT true,
    next_slot_at timestamptz NOT NULL DEFAULT now(),
    passes bigint NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT egress_budget_singleton CHECK (singleton),
    CONSTRAINT egress_budget_passes_check CHECK (passes >= 0)
);

INSERT INTO egress_budget DEFAULT VALUES;

-- Written only by failure finalization (no CHECK: it would be evaluated on
-- every claim, start and renewal of the hot path).
ALTER TABLE collection_jobs
    ADD COLUMN throttled_attempts integer NOT NULL DEFAULT 0;

ALTER TABLE event_rollup_hourly
    ADD COLUMN failed_throttled bigint NOT NULL DEFAULT 0,
    ADD COLUMN failed_http bigint NOT NULL DEFAULT 0;

ALTER TABLE scheduling_settings ALTER COLUMN egress_rate SET DEFAULT 0.2;
UPDATE scheduling_settings SET egress_rate = 0.2, updated_at = now() WHERE egress_rate = 5;

-- One pass of the egress gate for a request on `p_key`, on the database's
-- clock. The request may go now when the key's next slot, the key's pause
-- and (with p_budget_spacing_us > 0: background requests) the fleet
-- budget's next slot have all passed. Then the key's slot moves
-- p_spacing_us on and the budget's p_budget_spacing_us on, and `granted` is
-- true. Otherwise nothing is reserved and `wait_us` says when to try again:
-- no slot is ever booked in the future, so a paused or busy key never holds
-- the fleet budget (and other keys) back.
-- Locks: the budget row first, then the key row (every caller alike).
CREATE FUNCTION bf4ps_egress_pass(p_key text, p_spacing_us bigint, p_budget_spacing_us bigint)
RETURNS TABLE (granted boolean, wait_us bigint, throttle_streak integer, paused boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_budget timestamptz;
    v_next timestamptz;
    v_paused timestamptz;
    v_streak integer;
    v_now timestamptz;
    v_at timestamptz;
BEGIN
    IF p_budget_spacing_us > 0 THEN
        SELECT b.next_slot_at INTO v_budget
        FROM egress_budget b WHERE b.singleton FOR UPDATE;
    END IF;
    SELECT g.next_slot_at, g.paused_until, g.throttle_streak INTO v_next, v_paused, v_streak
    FROM egress_gates g WHERE g.egress_key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO egress_gates (egress_key, next_slot_at, passes)
        VALUES (p_key, '-infinity', 0)
        ON CONFLICT (egress_key) DO NOTHING;
        SELECT g.next_slot_at, g.paused_until, g.throttle_streak INTO v_next, v_paused, v_streak
        FROM egress_gates g WHERE g.egress_key = p_key FOR UPDATE;
    END IF;
    -- After the locks: a wait for them must not make the slot stale.
    v_now := clock_timestamp();
    -- greatest() ignores NULLs (no pause, budget off).
    v_at := greatest(v_next, v_paused, v_budget);
    IF v_at > v_now THEN
        RETURN QUERY SELECT false,
            ceil(extract(epoch FROM v_at - v_now) * 1000000)::bigint,
            v_streak,
            coalesce(v_paused > v_now, false);
        RETURN;
    END IF;
    UPDATE egress_gates g
    SET next_slot_at = v_now + p_spacing_us * interval '1 microsecond',
        passes = g.passes + 1,
        updated_at = v_now
    WHERE g.egress_key = p_key;
    IF p_budget_spacing_us > 0 THEN
        UPDATE egress_budget b
        SET next_slot_at = v_now + p_budget_spacing_us * interval '1 microsecond',
            passes = b.passes + 1,
            updated_at = v_now
        WHERE b.singleton;
    END IF;
    RETURN QUERY SELECT true, 0::bigint, v_streak, false;
END;
$$;

-- Least privilege (migration 0006): what collectors and readers need of
-- the new objects.
REVOKE ALL ON FUNCTION bf4ps_egress_pass(text, bigint, bigint) FROM PUBLIC;
GRANT SELECT, UPDATE ON egress_budget TO bf4ps_collector;
GRANT UPDATE (throttled_attempts) ON collection_jobs TO bf4ps_collector;
GRANT EXECUTE ON FUNCTION bf4ps_egress_pass(text, bigint, bigint) TO bf4ps_collector;
GRANT SELECT ON egress_budget TO bf4ps_reader;
