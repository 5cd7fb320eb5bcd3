-- The claim, one layer: for incarnation `p_uuid` (enabled, undrained,
-- unretired) at `p_now` (NULL: the database's clock, read after the gate's
-- locks; the scheduling simulation passes its virtual clock), the egress
-- gate (bf4ps_egress_gate), the next eligible job of the collector's lane,
-- and, only if a job is claimed, the grant spent (bf4ps_egress_spend). The
-- job goes pending -> running (claimed when `p_start` is false: the
-- contract's two steps), current_job_id is set, `claimed` (then `started`)
-- is written with the registry's identity snapshots; the lease is the
-- published lease_duration.
--
-- Rows: none (nothing claimable, or the caller may not claim; nothing
-- spent); one without a job (granted false: wait wait_us, at most a day;
-- paused: Battlelog throttled the key); or the claimed job (granted true).
-- A caller the database says holds a job holds none (it claims): that
-- lease ends now and the caller claims anyway (after a restore or a lost
-- answer, the fleet collects again at once, not after the lease).
--
-- Which job: the contract's order (FOR UPDATE SKIP LOCKED, served by
-- ix_collection_jobs_claim_order). In the background lane, while the fleet
-- budget is on, the budget's shares decide the class first, BF4PS's way:
-- bootstrap while it used less than share_bootstrap_min of the budget in
-- the budget window, then retries below share_retry_min, then active work
-- below share_active_max, then (borrowing an unused share) bootstrap,
-- retries, and active work last: active work exceeds its share only when
-- nothing else waits. The shares are counted in budget_usage under the
-- budget's row lock (the gate holds it), so they hold across every host.
-- One class is one ordered read of ix_collection_jobs_budget_claim_order,
-- so the classes are tried in turn (at most three reads): one read in the
-- classes' order would sort the background working set.
--
-- Shares are per host (the login role that registered the caller, 0025):
-- the gate says whether the caller is entitled (its host's own share); an
-- interactive caller that is not may take only a job that waited a second.
--
-- Locks: none while the caller may not go (a denied claim writes nothing);
-- else the budget row, then the host's row (under the budget or on the
-- interactive lane), then the key's (every caller alike: the gate); the
-- caller's collector row only when a job is claimed (or a lease freed), so
-- a claim waiting for the budget never holds up its own heartbeat.
-- (Collectors call bf4ps_collector_claim.)
--
-- owner: migrator
-- execute: bf4ps_definer
CREATE OR REPLACE FUNCTION @schema@.bf4ps_claim_job(p_uuid uuid, p_start boolean, p_now timestamptz)
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
    s record;
    me record;
    g record;
    v_now timestamptz;
    v_budget_spacing interval;
    v_classes text[];
    v_class text;
    v_job bigint;
    v_budgeted boolean;
    v_active bigint;
    v_bootstrap bigint;
    v_retry bigint;
    v_interactive boolean;
    v_entitled boolean;
    v_until timestamptz;
    v_oldest timestamptz;
