-- The live collectors of lane `p_lane` at `p_at`, as the egress shares
-- count them: enabled, undrained, unretired, not marked lost and their last
-- heartbeat within heartbeat_lost_after. Each with its host (the login role
-- that registered it; a collector registered before 0012 recorded none:
-- its key is its host), its key and when it started. One definition for
-- the newcomers of both lanes and the key turns of the budget. A
-- SQL-standard body: bound at creation.
--
-- owner: migrator
-- execute: bf4ps_definer
CREATE OR REPLACE FUNCTION @schema@.bf4ps_live_collectors(p_lane text, p_at timestamptz)
RETURNS TABLE (host text, egress_key text, started_at timestamptz)
LANGUAGE sql STABLE
BEGIN ATOMIC
    SELECT coalesce(cs.registered_by, '(key) ' || c.egress_key), c.egress_key, c.started_at
    FROM @schema@.collectors AS c
    LEFT JOIN @schema@.collector_secrets AS cs ON cs.collector_uuid = c.collector_uuid
    CROSS JOIN @schema@.scheduling_settings AS s
    WHERE c.lane = p_lane AND c.enabled AND NOT c.drained
      AND c.retired_at IS NULL AND c.heartbeat_state <> 'lost'
      AND c.last_heartbeat_at > p_at - s.heartbeat_lost_after;
END;
