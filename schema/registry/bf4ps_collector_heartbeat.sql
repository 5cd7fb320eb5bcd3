-- One heartbeat of the incarnation holding `p_secret` (0006): routine ones
-- update last_heartbeat_at only; after an outage exactly one
-- heartbeat_restored. Returns the operator's verdict.
--
-- Rated (issue 37): a healthy incarnation's heartbeat within a sixth of the
-- published heartbeat_lost_after of its last recorded one (5 s of 30 s by
-- default: half the collectors' default 10 s interval) writes nothing and
-- only answers, so a loop of calls costs reads, not WAL; the recorded
-- heartbeats stay at most a sixth of heartbeat_lost_after plus the caller's
-- interval apart, far inside heartbeat_lost_after. It never waits for a
-- lock: the collector's row is locked with SKIP LOCKED, and while another
-- transaction holds it (the collector's own claim or finalization) this
-- heartbeat answers from an unlocked read and records nothing (the next one
-- does).
--
-- owner: bf4ps_definer
-- execute: bf4ps_collector
CREATE OR REPLACE FUNCTION @schema@.bf4ps_collector_heartbeat(p_uuid uuid, p_secret uuid)
RETURNS TABLE (retired boolean, claimable boolean, restored boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    c record;
BEGIN
    PERFORM @schema@.bf4ps_collector_check_secret(p_uuid, p_secret);
    SELECT x.heartbeat_state, x.enabled, x.drained, x.last_heartbeat_at INTO c
    FROM @schema@.collectors AS x
    WHERE x.collector_uuid = p_uuid AND x.retired_at IS NULL;
    IF NOT FOUND THEN
        retired := true;
        claimable := false;
        restored := false;
        RETURN NEXT;
        RETURN;
    END IF;
    IF c.heartbeat_state = 'healthy' AND c.last_heartbeat_at <= now()
       AND c.last_heartbeat_at > now() - (
           SELECT s.heartbeat_lost_after / 6 FROM @schema@.scheduling_settings AS s) THEN
        -- Recorded recently enough: answer only.
        retired := false;
        claimable := c.enabled AND NOT c.drained;
        restored := false;
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT x.heartbeat_state, x.enabled, x.drained INTO c
    FROM @schema@.collectors AS x
    WHERE x.collector_uuid = p_uuid AND x.retired_at IS NULL
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        -- Locked by another transaction (or retired meanwhile): answer from
        -- the unlocked read, record nothing now.
        SELECT x.heartbeat_state, x.enabled, x.drained INTO c
        FROM @schema@.collectors AS x
        WHERE x.collector_uuid = p_uuid AND x.retired_at IS NULL;
        retired := NOT FOUND;
        claimable := FOUND AND c.enabled AND NOT c.drained;
        restored := false;
        RETURN NEXT;
        RETURN;
    END IF;
    IF c.heartbeat_state = 'lost' THEN
        INSERT INTO @schema@.collection_events
            (collector_uuid, collector_name_snapshot, hostname_snapshot, egress_key_snapshot,
             lane, event_type, metadata)
        SELECT x.collector_uuid, x.collector_name, x.hostname, x.egress_key, x.lane,
               'heartbeat_restored',
               jsonb_build_object(
                   'lost_at', x.heartbeat_lost_at,
                   'last_heartbeat_at', x.last_heartbeat_at,
                   'outage_ms', CASE WHEN isfinite(x.heartbeat_lost_at)
                                     THEN floor(extract(epoch FROM now() - x.heartbeat_lost_at) * 1000)
                                END)
        FROM @schema@.collectors AS x WHERE x.collector_uuid = p_uuid;
    END IF;
    UPDATE @schema@.collectors AS x
    SET last_heartbeat_at = now(), heartbeat_state = 'healthy', heartbeat_lost_at = NULL,
        updated_at = now()
    WHERE x.collector_uuid = p_uuid;
    retired := false;
    claimable := c.enabled AND NOT c.drained;
    restored := c.heartbeat_state = 'lost';
    RETURN NEXT;
END;
$$;
