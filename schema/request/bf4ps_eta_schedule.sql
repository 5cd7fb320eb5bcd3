-- The interactive lane's schedule, simulated: for each of `p_jobs`, in
-- order, the seconds until it should be collected, from the database's
-- clock (what bf4ps_request_refresh answers as eta_seconds).
--
-- Inputs, read once:
--   * a resource's service time: the median claimed -> succeeded/failed
--     time (the events of one lease) of its last 100 interactive outcomes
--     within `p_window`; without any, the mean of the other resources'
--     medians, else 2 s;
--   * the live interactive collectors (healthy, enabled, not drained, not
--     retired), each busy until its running job's claim + that resource's
--     service time (at least now);
--   * the egress gate: each collector's key may send again at its next
--     slot (or the end of its throttle pause), then 1 / `p_egress_rate`
--     seconds after each request.
--
-- Then the pending interactive jobs, in the claim's order (at most 1000),
-- go one by one to the collector that can start first (free, its key's
-- slot reached, the job eligible): the job's ETA is that start + its
-- resource's service time.
--
-- Per job of `p_jobs`: pending -> its simulated ETA (beyond the 1000th,
-- the last simulated start + bf4ps_eta_seconds from that job on);
-- claimed or running -> its claim + its service time - now, at least 0;
-- NULL when it is neither, or no interactive collector is live (pending).
-- Cost: four index reads of at most 100 outcomes, the live collectors, and
-- at most 1000 pending jobs x the collectors' steps (6-14 ms with 1000
-- pending jobs and 10 collectors, under 1 ms for a short queue).
--
-- owner: migrator
-- execute: bf4ps_definer
CREATE OR REPLACE FUNCTION @schema@.bf4ps_eta_schedule(
    p_jobs bigint[], p_window interval, p_egress_rate double precision)
RETURNS TABLE (job_id bigint, eta_seconds double precision)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    all_resources constant text[] := ARRAY['detailed', 'profile', 'weapons', 'vehicles'];
    simulated constant integer := 1000;
    v_clock timestamptz := clock_timestamp();
    v_now double precision := extract(epoch FROM v_clock);
    v_spacing double precision;
    v_service double precision[] := ARRAY[NULL, NULL, NULL, NULL]::double precision[];
    v_known double precision;
    v_keys text[] := ARRAY[]::text[];
    v_ready double precision[] := ARRAY[]::double precision[];
    v_free double precision[] := ARRAY[]::double precision[];
    v_key_of integer[] := ARRAY[]::integer[];
    v_eta double precision[];
    v_left integer;
    v_placed integer := 0;
    v_last_start double precision := 0;
    v_best integer;
    v_best_start double precision;
    v_start double precision;
    v_extra bigint;
    v_med double precision;
    n integer;
    ki integer;
    ci integer;
    r record;
