-- The newcomers of the interactive lane at `p_at`, for a caller of host
-- `p_host`: the other hosts (the login role that registered the collector;
-- a collector registered before 0012 recorded none: its key is its host)
-- with a live interactive collector (enabled, undrained, unretired, its
-- last heartbeat within heartbeat_lost_after and not marked lost) that
-- claimed nothing on the interactive lane in the last minute and was not
-- passed over since that collector started or the host last claimed: no
-- host took a job that waited a second (an interactive grant that was not
-- its own share, egress_hosts.interactive_passed_at) a second or more after
-- that. One row per such collector: its host and when it started.
-- A SQL-standard body: bound at creation.
--
-- owner: migrator
-- execute: bf4ps_definer
CREATE OR REPLACE FUNCTION @schema@.bf4ps_egress_newcomer(p_host text, p_at timestamptz)
RETURNS TABLE (host text, since timestamptz)
LANGUAGE sql STABLE
BEGIN ATOMIC
    SELECT n.host, n.started_at
    FROM @schema@.bf4ps_live_collectors('interactive', p_at) AS n
    LEFT JOIN @schema@.egress_hosts AS h ON h.host = n.host
    WHERE n.host <> p_host
      AND (h.interactive_at IS NULL OR h.interactive_at <= p_at - interval '1 minute')
      AND NOT EXISTS (
          SELECT 1 FROM @schema@.egress_hosts AS p
          WHERE p.interactive_passed_at
                >= greatest(coalesce(n.started_at, '-infinity'), h.interactive_at)
                   + interval '1 second');
END;
