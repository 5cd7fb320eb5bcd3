-- 0003: what the gap-free projector, the freshness rollups and retention need.
--   * collection_events.tx_id: the inserting transaction's id, so the
--     projector can read only events of transactions that have finished
--     (tx_id < the snapshot's xmin) and never skip one that commits late;
--   * projector_checkpoint: how far the projector got, (tx_id, event_id);
--   * event_rollup_hourly: per (hour, resource, lane) outcome counts,
--     durations and data age at refresh;
--   * retention_runs: one row per retention run;
--   * a statement-level NOTIFY bf4ps_events trigger, switchable per database
--     with the bf4ps.notify_events setting (all | outcomes | off).
--
-- RELEASED once merged: never edit this file. Add a new migration instead.

-- The default is evaluated per inserting transaction; rows that exist when
-- this runs all get this migration's transaction id (any order among them is
-- fine: they are ordered by event_id within it).
ALTER TABLE collection_events
    ADD COLUMN tx_id xid8 NOT NULL DEFAULT pg_current_xact_id();

CREATE INDEX ix_collection_events_tx
    ON collection_events (tx_id, event_id);

-- The projection horizon: every event with tx_id below it belongs to a
-- transaction that has finished as of the calling statement's snapshot, so
-- reading "tx_id < horizon" in that same statement never skips an event that
-- commits later. It is the snapshot's oldest in-progress transaction id,
-- ignoring transactions provably running in ANOTHER database of the cluster
-- (they cannot insert here; without this, a long transaction anywhere on the
-- server would stall projection), or the snapshot's xmax when none is left.
-- A transaction whose database cannot be proven (it just ended, or is not
-- visible in pg_stat_activity) counts as ours: conservative. Top-level ids
-- only: tx_id is pg_current_xact_id(), the top-level id, even in a savepoint.
-- (plpgsql for its cached plans; STABLE, so it runs in the caller's snapshot)
CREATE FUNCTION bf4ps_projection_horizon() RETURNS xid8
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
        SELECT coalesce(
            (SELECT min(x.xid)
             FROM pg_snapshot_xip(s.snap) AS x(xid)
             WHERE xid(x.xid) NOT IN (
                     SELECT a.backend_xid FROM pg_stat_get_activity(NULL) a
                     WHERE a.backend_xid IS NOT NULL
                       AND a.datid IS NOT NULL AND a.datid <> 0
                       AND a.datid <> (SELECT d.oid FROM pg_database d
                                       WHERE d.datname = current_database()))
               AND xid(x.xid) NOT IN (
                     SELECT p.transaction FROM pg_prepared_xacts p
                     WHERE p.database <> current_database())),
            pg_snapshot_xmax(s.snap))
        FROM (SELECT pg_current_snapshot() AS snap) s);
END;
$$;

-- One row per projector (only 'main' today). Every batch moves it with a
-- compare-and-set on the previous (tx_id, event_id), in the same transaction
-- as the rollup upserts.
CREATE TABLE projector_checkpoint (
    projector text PRIMARY KEY DEFAULT 'main',
    tx_id xid8 NOT NULL,
    event_id bigint NOT NULL,
    projected_events bigint NOT NULL DEFAULT 0,
    last_event_at timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT projector_checkpoint_name_nonempty CHECK (btrim(projector) <> ''),
    CONSTRAINT projector_checkpoint_counts_check
        CHECK (event_id >= 0 AND projected_events >= 0)
);

INSERT INTO projector_checkpoint (projector, tx_id, event_id) VALUES ('main', '0', 0);

-- Hourly outcome rollups. bucket_start is the UTC hour of occurred_at;
-- resource and lane are '' when the event had none. Durations and ages are
-- integer milliseconds so sums stay exact.
CREATE TABLE event_rollup_hourly (
    bucket_start timestamptz NOT NULL,
    resource text NOT NULL,
    lane text NOT NULL,

    succeeded bigint NOT NULL DEFAULT 0,
    failed_transport bigint NOT NULL DEFAULT 0,
    failed_timeout bigint NOT NULL DEFAULT 0,
    failed_rate_limited bigint NOT NULL DEFAULT 0,
    failed_server bigint NOT NULL DEFAULT 0,
    failed_parse bigint NOT NULL DEFAULT 0,
    failed_unavailable bigint NOT NULL DEFAULT 0,
    -- failed events with no or an unknown error_class
    failed_other bigint NOT NULL DEFAULT 0,
    -- failed events whose result was 'gave_up' (attempt limit reached)
    gave_up bigint NOT NULL DEFAULT 0,
    retry_scheduled bigint NOT NULL DEFAULT 0,
    lease_expired bigint NOT NULL DEFAULT 0,
    reclaimed bigint NOT NULL DEFAULT 0,

    -- duration_ms of succeeded and failed events that carry one
    duration_count bigint NOT NULL DEFAULT 0,
    duration_sum_ms bigint NOT NULL DEFAULT 0,
    duration_max_ms bigint NOT NULL DEFAULT 0,

    -- occurred_at - previous_success_at of succeeded events that carry it
    refresh_age_count bigint NOT NULL DEFAULT 0,
    refresh_age_sum_ms bigint NOT NULL DEFAULT 0,
    refresh_age_max_ms bigint NOT NULL DEFAULT 0,

    updated_at timestamptz NOT NULL DEFAULT now(),

    PRIMARY KEY (bucket_start, resource, lane),

    CONSTRAINT event_rollup_hourly_bucket_check
        CHECK (bucket_start = date_trunc('hour', bucket_start AT TIME ZONE 'UTC') AT TIME ZONE 'UTC')
);

CREATE INDEX ix_event_rollup_hourly_resource_time
    ON event_rollup_hourly (resource, bucket_start);

-- One row per retention run (dry runs included). deleted stays 0 for dry
-- runs; eligible is what a dry run found deletable.
CREATE TABLE retention_runs (
    run_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    started_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    cutoff timestamptz NOT NULL,
    deleted bigint NOT NULL DEFAULT 0,
    dry_run boolean NOT NULL DEFAULT false,
    eligible bigint,

    CONSTRAINT retention_runs_deleted_check CHECK (deleted >= 0)
);

CREATE INDEX ix_retention_runs_started ON retention_runs (started_at DESC);

-- Wake the projector when events were appended: one constant-payload
-- NOTIFY per statement at most. Every notifying transaction takes a
-- cluster-wide lock at commit, so operators choose with
--   ALTER DATABASE <db> SET bf4ps.notify_events = 'all' | 'outcomes' | 'off'
-- (unset, empty or unknown means 'outcomes'): 'outcomes' skips statements
-- that inserted only claimed/started events, so a job costs one notifying
-- commit (its finalization) instead of three. The projector's fallback poll
-- is the guarantee either way.
CREATE FUNCTION bf4ps_notify_events() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    mode text := coalesce(current_setting('bf4ps.notify_events', true), '');
BEGIN
    IF mode = 'off' THEN
        RETURN NULL;
    END IF;
    IF mode = 'all' OR EXISTS (
        SELECT 1 FROM bf4ps_new_events n
        WHERE n.event_type NOT IN ('claimed', 'started')
    ) THEN
        PERFORM pg_notify('bf4ps_events', '');
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER trg_collection_events_notify
    AFTER INSERT ON collection_events
    REFERENCING NEW TABLE AS bf4ps_new_events
    FOR EACH STATEMENT EXECUTE FUNCTION bf4ps_notify_events();
