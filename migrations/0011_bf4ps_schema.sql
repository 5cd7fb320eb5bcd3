-- 0011: the BF4PS database schema (issue 21).
--
-- bf4ps-ops 0.1 (migrations 0001-0010) ran on tables it invented: a soldiers
-- table of its own, collection_state with one row per (soldier, resource),
-- JSONB documents in soldier_resource_current and soldier_detailed_history.
-- BF4PS, whose migration 0001 is our contract, defines these differently and
-- runs a discovery service that writes them. This migration reaches BF4PS's
-- schema at Alembic revision 0005_stage9c_dispatch_ledger
-- (docs/spec/bf4ps-database-0005.sql) from a 0.1 database, moving every row
-- (an empty database passes through it in no time):
--
--   1. BF4PS's tables (all but alembic_version, which is BF4PS's own and
--      says which Alembic revision a database is at) are created in a
--      staging schema, with the dump's exact DDL;
--   2. the rows of the invented tables are copied into them, under SHARE
--      locks (readers go on; writers wait: stop the 0.1 fleet first, its
--      collectors cannot work on the new schema anyway);
--   3. their constraints and indexes are built;
--   4. the swap, last: the invented tables and every function and trigger
--      of 0.1 go, the staged tables move into the schema, the contract
--      tables' soldier foreign keys point at the new soldiers (NOT VALID:
--      0012 validates them without blocking writers). The ACCESS EXCLUSIVE
--      locks are taken here, at the end, and held only until the commit.
--
-- What is dropped and why: claim_rank (a stored column; 0012's claim index
-- is on the expression itself, which BF4PS's populated collection_jobs can
-- take without a rewrite); every 0.1 function and trigger (0012 onwards
-- defines bf4ps-ops's layer on BF4PS's tables, the same for every database).
-- Kept: our own data tables (egress gates and budget, projector checkpoint,
-- rollups, retention runs, scheduling settings, collector secrets, freshness
-- rollups), which 0012 creates when a database (BF4PS's) lacks them.
-- Not carried over, because BF4PS has no column for them: `skill`, `rounds`
-- and the derived ratios of the detailed document, a profile's clan tag, the
-- per-pair success and failure counts and last_changed_at (the events hold
-- that history).
--
-- RELEASED once merged: never edit this file. Add a new migration instead.

-- Nothing writes the invented tables while they are copied (and readers go on).
LOCK TABLE soldiers, collection_state, soldier_resource_current, soldier_detailed_history
    IN SHARE MODE;

CREATE SCHEMA bf4ps_reshape;

-- ---------------------------------------------------------------------------
-- 1. BF4PS's tables, as its revision-0005 dump declares them.
-- ---------------------------------------------------------------------------

CREATE TABLE bf4ps_reshape.battlelog_profiles (
    profile_id bigint NOT NULL,
    battlelog_username text NOT NULL,
    battlelog_user_id bigint,
    country_code character varying(2),
    country_name text,
    access_state text NOT NULL,
    last_checked_at timestamp with time zone,
    last_success_at timestamp with time zone,
    last_error text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT battlelog_profiles_access_state_check CHECK ((access_state = ANY (ARRAY['public_country'::text, 'public_no_country'::text, 'friends_only'::text, 'not_found'::text, 'error'::text]))),
    CONSTRAINT battlelog_profiles_country_upper_check CHECK (((country_code IS NULL) OR ((country_code)::text = upper((country_code)::text))))
);

ALTER TABLE bf4ps_reshape.battlelog_profiles ALTER COLUMN profile_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME bf4ps_reshape.battlelog_profiles_profile_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE bf4ps_reshape.collection_state (
    soldier_id bigint NOT NULL,
    detailed_state text DEFAULT 'never_attempted'::text NOT NULL,
    detailed_last_attempt_at timestamp with time zone,
    detailed_last_success_at timestamp with time zone,
    detailed_next_due_at timestamp with time zone,
    detailed_consecutive_failures integer DEFAULT 0 NOT NULL,
    detailed_last_error_class text,
    detailed_last_error_message text,
    profile_state text DEFAULT 'never_attempted'::text NOT NULL,
    profile_last_attempt_at timestamp with time zone,
    profile_last_success_at timestamp with time zone,
    profile_next_due_at timestamp with time zone,
    profile_consecutive_failures integer DEFAULT 0 NOT NULL,
    profile_last_error_class text,
    profile_last_error_message text,
    weapons_state text DEFAULT 'never_attempted'::text NOT NULL,
    weapons_last_attempt_at timestamp with time zone,
    weapons_last_success_at timestamp with time zone,
    weapons_next_due_at timestamp with time zone,
    weapons_consecutive_failures integer DEFAULT 0 NOT NULL,
    weapons_last_error_class text,
    weapons_last_error_message text,
    vehicles_state text DEFAULT 'never_attempted'::text NOT NULL,
    vehicles_last_attempt_at timestamp with time zone,
    vehicles_last_success_at timestamp with time zone,
    vehicles_next_due_at timestamp with time zone,
    vehicles_consecutive_failures integer DEFAULT 0 NOT NULL,
    vehicles_last_error_class text,
    vehicles_last_error_message text,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT collection_state_detailed_failures_check CHECK ((detailed_consecutive_failures >= 0)),
    CONSTRAINT collection_state_detailed_state_check CHECK ((detailed_state = ANY (ARRAY['never_attempted'::text, 'success'::text, 'temporary_failure'::text, 'unavailable'::text]))),
    CONSTRAINT collection_state_profile_failures_check CHECK ((profile_consecutive_failures >= 0)),
    CONSTRAINT collection_state_profile_state_check CHECK ((profile_state = ANY (ARRAY['never_attempted'::text, 'success'::text, 'temporary_failure'::text, 'unavailable'::text]))),
    CONSTRAINT collection_state_vehicles_failures_check CHECK ((vehicles_consecutive_failures >= 0)),
    CONSTRAINT collection_state_vehicles_state_check CHECK ((vehicles_state = ANY (ARRAY['never_attempted'::text, 'success'::text, 'temporary_failure'::text, 'unavailable'::text]))),
    CONSTRAINT collection_state_weapons_failures_check CHECK ((weapons_consecutive_failures >= 0)),
    CONSTRAINT collection_state_weapons_state_check CHECK ((weapons_state = ANY (ARRAY['never_attempted'::text, 'success'::text, 'temporary_failure'::text, 'unavailable'::text])))
);

CREATE TABLE bf4ps_reshape.detailed_stats_current (
    soldier_id bigint NOT NULL,
    rank bigint,
    time_played_seconds bigint,
    assault_score bigint,
    engineer_score bigint,
    support_score bigint,
    recon_score bigint,
    commander_score bigint,
    squad_score bigint,
    vehicle_score bigint,
    award_score bigint,
    unlock_score bigint,
    total_score bigint,
    combat_score bigint,
    conquest_score bigint,
    rush_score bigint,
    team_deathmatch_score bigint,
    domination_score bigint,
    obliteration_score bigint,
    defuse_score bigint,
    capture_the_flag_score bigint,
    air_superiority_score bigint,
    carrier_assault_score bigint,
    chain_link_score bigint,
    kills bigint,
    deaths bigint,
    kill_assists bigint,
    wins bigint,
    losses bigint,
    shots_fired bigint,
    shots_hit bigint,
    repairs bigint,
    revives bigint,
    heals bigint,
    resupplies bigint,
    avenger_kills bigint,
    savior_kills bigint,
    suppression_assists bigint,
    quit_percentage numeric(10,6),
    flags_captured bigint,
    flags_defended bigint,
    dogtags_taken bigint,
    vehicles_destroyed bigint,
    vehicle_damage bigint,
    headshots bigint,
    longest_headshot numeric(14,4),
    highest_kill_streak bigint,
    nemesis_kills bigint,
    highest_nemesis_streak bigint,
    source_fetched_at timestamp with time zone NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE bf4ps_reshape.detailed_stats_history (
    snapshot_id bigint NOT NULL,
    soldier_id bigint NOT NULL,
    rank bigint,
    time_played_seconds bigint,
    assault_score bigint,
    engineer_score bigint,
    support_score bigint,
    recon_score bigint,
    commander_score bigint,
    squad_score bigint,
    vehicle_score bigint,
    award_score bigint,
    unlock_score bigint,
    total_score bigint,
    combat_score bigint,
    conquest_score bigint,
    rush_score bigint,
    team_deathmatch_score bigint,
    domination_score bigint,
    obliteration_score bigint,
    defuse_score bigint,
    capture_the_flag_score bigint,
    air_superiority_score bigint,
    carrier_assault_score bigint,
    chain_link_score bigint,
    kills bigint,
    deaths bigint,
    kill_assists bigint,
    wins bigint,
    losses bigint,
    shots_fired bigint,
    shots_hit bigint,
    repairs bigint,
    revives bigint,
    heals bigint,
    resupplies bigint,
    avenger_kills bigint,
    savior_kills bigint,
    suppression_assists bigint,
    quit_percentage numeric(10,6),
    flags_captured bigint,
    flags_defended bigint,
    dogtags_taken bigint,
    vehicles_destroyed bigint,
    vehicle_damage bigint,
    headshots bigint,
    longest_headshot numeric(14,4),
    highest_kill_streak bigint,
    nemesis_kills bigint,
    highest_nemesis_streak bigint,
    observed_at timestamp with time zone NOT NULL
);

ALTER TABLE bf4ps_reshape.detailed_stats_history ALTER COLUMN snapshot_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME bf4ps_reshape.detailed_stats_history_snapshot_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE bf4ps_reshape.discovery_state (
    source_name text NOT NULL,
    last_alias_id bigint DEFAULT '0'::bigint NOT NULL,
    last_poll_at timestamp with time zone,
    last_success_at timestamp with time zone,
    last_error text,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT discovery_state_alias_id_check CHECK ((last_alias_id >= 0))
);

CREATE TABLE bf4ps_reshape.outbound_dispatches (
    dispatch_id uuid NOT NULL,
    job_id bigint NOT NULL,
    attempt_number integer NOT NULL,
    resource text NOT NULL,
    lease_token uuid NOT NULL,
    collector_uuid uuid NOT NULL,
    egress_key text NOT NULL,
    lane text NOT NULL,
    payload_fingerprint text NOT NULL,
    admitted_at timestamp with time zone NOT NULL,
    phase text DEFAULT 'admitted'::text NOT NULL,
    send_marked_at timestamp with time zone,
    acknowledged_at timestamp with time zone,
    CONSTRAINT outbound_dispatch_ack_after_send CHECK (((acknowledged_at IS NULL) OR (acknowledged_at >= send_marked_at))),
    CONSTRAINT outbound_dispatch_attempt_positive CHECK (((job_id > 0) AND (attempt_number > 0))),
    CONSTRAINT outbound_dispatch_lane CHECK ((lane = ANY (ARRAY['background'::text, 'interactive'::text]))),
    CONSTRAINT outbound_dispatch_nonempty CHECK (((btrim(egress_key) <> ''::text) AND (btrim(payload_fingerprint) <> ''::text))),
    CONSTRAINT outbound_dispatch_phase CHECK ((phase = ANY (ARRAY['admitted'::text, 'may_have_sent'::text, 'acknowledged'::text, 'ambiguous'::text]))),
    CONSTRAINT outbound_dispatch_phase_timestamps CHECK ((((phase = 'admitted'::text) AND (send_marked_at IS NULL) AND (acknowledged_at IS NULL)) OR ((phase = ANY (ARRAY['may_have_sent'::text, 'ambiguous'::text])) AND (send_marked_at IS NOT NULL) AND (acknowledged_at IS NULL)) OR ((phase = 'acknowledged'::text) AND (send_marked_at IS NOT NULL) AND (acknowledged_at IS NOT NULL)))),
    CONSTRAINT outbound_dispatch_resource CHECK ((resource = ANY (ARRAY['detailed'::text, 'profile'::text, 'weapons'::text, 'vehicles'::text]))),
    CONSTRAINT outbound_dispatch_send_after_admit CHECK (((send_marked_at IS NULL) OR (send_marked_at >= admitted_at)))
);

CREATE TABLE bf4ps_reshape.profile_soldiers (
    profile_id bigint NOT NULL,
    soldier_id bigint NOT NULL,
    first_seen_at timestamp with time zone NOT NULL,
    last_seen_at timestamp with time zone NOT NULL
);

CREATE TABLE bf4ps_reshape.request_gates (
    egress_key text NOT NULL,
    next_request_at timestamp with time zone NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT request_gates_egress_nonempty CHECK ((btrim(egress_key) <> ''::text))
);

CREATE TABLE bf4ps_reshape.soldier_names (
    soldier_name_id bigint NOT NULL,
    soldier_id bigint NOT NULL,
    name text NOT NULL,
    first_seen_at timestamp with time zone NOT NULL,
    last_seen_at timestamp with time zone NOT NULL,
    CONSTRAINT soldier_names_name_nonempty CHECK ((btrim(name) <> ''::text))
);

ALTER TABLE bf4ps_reshape.soldier_names ALTER COLUMN soldier_name_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME bf4ps_reshape.soldier_names_soldier_name_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE bf4ps_reshape.soldier_sources (
    soldier_id bigint NOT NULL,
    source_type text NOT NULL,
    first_seen_at timestamp with time zone NOT NULL,
    last_seen_at timestamp with time zone NOT NULL,
    CONSTRAINT soldier_sources_type_check CHECK ((source_type = ANY (ARRAY['bf4sw'::text, 'manual'::text])))
);

CREATE TABLE bf4ps_reshape.soldier_vehicle_stats (
    soldier_id bigint NOT NULL,
    vehicle_id bigint NOT NULL,
    kills bigint NOT NULL,
    time_in_seconds bigint NOT NULL,
    destroy_x_in_y bigint,
    source_fetched_at timestamp with time zone NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE bf4ps_reshape.soldier_weapon_stats (
    soldier_id bigint NOT NULL,
    weapon_id bigint NOT NULL,
    kills bigint NOT NULL,
    headshots bigint NOT NULL,
    shots_fired bigint NOT NULL,
    shots_hit bigint NOT NULL,
    time_equipped_seconds bigint NOT NULL,
    source_fetched_at timestamp with time zone NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE bf4ps_reshape.soldiers (
    soldier_id bigint NOT NULL,
    persona_id bigint NOT NULL,
    platform text NOT NULL,
    current_name text NOT NULL,
    first_seen_at timestamp with time zone NOT NULL,
    last_seen_at timestamp with time zone NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT soldiers_name_nonempty CHECK ((btrim(current_name) <> ''::text)),
    CONSTRAINT soldiers_platform_check CHECK ((platform = ANY (ARRAY['pc'::text, 'ps4'::text, 'xboxone'::text])))
);

ALTER TABLE bf4ps_reshape.soldiers ALTER COLUMN soldier_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME bf4ps_reshape.soldiers_soldier_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE bf4ps_reshape.stage9c_supervision_runs (
    run_id uuid NOT NULL,
    state text NOT NULL,
    cutover_at timestamp with time zone NOT NULL,
    since_event_id bigint NOT NULL,
    started_at timestamp with time zone,
    deadline_at timestamp with time zone,
    watchdog_owner uuid,
    watchdog_generation bigint DEFAULT '0'::bigint NOT NULL,
    heartbeat_at timestamp with time zone,
    lease_expires_at timestamp with time zone,
    abort_at timestamp with time zone,
    abort_reason text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT stage9c_run_abort_pair CHECK ((((abort_at IS NULL) AND (abort_reason IS NULL)) OR ((abort_at IS NOT NULL) AND (abort_reason IS NOT NULL) AND (btrim(abort_reason) <> ''::text)))),
    CONSTRAINT stage9c_run_aborted_reason CHECK (((state <> 'aborted'::text) OR (abort_at IS NOT NULL))),
    CONSTRAINT stage9c_run_activation_dates CHECK (((state = 'prepared'::text) OR ((started_at IS NOT NULL) AND (deadline_at IS NOT NULL)))),
    CONSTRAINT stage9c_run_active_lease CHECK (((state <> 'active'::text) OR ((watchdog_owner IS NOT NULL) AND (heartbeat_at IS NOT NULL) AND (lease_expires_at IS NOT NULL) AND (lease_expires_at > heartbeat_at)))),
    CONSTRAINT stage9c_run_boundary CHECK ((since_event_id >= 0)),
    CONSTRAINT stage9c_run_generation CHECK ((watchdog_generation >= 0)),
    CONSTRAINT stage9c_run_six_hour_deadline CHECK ((((started_at IS NULL) AND (deadline_at IS NULL)) OR ((started_at IS NOT NULL) AND (deadline_at = (started_at + '06:00:00'::interval))))),
    CONSTRAINT stage9c_run_state CHECK ((state = ANY (ARRAY['prepared'::text, 'active'::text, 'aborted'::text, 'completed'::text])))
);

CREATE TABLE bf4ps_reshape.vehicle_catalog (
    vehicle_id bigint NOT NULL,
    vehicle_guid text NOT NULL,
    name text NOT NULL,
    slug text,
    category text,
    first_seen_at timestamp with time zone NOT NULL,
    last_seen_at timestamp with time zone NOT NULL
);

ALTER TABLE bf4ps_reshape.vehicle_catalog ALTER COLUMN vehicle_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME bf4ps_reshape.vehicle_catalog_vehicle_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE bf4ps_reshape.weapon_catalog (
    weapon_id bigint NOT NULL,
    weapon_guid text NOT NULL,
    name text NOT NULL,
    slug text,
    category text,
    first_seen_at timestamp with time zone NOT NULL,
    last_seen_at timestamp with time zone NOT NULL
);

ALTER TABLE bf4ps_reshape.weapon_catalog ALTER COLUMN weapon_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME bf4ps_reshape.weapon_catalog_weapon_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- ---------------------------------------------------------------------------
-- 2. The rows, moved. Soldier ids, history ids and every timestamp are kept.
-- ---------------------------------------------------------------------------

-- Soldiers: the name we had (import or request), else the name a profile
-- fetch reported, else the persona id (BF4PS requires a non-empty name).
-- Discovery never sighted them: first and last seen are when they were added.
INSERT INTO bf4ps_reshape.soldiers
    (soldier_id, persona_id, platform, current_name, first_seen_at, last_seen_at,
     created_at, updated_at)
OVERRIDING SYSTEM VALUE
SELECT s.soldier_id, s.persona_id, s.platform,
       coalesce(nullif(btrim(s.display_name), ''),
                nullif(btrim(p.data->>'name'), ''),
                s.persona_id::text),
       s.created_at, s.created_at, s.created_at, s.updated_at
FROM public.soldiers AS s
LEFT JOIN public.soldier_resource_current AS p
       ON p.soldier_id = s.soldier_id AND p.resource = 'profile';

-- Name history: the name we had, and another one a profile fetch reported.
INSERT INTO bf4ps_reshape.soldier_names (soldier_id, name, first_seen_at, last_seen_at)
SELECT soldier_id, name, min(seen_from), max(seen_to)
FROM (
    SELECT s.soldier_id, btrim(s.display_name) AS name, s.created_at AS seen_from,
           s.updated_at AS seen_to
    FROM public.soldiers AS s
    WHERE btrim(coalesce(s.display_name, '')) <> ''
    UNION ALL
    SELECT p.soldier_id, btrim(p.data->>'name'), p.fetched_at, p.fetched_at
    FROM public.soldier_resource_current AS p
    WHERE p.resource = 'profile' AND btrim(coalesce(p.data->>'name', '')) <> ''
) AS n
GROUP BY soldier_id, name;

-- Every soldier of a 0.1 database came from `soldiers import` or an
-- interactive request: BF4PS's 'manual' source.
INSERT INTO bf4ps_reshape.soldier_sources (soldier_id, source_type, first_seen_at, last_seen_at)
SELECT soldier_id, 'manual', created_at, created_at FROM public.soldiers;

-- The durable state: one row per soldier, a column group per resource. A
-- pair's state is what its last attempt said; a never-attempted pair has no
-- due time (BF4PS's default row); an unavailable one leaves the retry loop.
INSERT INTO bf4ps_reshape.collection_state
SELECT s.soldier_id,
       CASE WHEN d.unavailable THEN 'unavailable'
            WHEN d.consecutive_failures > 0 THEN 'temporary_failure'
            WHEN d.last_success_at IS NOT NULL THEN 'success'
            ELSE 'never_attempted' END,
       d.last_attempt_at, d.last_success_at,
       CASE WHEN d.unavailable OR d.last_attempt_at IS NULL THEN NULL
            ELSE d.next_attempt_at END,
       coalesce(d.consecutive_failures, 0), d.last_error_class, NULL::text,
       CASE WHEN p.unavailable THEN 'unavailable'
            WHEN p.consecutive_failures > 0 THEN 'temporary_failure'
            WHEN p.last_success_at IS NOT NULL THEN 'success'
            ELSE 'never_attempted' END,
       p.last_attempt_at, p.last_success_at,
       CASE WHEN p.unavailable OR p.last_attempt_at IS NULL THEN NULL
            ELSE p.next_attempt_at END,
       coalesce(p.consecutive_failures, 0), p.last_error_class, NULL::text,
       CASE WHEN w.unavailable THEN 'unavailable'
            WHEN w.consecutive_failures > 0 THEN 'temporary_failure'
            WHEN w.last_success_at IS NOT NULL THEN 'success'
            ELSE 'never_attempted' END,
       w.last_attempt_at, w.last_success_at,
       CASE WHEN w.unavailable OR w.last_attempt_at IS NULL THEN NULL
            ELSE w.next_attempt_at END,
       coalesce(w.consecutive_failures, 0), w.last_error_class, NULL::text,
       CASE WHEN v.unavailable THEN 'unavailable'
            WHEN v.consecutive_failures > 0 THEN 'temporary_failure'
            WHEN v.last_success_at IS NOT NULL THEN 'success'
            ELSE 'never_attempted' END,
       v.last_attempt_at, v.last_success_at,
       CASE WHEN v.unavailable OR v.last_attempt_at IS NULL THEN NULL
            ELSE v.next_attempt_at END,
       coalesce(v.consecutive_failures, 0), v.last_error_class, NULL::text,
       greatest(s.updated_at, d.updated_at, p.updated_at, w.updated_at, v.updated_at)
FROM public.soldiers AS s
LEFT JOIN public.collection_state AS d ON d.soldier_id = s.soldier_id AND d.resource = 'detailed'
LEFT JOIN public.collection_state AS p ON p.soldier_id = s.soldier_id AND p.resource = 'profile'
LEFT JOIN public.collection_state AS w ON w.soldier_id = s.soldier_id AND w.resource = 'weapons'
LEFT JOIN public.collection_state AS v ON v.soldier_id = s.soldier_id AND v.resource = 'vehicles';

-- Detailed stats: the 0.1 document's counters under BF4PS's 48 column names
-- (the document kept reals at 4 decimals, inside both column scales).
CREATE FUNCTION pg_temp.bf4ps_0011_detailed(d jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT jsonb_build_object(
        'rank', d->'rank',
        'time_played_seconds', d->'time_played_s',
        'assault_score', d->'kit_scores'->'assault',
        'engineer_score', d->'kit_scores'->'engineer',
        'support_score', d->'kit_scores'->'support',
        'recon_score', d->'kit_scores'->'recon',
        'commander_score', d->'kit_scores'->'commander',
        'squad_score', d->'kit_scores'->'squad',
        'vehicle_score', d->'kit_scores'->'vehicle',
        'award_score', d->'kit_scores'->'award',
        'unlock_score', d->'kit_scores'->'unlock',
        'total_score', d->'score',
        'combat_score', d->'combat_score',
        'conquest_score', d->'mode_scores'->'conquest',
        'rush_score', d->'mode_scores'->'rush',
        'team_deathmatch_score', d->'mode_scores'->'team_deathmatch',
        'domination_score', d->'mode_scores'->'domination',
        'obliteration_score', d->'mode_scores'->'obliteration',
        'defuse_score', d->'mode_scores'->'defuse',
        'capture_the_flag_score', d->'mode_scores'->'capture_the_flag',
        'air_superiority_score', d->'mode_scores'->'air_superiority',
        'carrier_assault_score', d->'mode_scores'->'carrier_assault',
        'chain_link_score', d->'mode_scores'->'chain_link',
        'kills', d->'kills',
        'deaths', d->'deaths',
        'kill_assists', d->'kill_assists',
        'wins', d->'wins',
        'losses', d->'losses',
        'shots_fired', d->'shots_fired',
        'shots_hit', d->'shots_hit',
        'repairs', d->'repairs',
        'revives', d->'revives',
        'heals', d->'heals',
        'resupplies', d->'resupplies',
        'avenger_kills', d->'avenger_kills',
        'savior_kills', d->'savior_kills',
        'suppression_assists', d->'suppression_assists',
        'quit_percentage', d->'quit_percentage',
        'flags_captured', d->'flags_captured',
        'flags_defended', d->'flags_defended',
        'dogtags_taken', d->'dogtags_taken',
        'vehicles_destroyed', d->'vehicles_destroyed',
        'vehicle_damage', d->'vehicle_damage',
        'headshots', d->'headshots',
        'longest_headshot', d->'longest_headshot',
        'highest_kill_streak', d->'highest_kill_streak',
        'nemesis_kills', d->'nemesis_kills',
        'highest_nemesis_streak', d->'highest_nemesis_streak')
$$;

INSERT INTO bf4ps_reshape.detailed_stats_current
SELECT (jsonb_populate_record(NULL::bf4ps_reshape.detailed_stats_current,
            pg_temp.bf4ps_0011_detailed(c.data)
            || jsonb_build_object('soldier_id', c.soldier_id,
                                  'source_fetched_at', c.fetched_at,
                                  'updated_at', c.fetched_at))).*
FROM public.soldier_resource_current AS c
WHERE c.resource = 'detailed';

-- History: one snapshot per change of the retained counters. A 0.1 snapshot
-- that differs from its predecessor only in what BF4PS does not keep would
-- be a false snapshot here; it is left out.
INSERT INTO bf4ps_reshape.detailed_stats_history
OVERRIDING SYSTEM VALUE
SELECT (jsonb_populate_record(NULL::bf4ps_reshape.detailed_stats_history,
            h.mapped || jsonb_build_object('snapshot_id', h.history_id,
                                           'soldier_id', h.soldier_id,
                                           'observed_at', h.captured_at))).*
FROM (
    SELECT x.history_id, x.soldier_id, x.captured_at, x.mapped,
           lag(x.mapped) OVER (PARTITION BY x.soldier_id
                               ORDER BY x.captured_at, x.history_id) AS previous
    FROM (SELECT sdh.history_id, sdh.soldier_id, sdh.captured_at,
                 pg_temp.bf4ps_0011_detailed(sdh.data) AS mapped
          FROM public.soldier_detailed_history AS sdh) AS x
) AS h
WHERE h.previous IS DISTINCT FROM h.mapped;

-- Weapons and vehicles: the catalog from every document (the latest name and
-- category a guid was seen with; first and last seen from the fetches), and
-- each soldier's set. BF4PS keeps counters NOT NULL: a counter Battlelog did
-- not report (melee shots) is 0, as BF4PS stores it.
INSERT INTO bf4ps_reshape.weapon_catalog (weapon_guid, name, category, first_seen_at, last_seen_at)
SELECT e.guid,
       (array_agg(coalesce(nullif(btrim(e.item->>'name'), ''), e.guid)
                  ORDER BY c.fetched_at DESC))[1],
       (array_agg(e.item->>'category' ORDER BY c.fetched_at DESC))[1],
       min(c.fetched_at), max(c.fetched_at)
FROM public.soldier_resource_current AS c
CROSS JOIN LATERAL (SELECT w AS item, w->>'guid' AS guid
                    FROM jsonb_array_elements(c.data->'weapons') AS w) AS e
WHERE c.resource = 'weapons'
GROUP BY e.guid
ORDER BY e.guid;

INSERT INTO bf4ps_reshape.soldier_weapon_stats
    (soldier_id, weapon_id, kills, headshots, shots_fired, shots_hit, time_equipped_seconds,
     source_fetched_at, updated_at)
SELECT c.soldier_id, k.weapon_id,
       coalesce((w->>'kills')::bigint, 0), coalesce((w->>'headshots')::bigint, 0),
       coalesce((w->>'shots_fired')::bigint, 0), coalesce((w->>'shots_hit')::bigint, 0),
       coalesce((w->>'time_equipped_s')::bigint, 0), c.fetched_at, c.fetched_at
FROM public.soldier_resource_current AS c
CROSS JOIN LATERAL jsonb_array_elements(c.data->'weapons') AS w
JOIN bf4ps_reshape.weapon_catalog AS k ON k.weapon_guid = w->>'guid'
WHERE c.resource = 'weapons';

INSERT INTO bf4ps_reshape.vehicle_catalog (vehicle_guid, name, category, first_seen_at, last_seen_at)
SELECT e.guid,
       (array_agg(coalesce(nullif(btrim(e.item->>'name'), ''), e.guid)
                  ORDER BY c.fetched_at DESC))[1],
       (array_agg(e.item->>'category' ORDER BY c.fetched_at DESC))[1],
       min(c.fetched_at), max(c.fetched_at)
FROM public.soldier_resource_current AS c
CROSS JOIN LATERAL (SELECT v AS item, v->>'guid' AS guid
                    FROM jsonb_array_elements(c.data->'vehicles') AS v) AS e
WHERE c.resource = 'vehicles'
GROUP BY e.guid
ORDER BY e.guid;

INSERT INTO bf4ps_reshape.soldier_vehicle_stats
    (soldier_id, vehicle_id, kills, time_in_seconds, destroy_x_in_y, source_fetched_at, updated_at)
SELECT c.soldier_id, k.vehicle_id,
       coalesce((v->>'kills')::bigint, 0), coalesce((v->>'time_in_s')::bigint, 0),
       (v->>'destroyed')::bigint, c.fetched_at, c.fetched_at
FROM public.soldier_resource_current AS c
CROSS JOIN LATERAL jsonb_array_elements(c.data->'vehicles') AS v
JOIN bf4ps_reshape.vehicle_catalog AS k ON k.vehicle_guid = v->>'guid'
WHERE c.resource = 'vehicles';

-- ---------------------------------------------------------------------------
-- 3. Constraints and indexes, as the dump declares them (built once, after
--    the rows).
-- ---------------------------------------------------------------------------

ALTER TABLE ONLY bf4ps_reshape.battlelog_profiles
    ADD CONSTRAINT battlelog_profiles_pkey PRIMARY KEY (profile_id);

ALTER TABLE ONLY bf4ps_reshape.collection_state
    ADD CONSTRAINT collection_state_pkey PRIMARY KEY (soldier_id);

ALTER TABLE ONLY bf4ps_reshape.detailed_stats_current
    ADD CONSTRAINT detailed_stats_current_pkey PRIMARY KEY (soldier_id);

ALTER TABLE ONLY bf4ps_reshape.detailed_stats_history
    ADD CONSTRAINT detailed_stats_history_pkey PRIMARY KEY (snapshot_id);

ALTER TABLE ONLY bf4ps_reshape.discovery_state
    ADD CONSTRAINT discovery_state_pkey PRIMARY KEY (source_name);

ALTER TABLE ONLY bf4ps_reshape.outbound_dispatches
    ADD CONSTRAINT outbound_dispatches_pkey PRIMARY KEY (dispatch_id);

ALTER TABLE ONLY bf4ps_reshape.profile_soldiers
    ADD CONSTRAINT profile_soldiers_pkey PRIMARY KEY (profile_id, soldier_id);

ALTER TABLE ONLY bf4ps_reshape.request_gates
    ADD CONSTRAINT request_gates_pkey PRIMARY KEY (egress_key);

ALTER TABLE ONLY bf4ps_reshape.soldier_names
    ADD CONSTRAINT soldier_names_pkey PRIMARY KEY (soldier_name_id);

ALTER TABLE ONLY bf4ps_reshape.soldier_sources
    ADD CONSTRAINT soldier_sources_pkey PRIMARY KEY (soldier_id, source_type);

ALTER TABLE ONLY bf4ps_reshape.soldier_vehicle_stats
    ADD CONSTRAINT soldier_vehicle_stats_pkey PRIMARY KEY (soldier_id, vehicle_id);

ALTER TABLE ONLY bf4ps_reshape.soldier_weapon_stats
    ADD CONSTRAINT soldier_weapon_stats_pkey PRIMARY KEY (soldier_id, weapon_id);

ALTER TABLE ONLY bf4ps_reshape.soldiers
    ADD CONSTRAINT soldiers_pkey PRIMARY KEY (soldier_id);

ALTER TABLE ONLY bf4ps_reshape.stage9c_supervision_runs
    ADD CONSTRAINT stage9c_supervision_runs_pkey PRIMARY KEY (run_id);

ALTER TABLE ONLY bf4ps_reshape.outbound_dispatches
    ADD CONSTRAINT uq_outbound_dispatch_identity UNIQUE (job_id, attempt_number, resource, lease_token);

ALTER TABLE ONLY bf4ps_reshape.soldier_names
    ADD CONSTRAINT uq_soldier_names_soldier_name UNIQUE (soldier_id, name);

ALTER TABLE ONLY bf4ps_reshape.soldiers
    ADD CONSTRAINT uq_soldiers_persona_platform UNIQUE (persona_id, platform);

ALTER TABLE ONLY bf4ps_reshape.vehicle_catalog
    ADD CONSTRAINT vehicle_catalog_pkey PRIMARY KEY (vehicle_id);

ALTER TABLE ONLY bf4ps_reshape.vehicle_catalog
    ADD CONSTRAINT vehicle_catalog_vehicle_guid_key UNIQUE (vehicle_guid);

ALTER TABLE ONLY bf4ps_reshape.weapon_catalog
    ADD CONSTRAINT weapon_catalog_pkey PRIMARY KEY (weapon_id);

ALTER TABLE ONLY bf4ps_reshape.weapon_catalog
    ADD CONSTRAINT weapon_catalog_weapon_guid_key UNIQUE (weapon_guid);

CREATE INDEX ix_collection_state_detailed_due ON bf4ps_reshape.collection_state USING btree (detailed_next_due_at) WHERE (detailed_next_due_at IS NOT NULL);

CREATE INDEX ix_collection_state_profile_due ON bf4ps_reshape.collection_state USING btree (profile_next_due_at) WHERE (profile_next_due_at IS NOT NULL);

CREATE INDEX ix_collection_state_vehicles_due ON bf4ps_reshape.collection_state USING btree (vehicles_next_due_at) WHERE (vehicles_next_due_at IS NOT NULL);

CREATE INDEX ix_collection_state_weapons_due ON bf4ps_reshape.collection_state USING btree (weapons_next_due_at) WHERE (weapons_next_due_at IS NOT NULL);

CREATE INDEX ix_detailed_history_soldier_observed ON bf4ps_reshape.detailed_stats_history USING btree (soldier_id, observed_at DESC);

CREATE INDEX ix_outbound_dispatch_background_admitted ON bf4ps_reshape.outbound_dispatches USING btree (admitted_at) WHERE (lane = 'background'::text);

CREATE INDEX ix_outbound_dispatch_egress_admitted ON bf4ps_reshape.outbound_dispatches USING btree (egress_key, admitted_at);

CREATE INDEX ix_soldier_names_name_lower ON bf4ps_reshape.soldier_names USING btree (lower(name));

CREATE INDEX ix_soldiers_current_name_lower ON bf4ps_reshape.soldiers USING btree (lower(current_name));

CREATE INDEX ix_soldiers_last_seen ON bf4ps_reshape.soldiers USING btree (last_seen_at);

CREATE UNIQUE INDEX uq_battlelog_profiles_username_lower ON bf4ps_reshape.battlelog_profiles USING btree (lower(battlelog_username));

CREATE UNIQUE INDEX uq_stage9c_one_active_run ON bf4ps_reshape.stage9c_supervision_runs USING btree (state) WHERE (state = 'active'::text);

ALTER TABLE ONLY bf4ps_reshape.collection_state
    ADD CONSTRAINT collection_state_soldier_id_fkey FOREIGN KEY (soldier_id) REFERENCES bf4ps_reshape.soldiers(soldier_id) ON DELETE CASCADE;

ALTER TABLE ONLY bf4ps_reshape.detailed_stats_current
    ADD CONSTRAINT detailed_stats_current_soldier_id_fkey FOREIGN KEY (soldier_id) REFERENCES bf4ps_reshape.soldiers(soldier_id) ON DELETE CASCADE;

ALTER TABLE ONLY bf4ps_reshape.detailed_stats_history
    ADD CONSTRAINT detailed_stats_history_soldier_id_fkey FOREIGN KEY (soldier_id) REFERENCES bf4ps_reshape.soldiers(soldier_id) ON DELETE CASCADE;

ALTER TABLE ONLY bf4ps_reshape.profile_soldiers
    ADD CONSTRAINT profile_soldiers_profile_id_fkey FOREIGN KEY (profile_id) REFERENCES bf4ps_reshape.battlelog_profiles(profile_id) ON DELETE CASCADE;

ALTER TABLE ONLY bf4ps_reshape.profile_soldiers
    ADD CONSTRAINT profile_soldiers_soldier_id_fkey FOREIGN KEY (soldier_id) REFERENCES bf4ps_reshape.soldiers(soldier_id) ON DELETE CASCADE;

ALTER TABLE ONLY bf4ps_reshape.soldier_names
    ADD CONSTRAINT soldier_names_soldier_id_fkey FOREIGN KEY (soldier_id) REFERENCES bf4ps_reshape.soldiers(soldier_id) ON DELETE CASCADE;

ALTER TABLE ONLY bf4ps_reshape.soldier_sources
    ADD CONSTRAINT soldier_sources_soldier_id_fkey FOREIGN KEY (soldier_id) REFERENCES bf4ps_reshape.soldiers(soldier_id) ON DELETE CASCADE;

ALTER TABLE ONLY bf4ps_reshape.soldier_vehicle_stats
    ADD CONSTRAINT soldier_vehicle_stats_soldier_id_fkey FOREIGN KEY (soldier_id) REFERENCES bf4ps_reshape.soldiers(soldier_id) ON DELETE CASCADE;

ALTER TABLE ONLY bf4ps_reshape.soldier_vehicle_stats
    ADD CONSTRAINT soldier_vehicle_stats_vehicle_id_fkey FOREIGN KEY (vehicle_id) REFERENCES bf4ps_reshape.vehicle_catalog(vehicle_id) ON DELETE CASCADE;

ALTER TABLE ONLY bf4ps_reshape.soldier_weapon_stats
    ADD CONSTRAINT soldier_weapon_stats_soldier_id_fkey FOREIGN KEY (soldier_id) REFERENCES bf4ps_reshape.soldiers(soldier_id) ON DELETE CASCADE;

ALTER TABLE ONLY bf4ps_reshape.soldier_weapon_stats
    ADD CONSTRAINT soldier_weapon_stats_weapon_id_fkey FOREIGN KEY (weapon_id) REFERENCES bf4ps_reshape.weapon_catalog(weapon_id) ON DELETE CASCADE;

-- Identities continue after the moved rows.
DO $identities$
DECLARE
    r record;
    top bigint;
BEGIN
    FOR r IN SELECT c.relname, a.attname
             FROM pg_catalog.pg_attribute a
             JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'bf4ps_reshape' AND a.attidentity <> '' AND NOT a.attisdropped
    LOOP
        EXECUTE format('SELECT max(%I) FROM bf4ps_reshape.%I', r.attname, r.relname) INTO top;
        IF top IS NOT NULL THEN
            PERFORM pg_catalog.setval(
                pg_catalog.pg_get_serial_sequence(format('bf4ps_reshape.%I', r.relname), r.attname),
                top);
        END IF;
    END LOOP;
END
$identities$;

-- ---------------------------------------------------------------------------
-- 4. The swap.
-- ---------------------------------------------------------------------------

-- Every 0.1 trigger and function (0012 onwards defines the layer anew).
DROP TRIGGER trg_collection_jobs_notify_insert ON collection_jobs;
DROP TRIGGER trg_collection_jobs_notify_claimable ON collection_jobs;
DROP TRIGGER trg_collection_events_notify ON collection_events;
DROP FUNCTION bf4ps_notify_jobs_claimable();
DROP FUNCTION bf4ps_notify_job_claimable();
DROP FUNCTION bf4ps_notify_event();
DROP FUNCTION bf4ps_request_refresh(text, bigint, text[], interval, double precision);
DROP FUNCTION bf4ps_eta_seconds(bigint, integer, double precision, double precision);
DROP FUNCTION bf4ps_projection_horizon();
DROP FUNCTION bf4ps_collector_register(text, text, text, text, text, interval);
DROP FUNCTION bf4ps_collector_heartbeat(uuid, uuid);
DROP FUNCTION bf4ps_collector_stopped(uuid, uuid);
DROP FUNCTION bf4ps_collector_check_secret(uuid, uuid);
DROP FUNCTION bf4ps_egress_pass(text, bigint, bigint);
DROP FUNCTION bf4ps_freshness_compact();

-- The invented tables (their triggers, indexes and the contract tables'
-- foreign keys to soldiers go with them).
DROP TABLE soldier_detailed_history, soldier_resource_current, collection_state;
ALTER TABLE collection_jobs DROP CONSTRAINT collection_jobs_soldier_id_fkey;
ALTER TABLE collection_events DROP CONSTRAINT collection_events_soldier_id_fkey;
DROP TABLE soldiers;
DROP FUNCTION bf4ps_freshness_inserted();
DROP FUNCTION bf4ps_freshness_deleted();
DROP FUNCTION bf4ps_freshness_moved();
DROP FUNCTION bf4ps_freshness_truncated();
DROP FUNCTION bf4ps_freshness_stored_slot(timestamptz, timestamptz);
DROP FUNCTION bf4ps_freshness_slot(timestamptz);

-- The claim order's stored rank (0012 indexes the expression instead).
ALTER TABLE collection_jobs DROP COLUMN claim_rank;

DO $move$
DECLARE
    t text;
BEGIN
    FOR t IN SELECT c.relname FROM pg_catalog.pg_class c
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'bf4ps_reshape' AND c.relkind = 'r'
             ORDER BY c.relname
    LOOP
        EXECUTE format('ALTER TABLE bf4ps_reshape.%I SET SCHEMA public', t);
    END LOOP;
END
$move$;
DROP SCHEMA bf4ps_reshape;

-- The contract's foreign keys to soldiers, on BF4PS's table (validated by
-- 0012 in its own transaction, without blocking writers).
ALTER TABLE ONLY collection_events
    ADD CONSTRAINT collection_events_soldier_id_fkey FOREIGN KEY (soldier_id)
    REFERENCES soldiers(soldier_id) ON DELETE SET NULL NOT VALID;
ALTER TABLE ONLY collection_jobs
    ADD CONSTRAINT collection_jobs_soldier_id_fkey FOREIGN KEY (soldier_id)
    REFERENCES soldiers(soldier_id) ON DELETE CASCADE NOT VALID;
