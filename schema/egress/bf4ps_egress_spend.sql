-- Spends the grant of a claim made at `p_at` (after bf4ps_egress_gate said
-- the key may go and locked the rows, and only when a job was claimed with
-- it): the key's next slot moves `p_spacing` (the published egress_spacing)
-- on. Under the budget (`p_budget_spacing` given) the budget's next slot
-- moves budget_spacing on; when the grant was the host's own share
-- (`p_entitled`), the host's own next budget slot moves budget_spacing x
-- (the hosts that took their own share in the last minute, this one
-- included, and the newcomers: bf4ps_egress_budget_newcomer) on: no host
-- takes more than its fair share while others spend or come for theirs,
-- whatever its keys, and a lone host may take the whole budget. A grant
-- taken from a slot nobody entitled took moves no host's slot, counts no
-- host and passes over the newcomers (the host's budget_passed_at). The
-- key's own budget slot moves budget_spacing x (its host's unpaused keys
-- with a budgeted grant in the last minute or a live background collector:
-- enabled, undrained, unretired, its last heartbeat within
-- heartbeat_lost_after and not marked lost) on: the keys of one host take
-- turns, a key counted from its collector's start, not from its first grant
-- (one that never won a race would count in no turn). On the interactive
-- lane (`p_interactive`, entitled) the host's interactive claims count one
-- more; a host that claimed none in the last minute first takes the least of
-- the hosts that did (it neither banks credit nor keeps a debt while away).
-- A grant on the interactive lane that was not the host's own share (a job
-- that waited a second) passes over the newcomers (bf4ps_egress_newcomer):
-- the host's interactive_passed_at. `p_host` is the login role that
-- registered the caller.
--
-- Generic plans (plan_cache_mode): the custom ones were made anew at every
-- call (~0.04 ms for the key's update, more than the update).
--
-- owner: migrator
-- execute: bf4ps_definer
CREATE OR REPLACE FUNCTION @schema@.bf4ps_egress_spend(
    p_key text, p_host text, p_spacing interval, p_budget_spacing interval,
    p_interactive boolean, p_entitled boolean, p_at timestamptz)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @schema@, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    IF p_budget_spacing IS NOT NULL THEN
        UPDATE @schema@.egress_budget AS b
        SET next_slot_at = p_at + p_budget_spacing, passes = b.passes + 1, updated_at = p_at
        WHERE b.singleton;
        IF p_entitled THEN
            UPDATE @schema@.egress_hosts AS h
            SET budget_next_at = p_at + p_budget_spacing * (
                    SELECT count(*) + 1 FROM (
                        SELECT o.host FROM @schema@.egress_hosts AS o
                        WHERE o.budget_spent_at > p_at - interval '1 minute'
                          AND o.host <> p_host
                        UNION
                        SELECT n.host
                        FROM @schema@.bf4ps_egress_budget_newcomer(p_host, p_at,
                                                                    p_budget_spacing) AS n
                    ) AS k),
                budget_spent_at = p_at, updated_at = p_at
            WHERE h.host = p_host;
        ELSE
            UPDATE @schema@.egress_hosts AS h
            SET budget_passed_at = p_at, updated_at = p_at
            WHERE h.host = p_host;
        END IF;
    ELSIF p_interactive AND p_entitled THEN
        UPDATE @schema@.egress_hosts AS h
        SET interactive_claims = CASE
                WHEN h.interactive_at > p_at - interval '1 minute' THEN h.interactive_claims
                ELSE coalesce((
                    SELECT min(o.interactive_claims) FROM @schema@.egress_hosts AS o
                    WHERE o.host <> p_host AND o.interactive_at > p_at - interval '1 minute'),
                    h.interactive_claims)
                END + 1,
            interactive_at = p_at, updated_at = p_at
        WHERE h.host = p_host;
    ELSIF p_interactive THEN
        UPDATE @schema@.egress_hosts AS h
        SET interactive_passed_at = p_at, updated_at = p_at
        WHERE h.host = p_host;
    END IF;
    UPDATE @schema@.egress_gates AS g
    SET next_slot_at = p_at + p_spacing, passes = g.passes + 1, updated_at = p_at, host = p_host,
        -- (A paused key wants it but may not use it: not counted.)
        budget_next_at = CASE WHEN p_budget_spacing IS NULL THEN g.budget_next_at
                              ELSE p_at + p_budget_spacing * (
                                  SELECT count(*) + 1 FROM (
                                      SELECT o.egress_key FROM @schema@.egress_gates AS o
                                      WHERE o.host = p_host AND o.egress_key <> p_key
                                        AND o.budget_spent_at > p_at - interval '1 minute'
                                        AND (o.paused_until IS NULL OR o.paused_until <= p_at)
                                      UNION
                                      SELECT c.egress_key
                                      FROM @schema@.bf4ps_live_collectors('background', p_at)
                                           AS c
                                      LEFT JOIN @schema@.egress_gates AS o
                                             ON o.egress_key = c.egress_key
                                      WHERE c.host = p_host AND c.egress_key <> p_key
                                        AND (o.paused_until IS NULL OR o.paused_until <= p_at)
                                  ) AS k) END,
        budget_spent_at = CASE WHEN p_budget_spacing IS NULL THEN g.budget_spent_at ELSE p_at END
    WHERE g.egress_key = p_key;
END;
$$;
