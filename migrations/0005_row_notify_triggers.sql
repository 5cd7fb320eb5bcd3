-- 0005: NOTIFY triggers that cost nothing on the hot path.
--
-- The statement-level triggers of 0002 (collection_jobs UPDATE) and 0003
-- (collection_events INSERT) capture a transition table and run PL/pgSQL for
-- every claim, start, renew and event insert, although those statements
-- almost never notify. Row-level triggers with a WHEN condition are checked by
-- the executor itself and call PL/pgSQL only for rows that do notify (a job
-- that became claimable, an outcome event). PostgreSQL folds identical
-- notifications of one transaction into one, so a many-row statement still
-- delivers one notification per channel. Measured with pgbench on the job
-- cycle (claim, start, finalize): about 10% more jobs/s (docs/benchmarks.md).
--
-- Inserts into collection_jobs keep the statement-level trigger of 0002: a
-- feeder batch must call pg_notify once, not once per row.
--
-- RELEASED: never edit this file. Add a new migration instead.

DROP TRIGGER trg_collection_jobs_notify_update ON collection_jobs;

CREATE FUNCTION bf4ps_notify_job_claimable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('bf4ps_jobs_' || NEW.lane, '');
    RETURN NULL;
END;
$$;

-- Same rule as 0002: the row became pending and eligible now (returned to
-- pending, promoted to another lane, or its backoff was cut short).
CREATE TRIGGER trg_collection_jobs_notify_claimable
    AFTER UPDATE ON collection_jobs
    FOR EACH ROW
    WHEN (NEW.status = 'pending' AND NEW.eligible_at <= now()
          AND (OLD.status <> 'pending' OR OLD.lane <> NEW.lane OR OLD.eligible_at > now()))
    EXECUTE FUNCTION bf4ps_notify_job_claimable();

DROP TRIGGER trg_collection_events_notify ON collection_events;
DROP FUNCTION bf4ps_notify_events();

CREATE FUNCTION bf4ps_notify_event() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('bf4ps_events', '');
    RETURN NULL;
END;
$$;

-- bf4ps.notify_events: 'off' never notifies, 'all' notifies every insert, and
-- anything else ('outcomes', the default) every event but claimed/started.
CREATE TRIGGER trg_collection_events_notify
    AFTER INSERT ON collection_events
    FOR EACH ROW
    WHEN (coalesce(current_setting('bf4ps.notify_events', true), '') = 'all'
          OR (coalesce(current_setting('bf4ps.notify_events', true), '') <> 'off'
              AND NEW.event_type NOT IN ('claimed', 'started')))
    EXECUTE FUNCTION bf4ps_notify_event();
