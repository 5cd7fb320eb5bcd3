-- Jobs to recover ($1: at most this many; $2: max claim-to-start, ms):
-- lease expired, claimed and never started, or a lease longer than any
-- grant. Rows are taken with SKIP LOCKED (several recoverers at once).
SELECT job_id, attempt_count FROM collection_jobs
WHERE job_id IN (
    (SELECT job_id FROM collection_jobs
     WHERE status IN ('claimed', 'running') AND lease_expires_at <= now()
     ORDER BY lease_expires_at, job_id LIMIT $1)
    UNION
    (SELECT job_id FROM collection_jobs
     WHERE status = 'claimed'
       AND claimed_at <= now() - $2 * interval '1 millisecond'
     ORDER BY claimed_at, job_id LIMIT $1)
    UNION
    -- A lease no renewal of ours writes (it ends later than a fresh
    -- grant would): recovered now, or it would never expire.
    (SELECT job_id FROM collection_jobs
     WHERE status IN ('claimed', 'running')
       AND lease_expires_at > now() + 2 * (SELECT lease_duration FROM scheduling_settings)
     ORDER BY lease_expires_at DESC, job_id LIMIT $1))
  AND status IN ('claimed', 'running')
  AND (lease_expires_at <= now()
       OR (status = 'claimed' AND claimed_at <= now() - $2 * interval '1 millisecond')
       OR lease_expires_at > now() + 2 * (SELECT lease_duration FROM scheduling_settings))
ORDER BY job_id
LIMIT $1
FOR UPDATE SKIP LOCKED
