-- A job became pending and eligible now (returned to pending, promoted, or
-- its backoff cut short): NOTIFY bf4ps_jobs_<lane>, empty payload. Row
-- level with a WHEN, so claims, starts and renewals never call PL/pgSQL.
--
-- owner: migrator
-- execute: PUBLIC
CREATE OR REPLACE FUNCTION @schema@.bf4ps_notify_job_claimable() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    PERFORM pg_notify('bf4ps_jobs_' || NEW.lane, '');
    RETURN NULL;
END;
$$;

-- The row became pending and eligible now (returned to pending, promoted,
-- or its backoff cut short). Row level with a WHEN: claims, starts and
-- renewals never call PL/pgSQL.
CREATE OR REPLACE TRIGGER trg_collection_jobs_notify_claimable
    AFTER UPDATE ON @schema@.collection_jobs
    FOR EACH ROW
    WHEN (NEW.status = 'pending' AND NEW.eligible_at <= now()
          AND (OLD.status <> 'pending' OR OLD.lane <> NEW.lane OR OLD.eligible_at > now()))
    EXECUTE FUNCTION @schema@.bf4ps_notify_job_claimable();
