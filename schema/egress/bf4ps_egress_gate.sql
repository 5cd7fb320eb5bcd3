-- The egress gate of one claim (0007, 0019, 0025): says when the key may
-- send its next request and, only when it may now, locks what the grant
-- will spend: the fleet budget's row first when `p_budget_spacing` is given
-- (a background claim while the budget is on), then the host's row
-- (`p_host`, the login role that registered the caller; only under the
-- budget or on the interactive lane, where the grant spends from it), then
-- the key's, each created at first use; every caller in this order. A
-- claim that may not go takes no lock and writes nothing (wanting costs the
-- wanter only).
--
-- `claim_at` is the time of the claim: `p_now`, or the database's clock
-- (read after the locks when it may go: a wait for them never makes a slot
-- stale; the scheduling simulation passes its virtual clock). `go_at` is the
-- latest of the key's next slot, its throttle pause and, under the budget,
-- the budget's next slot and the caller's share of it (NULL: nothing
-- restricts); the request may go when it is not after `claim_at`. `paused`:
-- the key is in a throttle pause.
--
-- The share (bf4ps_egress_spend moves it): the host's own next budget slot
-- and, within the host, the key's, which always binds. A caller whose
-- host's own slot has passed is `entitled`: it may take the budget's slot
-- as soon as it opens. Any other caller may take it when it has stayed
-- open half a budget spacing (no entitled host took it): work-conserving,
-- and such a grant moves no host's own slot.
--
-- On the interactive lane (`p_interactive`) a host that claimed nothing in
-- the last minute is entitled (a newcomer); one that did is entitled while
-- its interactive claims are at most one ahead of the least of the other
-- hosts' that claimed in the last minute, and no newcomer waits: another
-- host with a live interactive collector (bf4ps_egress_newcomer) that was
-- not passed over since it came. One that is not entitled takes no lock
-- (`locked` false) and the claim lets it take only a job that waited a
-- second (and so passes over the newcomers: bf4ps_egress_spend).
--
-- Generic plans (plan_cache_mode): its parameters prune the custom plans'
-- joins, so PostgreSQL kept planning the lockless read anew at every call
-- (~0.08 ms, more than the read).
--
-- owner: migrator
-- execute: bf4ps_definer
CREATE OR REPLACE FUNCTION @schema@.bf4ps_egress_gate(
    p_key text, p_host text, p_budget_spacing interval, p_interactive boolean,
    p_now timestamptz,
    OUT claim_at timestamptz, OUT go_at timestamptz, OUT paused boolean,
    OUT entitled boolean, OUT locked boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @schema@, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_budget timestamptz;
    v_next timestamptz;
    v_paused timestamptz;
    v_own timestamptz;
    v_host_own timestamptz;
    v_claims bigint;
    v_at timestamptz;
    v_least bigint;
    v_locked boolean := false;
BEGIN
    claim_at := coalesce(p_now, clock_timestamp());
    LOOP
        -- First a look without locks; then, if the claim may go, the same
        -- under the locks.
        IF v_locked THEN
            IF p_budget_spacing IS NOT NULL THEN
                SELECT b.next_slot_at INTO v_budget
                FROM @schema@.egress_budget AS b WHERE b.singleton FOR UPDATE;
            END IF;
            -- (The host's row only when the grant spends from it: the keys
            -- of one host do not queue on it for an unbudgeted background
            -- grant.)
            IF p_budget_spacing IS NOT NULL OR p_interactive THEN
                SELECT h.budget_next_at, h.interactive_claims, h.interactive_at
                  INTO v_host_own, v_claims, v_at
                FROM @schema@.egress_hosts AS h WHERE h.host = p_host FOR UPDATE;
                IF NOT FOUND THEN
                    INSERT INTO @schema@.egress_hosts (host) VALUES (p_host)
                    ON CONFLICT (host) DO NOTHING;
                    SELECT h.budget_next_at, h.interactive_claims, h.interactive_at
                      INTO v_host_own, v_claims, v_at
                    FROM @schema@.egress_hosts AS h WHERE h.host = p_host FOR UPDATE;
                END IF;
            END IF;
            SELECT g.next_slot_at, g.paused_until, g.budget_next_at INTO v_next, v_paused, v_own
            FROM @schema@.egress_gates AS g WHERE g.egress_key = p_key FOR UPDATE;
            IF NOT FOUND THEN
                INSERT INTO @schema@.egress_gates (egress_key, next_slot_at, passes, host)
                VALUES (p_key, '-infinity', 0, p_host)
                ON CONFLICT (egress_key) DO NOTHING;
                SELECT g.next_slot_at, g.paused_until, g.budget_next_at
                  INTO v_next, v_paused, v_own
                FROM @schema@.egress_gates AS g WHERE g.egress_key = p_key FOR UPDATE;
            END IF;
            claim_at := coalesce(p_now, clock_timestamp());
        ELSE
            -- (One statement: a claim that may not go costs one read.)
            SELECT b.next_slot_at, h.budget_next_at, h.interactive_claims, h.interactive_at,
                   g.next_slot_at, g.paused_until, g.budget_next_at
              INTO v_budget, v_host_own, v_claims, v_at, v_next, v_paused, v_own
            FROM (SELECT) AS one
            LEFT JOIN @schema@.egress_budget AS b
                   ON p_budget_spacing IS NOT NULL AND b.singleton
            LEFT JOIN @schema@.egress_hosts AS h
                   ON (p_budget_spacing IS NOT NULL OR p_interactive) AND h.host = p_host
            LEFT JOIN @schema@.egress_gates AS g ON g.egress_key = p_key;
        END IF;
        IF p_budget_spacing IS NOT NULL THEN
            -- The host's own slot passed (or none yet): entitled at the
            -- budget's slot; otherwise half a spacing after it. The key's
            -- own slot (its turn among its host's keys) always binds
            -- (greatest ignores NULLs).
            entitled := coalesce(v_host_own <= claim_at, true);
            go_at := greatest(v_next, v_paused, v_budget, v_own,
                              least(coalesce(v_host_own, '-infinity'),
                                    v_budget + p_budget_spacing / 2));
        ELSE
            IF p_interactive AND v_at > claim_at - interval '1 minute' THEN
                SELECT min(h.interactive_claims) INTO v_least
                FROM @schema@.egress_hosts AS h
                WHERE h.host <> p_host AND h.interactive_at > claim_at - interval '1 minute';
                entitled := v_least IS NULL OR v_claims <= v_least + 1;
                -- (Looked for only when it decides: a newcomer costs the
                -- hosts ahead of it one read.)
                IF entitled THEN
                    entitled := NOT EXISTS (
                        SELECT 1 FROM @schema@.bf4ps_egress_newcomer(p_host, claim_at) AS n);
                END IF;
            ELSE
                entitled := true;
            END IF;
            go_at := greatest(v_next, v_paused);
        END IF;
        paused := coalesce(v_paused > claim_at, false);
        -- (An interactive caller that is not entitled takes no lock: the
        -- claim looks for a job that waited long enough first.)
        EXIT WHEN v_locked OR go_at > claim_at OR (p_interactive AND NOT entitled);
        v_locked := true;
    END LOOP;
    locked := v_locked;
END;
$$;