BEGIN
    IF coalesce(cardinality(p_jobs), 0) = 0 THEN
        RETURN;
    END IF;
    v_eta := array_fill(NULL::double precision, ARRAY[cardinality(p_jobs)]);
    v_spacing := CASE WHEN p_egress_rate > 0 AND p_egress_rate < 'Infinity'::double precision
                      THEN least(1.0 / greatest(p_egress_rate, 1e-6), 86400.0) ELSE 0 END;

    -- Service time per resource: the median of its recent outcomes.
    FOR n IN 1 .. 4 LOOP
        SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY s.d) INTO v_med
        FROM (
            SELECT least(greatest(extract(epoch FROM e.occurred_at - cl.occurred_at), 0), 3600)
                       ::double precision AS d
            FROM @schema@.collection_events AS e
            CROSS JOIN LATERAL (
                SELECT x.occurred_at FROM @schema@.collection_events AS x
                WHERE x.job_id = e.job_id AND x.event_type = 'claimed'
                  AND x.lease_token = e.lease_token
                LIMIT 1) AS cl
            WHERE e.lane = 'interactive'
              AND e.event_type IN ('succeeded', 'failed')
              AND e.occurred_at > v_clock - p_window
              AND e.resource = all_resources[n]
            ORDER BY e.occurred_at DESC
            LIMIT 100
        ) AS s;
        v_service[n] := v_med;
    END LOOP;
    SELECT avg(x) INTO v_known FROM unnest(v_service) AS x;
    FOR n IN 1 .. 4 LOOP
        v_service[n] := coalesce(v_service[n], v_known, 2.0);
    END LOOP;

    -- The live interactive collectors: when each is free, and its key.
    FOR r IN
        SELECT c.egress_key, j.resource,
               extract(epoch FROM @schema@.bf4ps_sane_time(j.claimed_at)) AS claimed
        FROM @schema@.collectors AS c
        LEFT JOIN @schema@.collection_jobs AS j
          ON j.job_id = c.current_job_id AND j.collector_uuid = c.collector_uuid
         AND j.status IN ('claimed', 'running')
        WHERE c.lane = 'interactive'
          AND c.retired_at IS NULL
          AND c.enabled
          AND NOT c.drained
          AND c.heartbeat_state = 'healthy'
        ORDER BY c.collector_uuid
    LOOP
        ki := array_position(v_keys, r.egress_key);
        IF ki IS NULL THEN
            v_keys := v_keys || r.egress_key;
            v_ready := v_ready || 0::double precision;
            ki := cardinality(v_keys);
        END IF;
        v_key_of := v_key_of || ki;
        v_free := v_free || greatest(
            coalesce(r.claimed + v_service[array_position(all_resources, r.resource)] - v_now, 0),
            0);
    END LOOP;
    FOR r IN
        SELECT g.egress_key,
               extract(epoch FROM @schema@.bf4ps_sane_time(greatest(g.next_slot_at, g.paused_until)))
                   AS go
        FROM @schema@.egress_gates AS g
        WHERE g.egress_key = ANY (v_keys)
    LOOP
        v_ready[array_position(v_keys, r.egress_key)] := greatest(coalesce(r.go - v_now, 0), 0);
    END LOOP;

    -- Claimed or running: its claim + its service time.
    FOR r IN
        SELECT j.job_id, j.resource,
               extract(epoch FROM @schema@.bf4ps_sane_time(j.claimed_at)) AS claimed
        FROM @schema@.collection_jobs AS j
        WHERE j.job_id = ANY (p_jobs) AND j.status IN ('claimed', 'running')
    LOOP
        FOR n IN 1 .. cardinality(p_jobs) LOOP
            IF p_jobs[n] = r.job_id THEN
                v_eta[n] := greatest(
                    coalesce(r.claimed, v_now)
                        + v_service[array_position(all_resources, r.resource)] - v_now,
                    0);
            END IF;
        END LOOP;
    END LOOP;

    -- The pending jobs, in the claim's order, each to the collector that
    -- can start it first.
    SELECT count(*) INTO v_left
    FROM @schema@.collection_jobs AS j
    WHERE j.job_id = ANY (p_jobs) AND j.status = 'pending' AND j.lane = 'interactive';
    IF v_left > 0 AND cardinality(v_free) > 0 THEN
        FOR r IN
            SELECT j.job_id, j.resource,
                   extract(epoch FROM @schema@.bf4ps_sane_time(j.eligible_at)) AS eligible
            FROM @schema@.collection_jobs AS j
            WHERE j.status = 'pending' AND j.lane = 'interactive'
            ORDER BY CASE j.priority_class
                         WHEN 'interactive' THEN 1
                         WHEN 'active' THEN 2
                         WHEN 'recent' THEN 3
                         WHEN 'bootstrap' THEN 4
                     END,
                     j.priority_value DESC, j.eligible_at, j.created_at, j.job_id
            LIMIT simulated
        LOOP
            v_best := NULL;
            FOR ci IN 1 .. cardinality(v_free) LOOP
                v_start := greatest(v_free[ci], v_ready[v_key_of[ci]]);
                IF v_best IS NULL OR v_start < v_best_start THEN
                    v_best := ci;
                    v_best_start := v_start;
                END IF;
            END LOOP;
            v_best_start := greatest(v_best_start, coalesce(r.eligible - v_now, 0));
            v_free[v_best] := v_best_start + v_service[array_position(all_resources, r.resource)];
            v_ready[v_key_of[v_best]] := v_best_start + v_spacing;
            v_last_start := v_best_start;
            v_placed := v_placed + 1;
            IF r.job_id = ANY (p_jobs) THEN
                FOR n IN 1 .. cardinality(p_jobs) LOOP
                    IF p_jobs[n] = r.job_id THEN
                        v_eta[n] := v_free[v_best];
                    END IF;
                END LOOP;
                v_left := v_left - 1;
                EXIT WHEN v_left = 0;
            END IF;
        END LOOP;
        -- Beyond the simulated jobs: the formula for the jobs in between.
        IF v_left > 0 THEN
            SELECT avg(x) INTO v_known FROM unnest(v_service) AS x;
            FOR n IN 1 .. cardinality(p_jobs) LOOP
                CONTINUE WHEN v_eta[n] IS NOT NULL OR p_jobs[n] IS NULL;
                SELECT count(*) INTO v_extra
                FROM @schema@.collection_jobs AS me, @schema@.collection_jobs AS o
                WHERE me.job_id = p_jobs[n] AND me.status = 'pending' AND me.lane = 'interactive'
                  AND o.lane = 'interactive'
                  AND o.status = 'pending'
                  AND (CASE o.priority_class WHEN 'interactive' THEN 1 WHEN 'active' THEN 2
                                             WHEN 'recent' THEN 3 WHEN 'bootstrap' THEN 4 END,
                       -o.priority_value::bigint, o.eligible_at, o.created_at, o.job_id)
                      <= (CASE me.priority_class WHEN 'interactive' THEN 1 WHEN 'active' THEN 2
                                                 WHEN 'recent' THEN 3 WHEN 'bootstrap' THEN 4 END,
                          -me.priority_value::bigint, me.eligible_at, me.created_at, me.job_id);
                IF v_extra > v_placed THEN
                    -- The last simulated job is the formula's first.
                    v_eta[n] := v_last_start + @schema@.bf4ps_eta_seconds(
                        v_extra - v_placed + 1, cardinality(v_free), v_known,
                        p_egress_rate * cardinality(v_keys));
                END IF;
            END LOOP;
        END IF;
    END IF;

    RETURN QUERY
    SELECT p_jobs[i], v_eta[i] FROM generate_subscripts(p_jobs, 1) AS i ORDER BY i;
END;
$$;
