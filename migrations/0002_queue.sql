-- 0002: what the lease-fenced queue needs beyond the frozen contract.
--   * claim_rank: the contract's CASE claim order as a stored column, so one
--     partial index serves the whole ORDER BY and claim cost does not grow
--     with the pending working-set depth;
--   * egress_gates: per-egress-key request slots shared by every collector;
--   * NOTIFY triggers waking collectors when jobs become claimable.
--
-- RELEASED: never edit this file. Add a new migration instead.

ALTER TABLE collection_jobs
    ADD COLUMN claim_rank smallint GENERATED ALWAYS AS (
        CASE priority_class
            WHEN 'interactive' THEN 1
            WHEN 'active' THEN 2
            WHEN 'recent' THEN 3
            WHEN 'bootstrap' THEN 4
        END
    ) STORED;

CREATE INDEX ix_collection_jobs_claim_rank
    ON collection_jobs (lane, claim_rank, priority_value DESC, eligible_at, created_at, job_id)
    WHERE status = 'pending';

-- One row per egress key: the next free request slot. A pass reserves the
-- slot atomically (row lock) and moves it 1/rate seconds on, so the rate
-- holds across every collector and host sharing the key.
CREATE TABLE egress_gates (
    egress_key text PRIMARY KEY,
    next_slot_at timestamptz NOT NULL,
    passes bigint NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT egress_gates_key_nonempty CHECK (btrim(egress_key) <> ''),
    CONSTRAINT egress_gates_passes_check CHECK (passes >= 0)
);

-- Wake collectors of a lane when a statement made some job of that lane
-- pending and eligible now: inserted, promoted to another lane, or returned
-- to pending. One constant-payload notification per lane per statement;
-- jobs returned with a future eligible_at are found by the fallback poll.
CREATE FUNCTION bf4ps_notify_jobs_claimable() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    claimable_lane text;
BEGIN
    IF TG_OP = 'INSERT' THEN
        FOR claimable_lane IN
            SELECT DISTINCT n.lane FROM bf4ps_new_jobs n
            WHERE n.status = 'pending' AND n.eligible_at <= now()
        LOOP
            PERFORM pg_notify('bf4ps_jobs_' || claimable_lane, '');
        END LOOP;
    ELSE
        FOR claimable_lane IN
            SELECT DISTINCT n.lane
            FROM bf4ps_new_jobs n JOIN bf4ps_old_jobs o USING (job_id)
            WHERE n.status = 'pending' AND n.eligible_at <= now()
              AND (o.status <> 'pending' OR o.lane <> n.lane OR o.eligible_at > now())
        LOOP
            PERFORM pg_notify('bf4ps_jobs_' || claimable_lane, '');
        END LOOP;
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER trg_collection_jobs_notify_insert
    AFTER INSERT ON collection_jobs
    REFERENCING NEW TABLE AS bf4ps_new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION bf4ps_notify_jobs_claimable();

CREATE TRIGGER trg_collection_jobs_notify_update
    AFTER UPDATE ON collection_jobs
    REFERENCING OLD TABLE AS bf4ps_old_jobs NEW TABLE AS bf4ps_new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION bf4ps_notify_jobs_claimable();
