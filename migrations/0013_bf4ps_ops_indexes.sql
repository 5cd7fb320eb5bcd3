-- 0013: the indexes our reads need on BF4PS's populated tables
-- (issue 21), each under a lock that lets readers (and, for the foreign
-- keys, writers) go on, in a transaction that takes no ACCESS EXCLUSIVE lock.
--   * ix_collection_events_tx (0003): the projector reads (tx_id, event_id);
--   * ix_collection_events_interactive_finished (0004): the ETA's recent
--     interactive durations;
--   * ix_collection_jobs_claim_order (0.1's claim_rank index, on the
--     expression): the contract's claim order, one index probe per claim;
--   * the contract tables' soldier foreign keys, re-created NOT VALID by 0011
--     (a no-op where they are valid already: BF4PS's own).
-- On a bf4ps-ops database the event indexes exist (0003, 0004): not built again.
--
-- RELEASED once merged: never edit this file. Add a new migration instead.

CREATE INDEX IF NOT EXISTS ix_collection_events_tx
    ON collection_events (tx_id, event_id);

CREATE INDEX IF NOT EXISTS ix_collection_events_interactive_finished
    ON collection_events (occurred_at DESC)
    WHERE lane = 'interactive' AND event_type IN ('succeeded', 'failed');

-- The contract's claim order, index-served: the CASE rank itself (0.1 stored
-- it in a generated column, which a populated table could only add with a
-- rewrite). The claim statements order by exactly this expression.
CREATE INDEX IF NOT EXISTS ix_collection_jobs_claim_order
    ON collection_jobs (lane,
                        (CASE priority_class
                             WHEN 'interactive' THEN 1
                             WHEN 'active' THEN 2
                             WHEN 'recent' THEN 3
                             WHEN 'bootstrap' THEN 4
                         END),
                        priority_value DESC, eligible_at, created_at, job_id)
    WHERE status = 'pending';

ALTER TABLE collection_events VALIDATE CONSTRAINT collection_events_soldier_id_fkey;
ALTER TABLE collection_jobs VALIDATE CONSTRAINT collection_jobs_soldier_id_fkey;
