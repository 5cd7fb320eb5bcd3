-- 0012: bf4ps-ops's own tables and columns on BF4PS's schema (issues 20, 21).
--
-- From here on every database is the same: a bf4ps-ops 0.1 database after
-- 0011, an empty one after 0001-0011, or a BF4PS database at Alembic revision
-- 0005 that `migrate` adopted (it records 0001-0011 as satisfied by BF4PS's
-- schema, after checking that schema, and applies this and what follows).
-- So what 0.1 created and 0011 kept (our data tables, two columns of the
-- contract tables) is created here only when missing, with the same
-- definition; a schema comparison test proves the three paths end identical.
--
-- Every statement here is metadata only on a populated BF4PS table (columns
-- with constant defaults, new tables): the ACCESS EXCLUSIVE locks it takes
-- are held for milliseconds, to this transaction's end. Every index on a
-- populated table and the foreign-key validation of 0011 come in 0013, in
-- their own transaction, under locks that let readers go on.
--
-- RELEASED once merged: never edit this file. Add a new migration instead.

-- ---------------------------------------------------------------------------
-- Our data tables (0002-0010), where a database lacks them.
-- ---------------------------------------------------------------------------

CREATE TABLE IF NOT EXISTS egress_gates (
    egress_key text PRIMARY KEY,
    next_slot_at timestamptz NOT NULL,
    passes bigint NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now(),
    paused_until timestamptz,
    throttle_streak integer NOT NULL DEFAULT 0,

    CONSTRAINT egress_gates_key_nonempty CHECK (btrim(egress_key) <> ''),
    CONSTRAINT egress_gates_passes_check CHECK (passes >= 0),
    CONSTRAINT egress_gates_throttle_streak_check CHECK (throttle_streak >= 0)
);

CREATE TABLE IF NOT EXISTS egress_budget (
    singleton boolean PRIMARY KEY DEFAULT true,
    next_slot_at timestamptz NOT NULL DEFAULT now(),
    passes bigint NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT egress_budget_singleton CHECK (singleton),
    CONSTRAINT egress_budget_passes_check CHECK (passes >= 0)
);
INSERT INTO egress_budget DEFAULT VALUES ON CONFLICT DO NOTHING;

