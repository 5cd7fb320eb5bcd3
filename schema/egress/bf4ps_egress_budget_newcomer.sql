-- The newcomers of the fleet budget at `p_at`, for a caller of host
-- `p_host`: the other hosts (the login role that registered the collector;
-- a collector registered before 0012 recorded none: its key is its host)
-- with a live background collector (enabled, undrained, unretired, its last
-- heartbeat within heartbeat_lost_after and not marked lost, its key not in
-- a throttle pause) that took no budget slot of their own in the last
-- minute and were not passed over since that collector started or the host
-- could last take its own slot: no host took a slot it was not entitled to
-- (egress_hosts.budget_passed_at) a budget spacing (`p_budget_spacing`) or
-- more after that. One row per such collector: its host and when it
-- started. A SQL-standard body: bound at creation.
--
-- owner: migrator
-- execute: bf4ps_definer
CREATE OR REPLACE FUNCTION @schema@.bf4ps_egress_budget_newcomer(
    p_host text, p_at timestamptz, p_budget_spacing interval)
RETURNS TABLE (host text, since timestamptz)
LANGUAGE sql STABLE
BEGIN ATOMIC
    SELECT n.host, n.started_at
    FROM @schema@.bf4ps_live_collectors('background', p_at) AS n
    LEFT JOIN @schema@.egress_hosts AS h ON h.host = n.host
    LEFT JOIN @schema@.egress_gates AS g ON g.egress_key = n.egress_key
    WHERE n.host <> p_host
      AND (g.paused_until IS NULL OR g.paused_until <= p_at)
      AND (h.budget_spent_at IS NULL OR h.budget_spent_at <= p_at - interval '1 minute')
      AND NOT EXISTS (
          SELECT 1 FROM @schema@.egress_hosts AS p
          WHERE p.budget_passed_at
                >= greatest(coalesce(n.started_at, '-infinity'), h.budget_next_at)
                   + p_budget_spacing);
END;
