-- 0001: BF4PS operational schema v1.
--
-- The three contract tables (collectors, collection_jobs, collection_events) are
-- copied verbatim from docs/spec/operational-schema-v1.md (frozen). They are
-- preceded by what the contract references but does not define: pgcrypto,
-- soldiers, collection_state and the minimal gameplay tables that successful
-- finalization writes. See docs/schema.md.
--
-- RELEASED: never edit this file. Add a new migration instead.

CREATE EXTENSION IF NOT EXISTS pgcrypto;

-- ---------------------------------------------------------------------------
-- Prerequisites (not defined by the contract)
-- ---------------------------------------------------------------------------

-- One row per Battlelog persona we track.
CREATE TABLE soldiers (
    soldier_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    platform text NOT NULL,
    persona_id bigint NOT NULL,
    display_name text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT soldiers_platform_check CHECK (platform IN ('pc', 'ps4', 'xboxone')),
    CONSTRAINT soldiers_persona_id_positive CHECK (persona_id > 0),
    CONSTRAINT soldiers_display_name_nonempty
        CHECK (display_name IS NULL OR btrim(display_name) <> ''),
    CONSTRAINT uq_soldiers_platform_persona UNIQUE (platform, persona_id)
);

-- Durable backlog and freshness truth: one row per (soldier, resource).
-- collection_jobs is only the bounded working set drawn from here.
CREATE TABLE collection_state (
    soldier_id bigint NOT NULL
        REFERENCES soldiers(soldier_id) ON DELETE CASCADE,
    resource text NOT NULL,

    -- When the pair is next due for a background refresh (feeder input).
    next_attempt_at timestamptz NOT NULL DEFAULT now(),

    last_attempt_at timestamptz,
    last_success_at timestamptz,
    -- When the collected content last changed (content hash differed).
    last_changed_at timestamptz,
    last_failure_at timestamptz,
    last_error_class text,
    consecutive_failures integer NOT NULL DEFAULT 0,

    -- Terminal: Battlelog says the persona/resource is unavailable (404,
    -- private, other 4xx). Cleared by the next success.
    unavailable boolean NOT NULL DEFAULT false,
    unavailable_since timestamptz,

    success_count bigint NOT NULL DEFAULT 0,
    failure_count bigint NOT NULL DEFAULT 0,

    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),

    PRIMARY KEY (soldier_id, resource),

    CONSTRAINT collection_state_resource_check
        CHECK (resource IN ('detailed', 'profile', 'weapons', 'vehicles')),
    CONSTRAINT collection_state_consecutive_failures_check
        CHECK (consecutive_failures >= 0),
    CONSTRAINT collection_state_counts_check
        CHECK (success_count >= 0 AND failure_count >= 0),
    CONSTRAINT collection_state_error_shape_check
        CHECK (last_error_class IS NULL OR last_failure_at IS NOT NULL),
    CONSTRAINT collection_state_unavailable_shape_check
        CHECK (unavailable = (unavailable_since IS NOT NULL))
);

-- Feeder: "oldest due first", index-backed (ORDER BY next_attempt_at LIMIT n).
CREATE INDEX ix_collection_state_due
    ON collection_state (next_attempt_at);

-- Freshness: pairs per resource by age of last success, oldest success.
CREATE INDEX ix_collection_state_freshness
    ON collection_state (resource, last_success_at);