CREATE TABLE IF NOT EXISTS projector_checkpoint (
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
INSERT INTO projector_checkpoint (projector, tx_id, event_id) VALUES ('main', '0', 0)
    ON CONFLICT DO NOTHING;

CREATE TABLE IF NOT EXISTS event_rollup_hourly (
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
    failed_other bigint NOT NULL DEFAULT 0,
    gave_up bigint NOT NULL DEFAULT 0,
    retry_scheduled bigint NOT NULL DEFAULT 0,
    lease_expired bigint NOT NULL DEFAULT 0,
    reclaimed bigint NOT NULL DEFAULT 0,
    duration_count bigint NOT NULL DEFAULT 0,
    duration_sum_ms bigint NOT NULL DEFAULT 0,
    duration_max_ms bigint NOT NULL DEFAULT 0,
    refresh_age_count bigint NOT NULL DEFAULT 0,
    refresh_age_sum_ms bigint NOT NULL DEFAULT 0,
    refresh_age_max_ms bigint NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now(),
    failed_throttled bigint NOT NULL DEFAULT 0,
    failed_http bigint NOT NULL DEFAULT 0,

    PRIMARY KEY (bucket_start, resource, lane),
    CONSTRAINT event_rollup_hourly_bucket_check
        CHECK (bucket_start = date_trunc('hour', bucket_start AT TIME ZONE 'UTC') AT TIME ZONE 'UTC')
);
CREATE INDEX IF NOT EXISTS ix_event_rollup_hourly_resource_time
    ON event_rollup_hourly (resource, bucket_start);

CREATE TABLE IF NOT EXISTS retention_runs (
    run_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    started_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    cutoff timestamptz NOT NULL,
    deleted bigint NOT NULL DEFAULT 0,
    dry_run boolean NOT NULL DEFAULT false,
    eligible bigint,

    CONSTRAINT retention_runs_deleted_check CHECK (deleted >= 0)
);
CREATE INDEX IF NOT EXISTS ix_retention_runs_started ON retention_runs (started_at DESC);

CREATE TABLE IF NOT EXISTS scheduling_settings (
    singleton boolean PRIMARY KEY DEFAULT true,
    eta_window interval NOT NULL DEFAULT interval '15 minutes',
    egress_rate double precision NOT NULL DEFAULT 0.2,
    updated_at timestamptz NOT NULL DEFAULT now(),
    max_pending_interactive integer NOT NULL DEFAULT 1000,

    CONSTRAINT scheduling_settings_singleton CHECK (singleton),
    CONSTRAINT scheduling_settings_eta_window_check CHECK (eta_window > interval '0'),
    CONSTRAINT scheduling_settings_egress_rate_check
        CHECK (egress_rate > 0 AND egress_rate < 'Infinity'::double precision),
    CONSTRAINT scheduling_settings_max_pending_interactive_check
        CHECK (max_pending_interactive > 0)
);
INSERT INTO scheduling_settings DEFAULT VALUES ON CONFLICT DO NOTHING;

CREATE TABLE IF NOT EXISTS collector_secrets (
    collector_uuid uuid PRIMARY KEY REFERENCES collectors (collector_uuid) ON DELETE CASCADE,
    secret_sha256 bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT collector_secrets_sha256_length CHECK (length(secret_sha256) = 32)
);

CREATE TABLE IF NOT EXISTS freshness_rollup (
    resource text NOT NULL,
    slot timestamptz NOT NULL,
    pairs bigint NOT NULL,

    PRIMARY KEY (resource, slot),
    CONSTRAINT freshness_rollup_resource_check
        CHECK (resource IN ('detailed', 'profile', 'weapons', 'vehicles'))
);
CREATE INDEX IF NOT EXISTS ix_freshness_rollup_slot ON freshness_rollup (slot);

CREATE TABLE IF NOT EXISTS freshness_deltas (
    resource text NOT NULL,
    slot timestamptz NOT NULL,
    pairs integer NOT NULL
);

CREATE TABLE IF NOT EXISTS freshness_bands (
    resource text NOT NULL,
    band smallint NOT NULL,
    pairs bigint NOT NULL,
    as_of timestamptz NOT NULL,

    PRIMARY KEY (resource, band),
    CONSTRAINT freshness_bands_resource_check
        CHECK (resource IN ('detailed', 'profile', 'weapons', 'vehicles'))
);

-- ---------------------------------------------------------------------------
-- New: what the collector boundary and BF4PS's policy need.
-- ---------------------------------------------------------------------------

-- Who registered an incarnation (the login role: session_user), so
-- registrations per role can be bounded.
ALTER TABLE collector_secrets ADD COLUMN registered_by text;
CREATE INDEX ix_collector_secrets_registered_by
    ON collector_secrets (registered_by, created_at);

-- The policy every collector function applies, published by `serve` from its
-- configuration (src/request.rs publish_settings): collectors never choose
-- their own lease, rate, budget, retry or cadence.
ALTER TABLE scheduling_settings
    ADD COLUMN lease_duration interval NOT NULL DEFAULT interval '60 seconds',
    ADD COLUMN heartbeat_lost_after interval NOT NULL DEFAULT interval '30 seconds',
    ADD COLUMN egress_spacing interval NOT NULL DEFAULT interval '5 seconds',
    -- NULL: the fleet budget is off.
    ADD COLUMN budget_spacing interval DEFAULT interval '2.792438 seconds',
    ADD COLUMN throttle_pause interval NOT NULL DEFAULT interval '1 minute',
    ADD COLUMN throttle_pause_max interval NOT NULL DEFAULT interval '30 minutes',
    -- BF4PS's retry ladder: the n-th failure in a row waits the n-th step
    -- (the last one for every later failure).
    ADD COLUMN retry_ladder interval[] NOT NULL
        DEFAULT ARRAY[interval '15 minutes', interval '1 hour', interval '6 hours',
                      interval '24 hours'],
    ADD COLUMN retry_jitter double precision NOT NULL DEFAULT 0.1,
    ADD COLUMN retry_max_attempts integer NOT NULL DEFAULT 4,
    ADD COLUMN refresh_detailed interval NOT NULL DEFAULT interval '24 hours',
    ADD COLUMN refresh_profile interval NOT NULL DEFAULT interval '30 days',
    ADD COLUMN refresh_weapons interval NOT NULL DEFAULT interval '7 days',
    ADD COLUMN refresh_vehicles interval NOT NULL DEFAULT interval '7 days',
    ADD COLUMN registrations_per_hour integer NOT NULL DEFAULT 120,
    ADD COLUMN collectors_per_role integer NOT NULL DEFAULT 50,
    -- The fleet budget's shares (BF4PS's): over the budget window, active
    -- work at most share_active_max of the budget, bootstrap at least
    -- share_bootstrap_min, retries and recovery at least share_retry_min
    -- (each while it has work; an unused share is borrowed).
    ADD COLUMN budget_requests integer NOT NULL DEFAULT 1296,
    ADD COLUMN budget_window interval NOT NULL DEFAULT interval '1 hour',
    ADD COLUMN share_active_max double precision NOT NULL DEFAULT 0.75,
    ADD COLUMN share_bootstrap_min double precision NOT NULL DEFAULT 0.20,
    ADD COLUMN share_retry_min double precision NOT NULL DEFAULT 0.05,
    -- Seen playing within this: active (what status and the gauges measure
    -- freshness against).
    ADD COLUMN active_window interval NOT NULL DEFAULT interval '24 hours',
    ADD CONSTRAINT scheduling_settings_policy_check CHECK (
        active_window > interval '0' AND
        lease_duration > interval '0' AND heartbeat_lost_after > interval '0'
        AND egress_spacing > interval '0'
        AND (budget_spacing IS NULL OR budget_spacing > interval '0')
        AND throttle_pause > interval '0' AND throttle_pause_max >= throttle_pause
        AND cardinality(retry_ladder) BETWEEN 1 AND 32
        AND retry_jitter >= 0 AND retry_jitter <= 1
        AND retry_max_attempts > 0
        AND refresh_detailed > interval '0' AND refresh_profile > interval '0'
        AND refresh_weapons > interval '0' AND refresh_vehicles > interval '0'
        AND registrations_per_hour > 0 AND collectors_per_role > 0
        AND budget_requests > 0 AND budget_window > interval '0'
        AND share_active_max BETWEEN 0 AND 1 AND share_bootstrap_min BETWEEN 0 AND 1
        AND share_retry_min BETWEEN 0 AND 1
        AND share_bootstrap_min + share_retry_min <= 1);

