-- Returns the jobs of expired.sql to pending ($1: job ids, $2: their
-- backoff in ms, $3: max claim-to-start, ms), clears the holders'
-- current_job_id and writes lease_expired + reclaimed per job.
WITH input AS (
    SELECT * FROM unnest($1::bigint[], $2::bigint[]) AS t(job_id, delay_ms)
), old AS (
    SELECT j.job_id, j.soldier_id, j.resource, j.lane, j.status, j.attempt_count,
           j.collector_uuid, j.lease_token, j.claimed_at, j.lease_expires_at, i.delay_ms
    FROM collection_jobs j JOIN input i USING (job_id)
), back AS (
    UPDATE collection_jobs j
    SET status = 'pending', collector_uuid = NULL, lease_token = NULL,
        claimed_at = NULL, started_at = NULL, lease_expires_at = NULL,
        eligible_at = now() + i.delay_ms * interval '1 millisecond',
        updated_at = now()
    FROM input i
    WHERE j.job_id = i.job_id
    RETURNING j.job_id, j.attempt_count, j.eligible_at
), holders AS (
    UPDATE collectors SET current_job_id = NULL, updated_at = now()
    WHERE current_job_id IN (SELECT job_id FROM input)
), events AS (
    INSERT INTO collection_events
        (collector_uuid, collector_name_snapshot, hostname_snapshot, egress_key_snapshot,
         job_id, soldier_id, persona_id, platform, resource, lane, event_type,
         attempt_number, lease_token, metadata)
    SELECT o.collector_uuid, c.collector_name, c.hostname, c.egress_key,
           o.job_id, o.soldier_id, s.persona_id, s.platform, o.resource, o.lane,
           e.event_type, o.attempt_count, o.lease_token, e.metadata
    FROM old o
    JOIN soldiers s ON s.soldier_id = o.soldier_id
    LEFT JOIN collectors c ON c.collector_uuid = o.collector_uuid
    CROSS JOIN LATERAL (VALUES
        (1, 'lease_expired', jsonb_build_object(
            'status', o.status,
            'lease_expires_at', bf4ps_sane_time(o.lease_expires_at),
            'claimed_at', bf4ps_sane_time(o.claimed_at),
            'reason', CASE WHEN o.lease_expires_at <= now() THEN 'lease_expired'
                           WHEN o.status = 'claimed'
                                AND o.claimed_at <= now() - $3 * interval '1 millisecond'
                               THEN 'not_started'
                           ELSE 'lease_out_of_range' END)),
        (2, 'reclaimed', jsonb_build_object(
            'delay_ms', o.delay_ms,
            'eligible_at', now() + o.delay_ms * interval '1 millisecond'))
    ) AS e(ord, event_type, metadata)
    ORDER BY o.job_id, e.ord
)
SELECT b.job_id, o.collector_uuid, b.attempt_count, b.eligible_at
FROM back b JOIN old o USING (job_id)
ORDER BY b.job_id
