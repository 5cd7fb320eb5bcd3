-- The interactive ETA formula (0004): the larger of collector parallelism
-- and the egress spacing, always finite and >= 0, or NULL when no
-- collector can take the job. bf4ps_eta_schedule simulates the lane and
-- uses it only beyond the jobs it simulates.
--
-- owner: migrator
-- execute: PUBLIC
CREATE OR REPLACE FUNCTION @schema@.bf4ps_eta_seconds(
    queue_position bigint,
    healthy_collectors integer,
    mean_duration_s double precision,
    egress_rate double precision
) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
    SELECT CASE
        WHEN queue_position IS NULL OR healthy_collectors IS NULL OR healthy_collectors <= 0
            THEN NULL
        ELSE greatest(
            ceil(greatest(queue_position, 1)::double precision / healthy_collectors) * p.duration,
            CASE
                WHEN egress_rate > 0 AND egress_rate < 'Infinity'::double precision
                    THEN (greatest(queue_position, 1) - 1)::double precision
                         / greatest(egress_rate, 1e-6) + p.duration
                ELSE 0
            END)
    END
    FROM (SELECT CASE
                     WHEN mean_duration_s >= 0 AND mean_duration_s < 'Infinity'::double precision
                         THEN least(mean_duration_s, 3600)
                     ELSE 2.0
                 END AS duration) AS p
$$;