-- Background requests granted per minute and budget class (active,
-- bootstrap, retry), for the shares: a claim reads the budget window's
-- rows (at most a few hundred) and adds to the current minute's, under the
-- budget's row lock, so the shares hold across hosts. `serve`'s feeder
-- deletes rows older than the window.
CREATE TABLE budget_usage (
    minute timestamptz NOT NULL,
    budget_class text NOT NULL,
    grants integer NOT NULL,

    PRIMARY KEY (minute, budget_class),
    CONSTRAINT budget_usage_class_check CHECK (budget_class IN ('active', 'bootstrap', 'retry')),
    CONSTRAINT budget_usage_grants_check CHECK (grants >= 0)
);

-- Locks nobody else can hold: a row lock on this table needs UPDATE on it,
-- which only the schema owner and bf4ps_definer have (an advisory lock can
-- be taken by any role that can connect). Transaction-scoped: `FOR UPDATE`
-- (waits, under a lock_timeout) or `FOR UPDATE SKIP LOCKED` (try).
CREATE TABLE bf4ps_locks (
    lock_name text PRIMARY KEY,
    CONSTRAINT bf4ps_locks_name_check CHECK (lock_name IN (
        'interactive_admission', 'feeder', 'freshness_compaction', 'collector_registration',
        'weapon_catalog', 'vehicle_catalog'))
);
INSERT INTO bf4ps_locks (lock_name) VALUES
    ('interactive_admission'), ('feeder'), ('freshness_compaction'), ('collector_registration'),
    ('weapon_catalog'), ('vehicle_catalog');

-- Leases for what one process does at a time across transactions
-- (projector leadership, a retention run): taken and renewed by a
-- compare-and-set on this row, which only `serve`'s role may update, and
-- fenced by `holder` in every transaction that acts on it.
CREATE TABLE bf4ps_leases (
    lease_name text PRIMARY KEY,
    holder text,
    holder_detail text,
    acquired_at timestamptz,
    expires_at timestamptz NOT NULL DEFAULT '-infinity',
    generation bigint NOT NULL DEFAULT 0,

    CONSTRAINT bf4ps_leases_name_check CHECK (lease_name IN ('projector', 'retention')),
    CONSTRAINT bf4ps_leases_generation_check CHECK (generation >= 0)
);
INSERT INTO bf4ps_leases (lease_name) VALUES ('projector'), ('retention');

-- Events the projector could not project (a value no event of ours holds:
-- an infinite or out-of-range time, a duration beyond any attempt): passed
-- over, counted, and kept here with the reason, never retried.
CREATE TABLE projector_quarantine (
    event_id bigint PRIMARY KEY,
    tx_id xid8 NOT NULL,
    reason text NOT NULL,
    quarantined_at timestamptz NOT NULL DEFAULT now()
);

-- Who played and how fresh they are, as of `serve`'s last count (the feeder
-- counts after each cycle: src/feeder.rs count_activity): status and the
-- gauges read this one row, whatever the number of active soldiers.
CREATE TABLE activity_summary (
    singleton boolean PRIMARY KEY DEFAULT true,
    counted_at timestamptz NOT NULL,
    active_window interval NOT NULL,
    active_soldiers bigint NOT NULL,
    fresh_detailed bigint NOT NULL,
    fresh_profile bigint NOT NULL,
    fresh_weapons bigint NOT NULL,
    fresh_vehicles bigint NOT NULL,

    CONSTRAINT activity_summary_singleton_check CHECK (singleton)
);

-- ---------------------------------------------------------------------------
-- The contract tables' two columns, last: ALTER TABLE takes an ACCESS
-- EXCLUSIVE lock until this migration commits, so nothing else runs after.
-- ---------------------------------------------------------------------------

-- The inserting transaction's id (0003), which the projector reads below the
-- horizon. A constant default is metadata only: the rows that exist get '1'
-- (BF4PS's own history, older than any transaction of ours, projected first),
-- then new rows get their transaction's id.
ALTER TABLE collection_events ADD COLUMN IF NOT EXISTS tx_id xid8 NOT NULL DEFAULT '1';
ALTER TABLE collection_events ALTER COLUMN tx_id SET DEFAULT pg_current_xact_id();

-- Attempts that ended throttled (0007): they never count towards the limit.
ALTER TABLE collection_jobs ADD COLUMN IF NOT EXISTS throttled_attempts integer NOT NULL DEFAULT 0;