-- Authoritative current data per (soldier, resource), written only by
-- successful finalization. Failures never touch it.
CREATE TABLE soldier_resource_current (
    soldier_id bigint NOT NULL
        REFERENCES soldiers(soldier_id) ON DELETE CASCADE,
    resource text NOT NULL,
    data jsonb NOT NULL,
    -- sha256 of data::text (jsonb's canonical text form).
    content_hash bytea NOT NULL,
    fetched_at timestamptz NOT NULL,
    changed_at timestamptz NOT NULL,

    PRIMARY KEY (soldier_id, resource),

    CONSTRAINT soldier_resource_current_resource_check
        CHECK (resource IN ('detailed', 'profile', 'weapons', 'vehicles')),
    CONSTRAINT soldier_resource_current_hash_check
        CHECK (octet_length(content_hash) = 32),
    CONSTRAINT soldier_resource_current_changed_check
        CHECK (changed_at <= fetched_at)
);

-- Snapshots of the `detailed` resource, appended only when its hash changed.
CREATE TABLE soldier_detailed_history (
    history_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    soldier_id bigint NOT NULL
        REFERENCES soldiers(soldier_id) ON DELETE CASCADE,
    captured_at timestamptz NOT NULL,
    content_hash bytea NOT NULL,
    data jsonb NOT NULL,

    CONSTRAINT soldier_detailed_history_hash_check
        CHECK (octet_length(content_hash) = 32)
);

CREATE INDEX ix_soldier_detailed_history_soldier_time
    ON soldier_detailed_history (soldier_id, captured_at DESC);

-- ---------------------------------------------------------------------------
-- Contract: collectors (verbatim)
-- ---------------------------------------------------------------------------

CREATE TABLE collectors (
    collector_uuid uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    collector_name text NOT NULL,
    hostname text NOT NULL,
    lane text NOT NULL,
    egress_key text NOT NULL,
    enabled boolean NOT NULL DEFAULT true,
    drained boolean NOT NULL DEFAULT false,
    software_version text,
    started_at timestamptz,
    last_heartbeat_at timestamptz,
    heartbeat_state text NOT NULL DEFAULT 'unknown',
    heartbeat_lost_at timestamptz,
    current_job_id bigint,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    retired_at timestamptz,

    CONSTRAINT collectors_name_nonempty CHECK (btrim(collector_name) <> ''),
    CONSTRAINT collectors_hostname_nonempty CHECK (btrim(hostname) <> ''),
    CONSTRAINT collectors_egress_nonempty CHECK (btrim(egress_key) <> ''),
    CONSTRAINT collectors_lane_check CHECK (lane IN ('background', 'interactive')),
    CONSTRAINT collectors_heartbeat_state_check
        CHECK (heartbeat_state IN ('unknown', 'healthy', 'lost'))
);

CREATE UNIQUE INDEX uq_collectors_active_name
    ON collectors (lower(collector_name))
    WHERE retired_at IS NULL;

CREATE INDEX ix_collectors_heartbeat
    ON collectors (heartbeat_state, last_heartbeat_at)
    WHERE retired_at IS NULL;

CREATE INDEX ix_collectors_egress
    ON collectors (egress_key)
    WHERE retired_at IS NULL;

-- ---------------------------------------------------------------------------
-- Contract: collection_jobs (verbatim)
-- ---------------------------------------------------------------------------

CREATE TABLE collection_jobs (
    job_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    soldier_id bigint NOT NULL
        REFERENCES soldiers(soldier_id) ON DELETE CASCADE,
    resource text NOT NULL,
    lane text NOT NULL,
    priority_class text NOT NULL,
    reason text NOT NULL,
    status text NOT NULL DEFAULT 'pending',
    priority_value integer NOT NULL DEFAULT 0,
    eligible_at timestamptz NOT NULL DEFAULT now(),
    attempt_count integer NOT NULL DEFAULT 0,

    collector_uuid uuid
        REFERENCES collectors(collector_uuid) ON DELETE SET NULL,
    lease_token uuid,
    claimed_at timestamptz,
    started_at timestamptz,
    lease_expires_at timestamptz,

    last_error_class text,
    last_error_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT collection_jobs_resource_check
        CHECK (resource IN ('detailed', 'profile', 'weapons', 'vehicles')),
    CONSTRAINT collection_jobs_lane_check
        CHECK (lane IN ('background', 'interactive')),
    CONSTRAINT collection_jobs_priority_class_check
        CHECK (priority_class IN ('interactive', 'active', 'recent', 'bootstrap')),
    CONSTRAINT collection_jobs_status_check
        CHECK (status IN ('pending', 'claimed', 'running')),
    CONSTRAINT collection_jobs_attempt_count_check CHECK (attempt_count >= 0),
    CONSTRAINT collection_jobs_lease_shape_check CHECK (
        (status = 'pending'
            AND collector_uuid IS NULL
            AND lease_token IS NULL
            AND claimed_at IS NULL
            AND started_at IS NULL
            AND lease_expires_at IS NULL)
        OR
        (status = 'claimed'
            AND collector_uuid IS NOT NULL
            AND lease_token IS NOT NULL
            AND claimed_at IS NOT NULL
            AND started_at IS NULL
            AND lease_expires_at IS NOT NULL)
        OR
        (status = 'running'
            AND collector_uuid IS NOT NULL
            AND lease_token IS NOT NULL
            AND claimed_at IS NOT NULL
            AND started_at IS NOT NULL
            AND lease_expires_at IS NOT NULL)
    )
);

-- Every row in this table is actionable/live, so a normal unique constraint is
-- sufficient to coalesce duplicate demand.
ALTER TABLE collection_jobs
    ADD CONSTRAINT uq_collection_jobs_soldier_resource
    UNIQUE (soldier_id, resource);

CREATE INDEX ix_collection_jobs_claim
    ON collection_jobs
       (lane, priority_class, priority_value DESC, eligible_at, created_at, job_id)
    WHERE status = 'pending';

CREATE INDEX ix_collection_jobs_expired_lease
    ON collection_jobs (lease_expires_at, job_id)
    WHERE status IN ('claimed', 'running');

CREATE INDEX ix_collection_jobs_collector
    ON collection_jobs (collector_uuid)
    WHERE collector_uuid IS NOT NULL;

ALTER TABLE collectors
    ADD CONSTRAINT fk_collectors_current_job
    FOREIGN KEY (current_job_id)
    REFERENCES collection_jobs(job_id)
    ON DELETE SET NULL;

-- ---------------------------------------------------------------------------
-- Contract: collection_events (verbatim)
-- ---------------------------------------------------------------------------

CREATE TABLE collection_events (
    event_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    occurred_at timestamptz NOT NULL DEFAULT now(),

    collector_uuid uuid
        REFERENCES collectors(collector_uuid) ON DELETE SET NULL,
    collector_name_snapshot text,
    hostname_snapshot text,
    egress_key_snapshot text,

    job_id bigint,
    soldier_id bigint
        REFERENCES soldiers(soldier_id) ON DELETE SET NULL,
    persona_id bigint,
    platform text,
    resource text,
    lane text,
    event_type text NOT NULL,
    attempt_number integer,

    result text,
    duration_ms bigint,
    http_status integer,
    error_class text,
    error_message text,
    lease_token uuid,
    metadata jsonb,

    CONSTRAINT collection_events_resource_check
        CHECK (resource IS NULL OR resource IN ('detailed', 'profile', 'weapons', 'vehicles')),
    CONSTRAINT collection_events_lane_check
        CHECK (lane IS NULL OR lane IN ('background', 'interactive')),
    CONSTRAINT collection_events_platform_check
        CHECK (platform IS NULL OR platform IN ('pc', 'ps4', 'xboxone')),
    CONSTRAINT collection_events_attempt_check
        CHECK (attempt_number IS NULL OR attempt_number >= 0),
    CONSTRAINT collection_events_duration_check
        CHECK (duration_ms IS NULL OR duration_ms >= 0),
    CONSTRAINT collection_events_http_status_check
        CHECK (http_status IS NULL OR http_status BETWEEN 100 AND 599),
    CONSTRAINT collection_events_event_type_nonempty
        CHECK (btrim(event_type) <> '')
);

CREATE INDEX ix_collection_events_time
    ON collection_events (occurred_at DESC);

CREATE INDEX ix_collection_events_collector_time
    ON collection_events (collector_uuid, occurred_at DESC);

CREATE INDEX ix_collection_events_soldier_time
    ON collection_events (soldier_id, occurred_at DESC)
    WHERE soldier_id IS NOT NULL;

CREATE INDEX ix_collection_events_persona_time
    ON collection_events (platform, persona_id, occurred_at DESC)
    WHERE persona_id IS NOT NULL;

CREATE INDEX ix_collection_events_job
    ON collection_events (job_id, occurred_at)
    WHERE job_id IS NOT NULL;

CREATE INDEX ix_collection_events_type_time
    ON collection_events (event_type, occurred_at DESC);

CREATE INDEX ix_collection_events_http_errors
    ON collection_events (http_status, occurred_at DESC)
    WHERE http_status IS NOT NULL;
