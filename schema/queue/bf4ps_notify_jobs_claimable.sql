-- Inserted jobs: one notification per lane per statement (a feeder batch
-- or BF4PS discovery's inserts call pg_notify once, not once per row).
--
-- owner: migrator
-- execute: PUBLIC
CREATE OR REPLACE FUNCTION @schema@.bf4ps_notify_jobs_claimable() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
DECLARE
    claimable_lane text;
BEGIN
    FOR claimable_lane IN
        SELECT DISTINCT n.lane FROM bf4ps_new_jobs n
        WHERE n.status = 'pending' AND n.eligible_at <= now()
    LOOP
        PERFORM pg_notify('bf4ps_jobs_' || claimable_lane, '');
    END LOOP;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER trg_collection_jobs_notify_insert
    AFTER INSERT ON @schema@.collection_jobs
    REFERENCING NEW TABLE AS bf4ps_new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION @schema@.bf4ps_notify_jobs_claimable();