BEGIN
    SELECT c.collector_uuid, c.collector_name, c.hostname, c.egress_key, c.lane,
           c.current_job_id,
           -- The host: the login role that registered it (a collector
           -- registered before 0012 recorded none: its key is its host).
           coalesce((SELECT cs.registered_by FROM @schema@.collector_secrets AS cs
                     WHERE cs.collector_uuid = c.collector_uuid),
                    '(key) ' || c.egress_key) AS host
      INTO me
    FROM @schema@.collectors AS c
    WHERE c.collector_uuid = p_uuid AND c.enabled AND NOT c.drained AND c.retired_at IS NULL;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF me.current_job_id IS NOT NULL THEN
        -- A collector claims only when it holds nothing, so the job the
        -- database says it holds is not held: the database went back in
        -- time (a restore, a failover that lost its tail) or the answer to
        -- an earlier claim was lost. That lease ends now (the monitor
        -- returns the job with lease_expired + reclaimed) and the caller
        -- claims at once.
        UPDATE @schema@.collection_jobs AS j
        SET lease_expires_at = least(j.lease_expires_at, clock_timestamp()),
            updated_at = clock_timestamp()
        WHERE j.job_id = me.current_job_id AND j.collector_uuid = p_uuid
          AND j.status IN ('claimed', 'running');
        UPDATE @schema@.collectors AS c SET current_job_id = NULL, updated_at = clock_timestamp()
        WHERE c.collector_uuid = p_uuid AND c.current_job_id = me.current_job_id;
    END IF;
    SELECT x.egress_spacing, x.lease_duration, x.budget_spacing, x.budget_requests,
           x.budget_window, x.share_active_max, x.share_bootstrap_min, x.share_retry_min
      INTO s
    FROM @schema@.scheduling_settings AS x;
    v_budgeted := me.lane = 'background' AND s.budget_spacing IS NOT NULL;
    v_budget_spacing := CASE WHEN v_budgeted THEN s.budget_spacing END;
    v_interactive := me.lane = 'interactive';
    SELECT x.claim_at, x.go_at, x.paused, x.entitled, x.locked INTO g
    FROM @schema@.bf4ps_egress_gate(me.egress_key, me.host, v_budget_spacing, v_interactive,
                                    p_now) AS x;
    v_now := g.claim_at;
    v_entitled := g.entitled;
    v_until := v_now;
    IF v_interactive AND NOT g.entitled AND coalesce(g.go_at <= v_now, true) THEN
        -- Not this host's turn on the interactive lane (it is ahead of
        -- another host that claims): it may take only a job that waited a
        -- second (no entitled host came for it), so the lane is shared per
        -- host and no job waits for a host that does not come.
        SELECT min(j.eligible_at) INTO v_oldest
        FROM @schema@.collection_jobs AS j
        WHERE j.status = 'pending' AND j.lane = 'interactive' AND j.eligible_at <= v_now;
        IF v_oldest IS NULL THEN
            RETURN;
        END IF;
        v_until := v_now - interval '1 second';
        IF v_oldest > v_until THEN
            g.go_at := v_oldest + interval '1 second';
        ELSIF NOT g.locked THEN
            -- The key's gate alone, which locks.
            SELECT x.claim_at, x.go_at, x.paused, x.entitled, x.locked INTO g
            FROM @schema@.bf4ps_egress_gate(me.egress_key, me.host, NULL, false, p_now) AS x;
            v_now := g.claim_at;
            v_until := v_now - interval '1 second';
        END IF;
    END IF;
    IF g.go_at > v_now THEN
        RETURN QUERY SELECT NULL::bigint, NULL::bigint, NULL::bigint, NULL::text, NULL::text,
            NULL::text, NULL::text, NULL::text, NULL::integer, NULL::uuid, NULL::timestamptz,
            NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::text, false,
            CASE WHEN g.go_at >= v_now + interval '1 day' THEN 86400000000::bigint
                 ELSE ceil(extract(epoch FROM g.go_at - v_now) * 1000000)::bigint END,
            g.paused;
        RETURN;
    END IF;
    IF v_budgeted THEN
        SELECT coalesce(sum(u.grants) FILTER (WHERE u.budget_class = 'active'), 0),
               coalesce(sum(u.grants) FILTER (WHERE u.budget_class = 'bootstrap'), 0),
               coalesce(sum(u.grants) FILTER (WHERE u.budget_class = 'retry'), 0)
          INTO v_active, v_bootstrap, v_retry
        FROM @schema@.budget_usage AS u
        -- Every minute whose span overlaps the window (the current one
        -- included, whatever the window's length).
        WHERE u.minute + interval '1 minute' > v_now - s.budget_window AND u.minute <= v_now;
        v_classes := ARRAY[]::text[];
        IF v_bootstrap < s.share_bootstrap_min * s.budget_requests THEN
            v_classes := v_classes || 'bootstrap'::text;
        END IF;
        IF v_retry < s.share_retry_min * s.budget_requests THEN
            v_classes := v_classes || 'retry'::text;
        END IF;
        IF v_active < s.share_active_max * s.budget_requests THEN
            v_classes := v_classes || 'active'::text;
        END IF;
        -- Borrowing: an unused share goes to the other classes, active
        -- last (its share is a cap: it exceeds it only when nothing else
        -- waits).
        FOREACH v_class IN ARRAY ARRAY['bootstrap', 'retry', 'active'] LOOP
            IF NOT (v_class = ANY (v_classes)) THEN
                v_classes := v_classes || v_class;
            END IF;
        END LOOP;
    ELSE
        v_classes := ARRAY['any'];
    END IF;
    FOREACH v_class IN ARRAY v_classes LOOP
        IF v_class = 'any' THEN
            -- Served by ix_collection_jobs_claim_order.
            SELECT j.job_id INTO v_job
            FROM @schema@.collection_jobs AS j
            WHERE j.status = 'pending' AND j.lane = me.lane AND j.eligible_at <= v_until
            ORDER BY CASE j.priority_class
                         WHEN 'interactive' THEN 1
                         WHEN 'active' THEN 2
                         WHEN 'recent' THEN 3
                         WHEN 'bootstrap' THEN 4
                     END,
                     j.priority_value DESC, j.eligible_at, j.created_at, j.job_id
            FOR UPDATE SKIP LOCKED
            LIMIT 1;
        ELSE
            -- One class of the background lane, in the contract's order:
            -- served by ix_collection_jobs_budget_claim_order (0016), whose
            -- predicate the literal lane matches in a generic plan too.
            SELECT j.job_id INTO v_job
            FROM @schema@.collection_jobs AS j
            WHERE j.status = 'pending' AND j.lane = 'background' AND j.eligible_at <= v_now
              AND @schema@.bf4ps_budget_class(j.priority_class, j.last_error_at) = v_class
            ORDER BY CASE j.priority_class
                         WHEN 'interactive' THEN 1
                         WHEN 'active' THEN 2
                         WHEN 'recent' THEN 3
                         WHEN 'bootstrap' THEN 4
                     END,
                     j.priority_value DESC, j.eligible_at, j.created_at, j.job_id
            FOR UPDATE SKIP LOCKED
            LIMIT 1;
        END IF;
        EXIT WHEN v_job IS NOT NULL;
    END LOOP;
    IF v_job IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH claimed AS (
        UPDATE @schema@.collection_jobs AS j
        SET status = CASE WHEN p_start THEN 'running' ELSE 'claimed' END,
            collector_uuid = p_uuid,
            lease_token = gen_random_uuid(),
            claimed_at = v_now,
            started_at = CASE WHEN p_start THEN v_now END,
            lease_expires_at = v_now + s.lease_duration,
            attempt_count = j.attempt_count + 1,
            updated_at = v_now
        WHERE j.job_id = v_job
        RETURNING j.*
    ), job AS (
        SELECT c.*, so.persona_id AS s_persona_id, so.platform AS s_platform,
               so.current_name AS s_name,
               @schema@.bf4ps_sane_time(c.eligible_at) AS sane_eligible_at,
               CASE WHEN c.lane = 'background'
                    THEN @schema@.bf4ps_budget_class(c.priority_class, c.last_error_at) END AS b_class
        FROM claimed AS c JOIN @schema@.soldiers AS so ON so.soldier_id = c.soldier_id
    ), holder AS (
        UPDATE @schema@.collectors AS c
        SET current_job_id = claimed.job_id, updated_at = v_now
        FROM claimed
        WHERE c.collector_uuid = p_uuid
    ), usage AS (
        INSERT INTO @schema@.budget_usage AS u (minute, budget_class, grants)
        SELECT date_trunc('minute', v_now), job.b_class, 1 FROM job WHERE v_budgeted
        ON CONFLICT (minute, budget_class) DO UPDATE SET grants = u.grants + 1
    ), events AS (
        INSERT INTO @schema@.collection_events
            (occurred_at, collector_uuid, collector_name_snapshot, hostname_snapshot,
             egress_key_snapshot, job_id, soldier_id, persona_id, platform, resource, lane,
             event_type, attempt_number, lease_token, metadata)
        SELECT v_now, me.collector_uuid, me.collector_name, me.hostname, me.egress_key,
               c.job_id, c.soldier_id, c.s_persona_id, c.s_platform, c.resource, c.lane,
               e.event_type, c.attempt_count, c.lease_token, e.metadata
        FROM job AS c CROSS JOIN LATERAL (VALUES
            (1, 'claimed', jsonb_build_object(
                'priority_class', c.priority_class, 'reason', c.reason,
                'budget_class', c.b_class,
                'queued_ms', floor(extract(epoch FROM v_now - c.sane_eligible_at) * 1000))),
            (2, 'started', jsonb_build_object('claim_to_start_ms', 0))
        ) AS e(ord, event_type, metadata)
        WHERE e.ord = 1 OR p_start
        ORDER BY e.ord
    )
    SELECT c.job_id, c.soldier_id, c.s_persona_id, c.s_platform, c.s_name, c.resource, c.lane,
           c.priority_class, c.attempt_count, c.lease_token, c.lease_expires_at, c.claimed_at,
           @schema@.bf4ps_sane_time(c.created_at), c.sane_eligible_at, c.b_class,
           true, 0::bigint, false
    FROM job AS c;
    PERFORM @schema@.bf4ps_egress_spend(me.egress_key, me.host, s.egress_spacing,
                                        v_budget_spacing, v_interactive, v_entitled, v_now);
END;
$$;
