-- Rows in BF4PS's shapes and vocabulary, for a database built from
-- docs/spec/bf4ps-database-0005.sql (tests/it/adopt.rs). Identities start at
-- 1 on a fresh database: soldiers 1-6, profiles 1-2, weapons 1-3,
-- vehicles 1-2, snapshots 1-3, jobs 1-6, events 1-8.

INSERT INTO public.alembic_version (version_num) VALUES ('0005_stage9c_dispatch_ledger');

INSERT INTO public.soldiers (persona_id, platform, current_name, first_seen_at, last_seen_at,
                             created_at, updated_at) VALUES
    (303498475, 'pc', 'Sgt_Kowalski', now() - interval '400 days', now() - interval '2 hours',
     now() - interval '400 days', now() - interval '2 hours'),
    (1006883131478, 'pc', 'xXNoScopeXx', now() - interval '90 days', now() - interval '3 days',
     now() - interval '90 days', now() - interval '3 days'),
    (455123987, 'pc', 'quiet_medic', now() - interval '200 days', now() - interval '20 days',
     now() - interval '200 days', now() - interval '20 days'),
    (455123988, 'pc', 'newcomer_01', now() - interval '1 hour', now() - interval '1 hour',
     now() - interval '1 hour', now() - interval '1 hour'),
    (998877, 'ps4', 'GoneFromBattlelog', now() - interval '300 days', now() - interval '30 days',
     now() - interval '300 days', now() - interval '30 days'),
    (123456789, 'xboxone', 'Manual Add', now() - interval '10 days', now() - interval '10 days',
     now() - interval '10 days', now() - interval '10 days');

INSERT INTO public.soldier_names (soldier_id, name, first_seen_at, last_seen_at) VALUES
    (1, 'Kowalski_old', now() - interval '400 days', now() - interval '100 days'),
    (1, 'Sgt_Kowalski', now() - interval '100 days', now() - interval '2 hours'),
    (2, 'xXNoScopeXx', now() - interval '90 days', now() - interval '3 days'),
    (3, 'quiet_medic', now() - interval '200 days', now() - interval '20 days'),
    (4, 'newcomer_01', now() - interval '1 hour', now() - interval '1 hour'),
    (5, 'GoneFromBattlelog', now() - interval '300 days', now() - interval '30 days'),
    (6, 'Manual Add', now() - interval '10 days', now() - interval '10 days');

INSERT INTO public.soldier_sources (soldier_id, source_type, first_seen_at, last_seen_at) VALUES
    (1, 'bf4sw', now() - interval '400 days', now() - interval '2 hours'),
    (1, 'manual', now() - interval '50 days', now() - interval '50 days'),
    (2, 'bf4sw', now() - interval '90 days', now() - interval '3 days'),
    (3, 'bf4sw', now() - interval '200 days', now() - interval '20 days'),
    (4, 'bf4sw', now() - interval '1 hour', now() - interval '1 hour'),
    (5, 'bf4sw', now() - interval '300 days', now() - interval '30 days'),
    (6, 'manual', now() - interval '10 days', now() - interval '10 days');

INSERT INTO public.battlelog_profiles (battlelog_username, battlelog_user_id, country_code,
                                       country_name, access_state, last_checked_at,
                                       last_success_at, last_error) VALUES
    ('Sgt_Kowalski', 2832658801, 'PL', 'Poland', 'public_country', now() - interval '5 days',
     now() - interval '5 days', NULL),
    ('xXNoScopeXx', NULL, NULL, NULL, 'friends_only', now() - interval '8 days',
     now() - interval '8 days', NULL);

INSERT INTO public.profile_soldiers (profile_id, soldier_id, first_seen_at, last_seen_at) VALUES
    (1, 1, now() - interval '60 days', now() - interval '5 days'),
    (2, 2, now() - interval '30 days', now() - interval '8 days');

INSERT INTO public.detailed_stats_current (soldier_id, rank, time_played_seconds, total_score,
        kills, deaths, wins, losses, shots_fired, shots_hit, headshots, quit_percentage,
        longest_headshot, highest_kill_streak, squad_score, defuse_score, source_fetched_at,
        updated_at) VALUES
    (1, 140, 3600000, 12345678, 20000, 10000, 900, 700, 1000000, 180000, 4000, 3.141593,
     1234.5679, 31, 10, 6, now() - interval '30 hours', now() - interval '30 hours'),
    (2, 55, 720000, 2345678, 3000, 2900, 100, 120, 200000, 30000, 500, 12.5, 402.75, 12, 3, 0,
     now() - interval '3 days', now() - interval '3 days');

INSERT INTO public.detailed_stats_history (soldier_id, rank, time_played_seconds, total_score,
        kills, deaths, quit_percentage, longest_headshot, observed_at) VALUES
    (1, 139, 3500000, 12000000, 19500, 9800, 3.141590, 1234.5679, now() - interval '10 days'),
    (1, 140, 3600000, 12345678, 20000, 10000, 3.141593, 1234.5679, now() - interval '30 hours'),
    (2, 55, 720000, 2345678, 3000, 2900, 12.5, 402.75, now() - interval '3 days');

INSERT INTO public.weapon_catalog (weapon_guid, name, slug, category, first_seen_at,
                                   last_seen_at) VALUES
    ('7E3C8C3B-1E6B-4E5B-9B49-0000000000A1', 'AK-12', 'ak-12', 'Assault rifles',
     now() - interval '400 days', now() - interval '30 hours'),
    ('7E3C8C3B-1E6B-4E5B-9B49-0000000000A2', 'Knife', 'knife', 'Melee',
     now() - interval '400 days', now() - interval '30 hours'),
    ('7E3C8C3B-1E6B-4E5B-9B49-0000000000A3', 'SRR-61', 'srr-61', 'Sniper rifles',
     now() - interval '200 days', now() - interval '3 days');

INSERT INTO public.soldier_weapon_stats (soldier_id, weapon_id, kills, headshots, shots_fired,
        shots_hit, time_equipped_seconds, source_fetched_at, updated_at) VALUES
    (1, 1, 5000, 900, 90000, 18000, 360000, now() - interval '30 hours', now() - interval '30 hours'),
    (1, 2, 120, 0, 0, 0, 0, now() - interval '30 hours', now() - interval '30 hours'),
    (2, 3, 800, 400, 6000, 1500, 72000, now() - interval '3 days', now() - interval '3 days');

INSERT INTO public.vehicle_catalog (vehicle_guid, name, slug, category, first_seen_at,
                                    last_seen_at) VALUES
    ('A1B2C3D4-0000-0000-0000-0000000000B1', 'M1 Abrams', 'm1-abrams', 'Main battle tanks',
     now() - interval '400 days', now() - interval '30 hours'),
    ('A1B2C3D4-0000-0000-0000-0000000000B2', 'RHIB', 'rhib', 'Boats',
     now() - interval '400 days', now() - interval '30 hours');

INSERT INTO public.soldier_vehicle_stats (soldier_id, vehicle_id, kills, time_in_seconds,
        destroy_x_in_y, source_fetched_at, updated_at) VALUES
    (1, 1, 700, 90000, 45, now() - interval '30 hours', now() - interval '30 hours'),
    (1, 2, 3, 1200, NULL, now() - interval '30 hours', now() - interval '30 hours');

-- One row per soldier, as discovery inserts it; then what BF4PS's
-- collectors left.
INSERT INTO public.collection_state (soldier_id) SELECT soldier_id FROM public.soldiers;
UPDATE public.collection_state SET
    detailed_state = 'success', detailed_last_attempt_at = now() - interval '30 hours',
    detailed_last_success_at = now() - interval '30 hours',
    detailed_next_due_at = now() - interval '6 hours',
    weapons_state = 'success', weapons_last_attempt_at = now() - interval '30 hours',
    weapons_last_success_at = now() - interval '30 hours',
    weapons_next_due_at = now() + interval '5 days',
    vehicles_state = 'success', vehicles_last_attempt_at = now() - interval '30 hours',
    vehicles_last_success_at = now() - interval '30 hours',
    vehicles_next_due_at = now() + interval '5 days',
    updated_at = now() - interval '30 hours'
WHERE soldier_id = 1;
UPDATE public.collection_state SET
    detailed_state = 'success', detailed_last_attempt_at = now() - interval '3 days',
    detailed_last_success_at = now() - interval '3 days',
    detailed_next_due_at = now() - interval '2 days',
    weapons_state = 'temporary_failure', weapons_last_attempt_at = now() - interval '2 hours',
    weapons_next_due_at = now() + interval '4 hours', weapons_consecutive_failures = 3,
    weapons_last_error_class = 'battlelog_http',
    weapons_last_error_message = 'HTTP 503 from Battlelog',
    updated_at = now() - interval '2 hours'
WHERE soldier_id = 2;
UPDATE public.collection_state SET
    detailed_state = 'unavailable', detailed_last_attempt_at = now() - interval '30 days',
    detailed_last_error_class = 'not_found',
    detailed_last_error_message = 'persona not found',
    updated_at = now() - interval '30 days'
WHERE soldier_id = 5;

INSERT INTO public.discovery_state (source_name, last_alias_id, last_poll_at, last_success_at,
                                    last_error, updated_at) VALUES
    ('bf4sw_aliases', 48213977, now() - interval '1 minute', now() - interval '1 minute', NULL,
     now() - interval '1 minute');

INSERT INTO public.request_gates (egress_key, next_request_at, updated_at) VALUES
    ('phase3e-hnl-01', now() - interval '10 minutes', now() - interval '10 minutes'),
    ('phase3e-kah-01', now() - interval '10 minutes', now() - interval '10 minutes'),
    ('phase3e-tcou', now() - interval '10 minutes', now() - interval '10 minutes');

-- BF4PS's three production collectors, with their frozen identities.
INSERT INTO public.collectors (collector_uuid, collector_name, hostname, lane, egress_key,
        enabled, drained, software_version, started_at, last_heartbeat_at, heartbeat_state,
        created_at, updated_at) VALUES
    ('b2b3ef60-62e8-4d4a-91b0-41a2e2a3e001', 'phase3e-hnl-01', 'hnl-01', 'background',
     'phase3e-hnl-01', true, false, 'phase5b-production', now() - interval '3 days',
     now() - interval '10 minutes', 'healthy', now() - interval '90 days', now() - interval '10 minutes'),
    ('b2b3ef60-62e8-4d4a-91b0-41a2e2a3e002', 'phase3e-kah-01', 'kah-01', 'background',
     'phase3e-kah-01', true, false, 'phase5b-production', now() - interval '3 days',
     now() - interval '10 minutes', 'healthy', now() - interval '90 days', now() - interval '10 minutes'),
    ('b2b3ef60-62e8-4d4a-91b0-41a2e2a3e003', 'phase3e-tcou', 'tcou', 'background',
     'phase3e-tcou', true, false, 'phase5b-production', now() - interval '3 days',
     now() - interval '10 minutes', 'healthy', now() - interval '90 days', now() - interval '10 minutes');

-- Jobs: discovery's bootstrap jobs for the newcomer, the due detailed of
-- soldier 1, and two leased by BF4PS's collectors when they stopped (their
-- 120 s leases ran out).
INSERT INTO public.collection_jobs (soldier_id, resource, lane, priority_class, reason, status,
        priority_value, eligible_at, attempt_count, created_at, updated_at) VALUES
    (4, 'detailed', 'background', 'bootstrap', 'discovered', 'pending', 0,
     now() - interval '1 hour', 0, now() - interval '1 hour', now() - interval '1 hour'),
    (4, 'weapons', 'background', 'bootstrap', 'discovered', 'pending', 0,
     now() - interval '1 hour', 0, now() - interval '1 hour', now() - interval '1 hour'),
    (4, 'vehicles', 'background', 'bootstrap', 'discovered', 'pending', 0,
     now() - interval '1 hour', 0, now() - interval '1 hour', now() - interval '1 hour'),
    (1, 'detailed', 'background', 'active', 'due', 'pending', 0,
     now() - interval '6 hours', 0, now() - interval '6 hours', now() - interval '6 hours');
INSERT INTO public.collection_jobs (soldier_id, resource, lane, priority_class, reason, status,
        priority_value, eligible_at, attempt_count, collector_uuid, lease_token, claimed_at,
        started_at, lease_expires_at, last_error_class, last_error_at, created_at, updated_at)
VALUES
    (2, 'detailed', 'background', 'active', 'due', 'running', 0, now() - interval '2 days', 1,
     'b2b3ef60-62e8-4d4a-91b0-41a2e2a3e001', 'c0ffee00-0000-4000-8000-000000000001',
     now() - interval '12 minutes', now() - interval '12 minutes', now() - interval '10 minutes',
     NULL, NULL, now() - interval '2 days', now() - interval '12 minutes'),
    (2, 'weapons', 'background', 'active', 'retry', 'claimed', 0, now() - interval '2 hours', 3,
     'b2b3ef60-62e8-4d4a-91b0-41a2e2a3e002', 'c0ffee00-0000-4000-8000-000000000002',
     now() - interval '12 minutes', NULL, now() - interval '10 minutes',
     'battlelog_http', now() - interval '2 hours', now() - interval '1 day',
     now() - interval '12 minutes');
UPDATE public.collectors SET current_job_id = 5
WHERE collector_uuid = 'b2b3ef60-62e8-4d4a-91b0-41a2e2a3e001';

-- History in BF4PS's vocabulary: a run marker, attempts and their outcomes.
INSERT INTO public.collection_events (occurred_at, event_type, result, metadata) VALUES
    (now() - interval '3 days', 'phase5b_step7_run_started', 'started',
     '{"run_number": 7, "initial_job_count": 3888, "global_attempt_ceiling": 3888}');
INSERT INTO public.collection_events (occurred_at, collector_uuid, collector_name_snapshot,
        hostname_snapshot, egress_key_snapshot, job_id, soldier_id, persona_id, platform,
        resource, lane, event_type, attempt_number, result, duration_ms, http_status,
        error_class, error_message, lease_token, metadata) VALUES
    (now() - interval '30 hours' - interval '2 seconds', 'b2b3ef60-62e8-4d4a-91b0-41a2e2a3e001',
     'phase3e-hnl-01', 'hnl-01', 'phase3e-hnl-01', 900, 1, 303498475, 'pc', 'detailed',
     'background', 'collection_attempt_started', 1, NULL, NULL, NULL, NULL, NULL,
     'c0ffee00-0000-4000-8000-0000000000a1',
     '{"physical_request": true, "priority_class": "active", "retry": false}'),
    (now() - interval '30 hours', 'b2b3ef60-62e8-4d4a-91b0-41a2e2a3e001', 'phase3e-hnl-01',
     'hnl-01', 'phase3e-hnl-01', 900, 1, 303498475, 'pc', 'detailed', 'background',
     'collection_success', 1, 'success', 1840, 200, NULL, NULL,
     'c0ffee00-0000-4000-8000-0000000000a1', '{"history_appended": true}'),
    (now() - interval '30 hours', 'b2b3ef60-62e8-4d4a-91b0-41a2e2a3e002', 'phase3e-kah-01',
     'kah-01', 'phase3e-kah-01', 901, 1, 303498475, 'pc', 'weapons', 'background',
     'collection_success', 1, 'success', 2310, 200, NULL, NULL,
     'c0ffee00-0000-4000-8000-0000000000a2', '{"weapon_rows": 2, "response_bytes": 612004}'),
    (now() - interval '2 hours', 'b2b3ef60-62e8-4d4a-91b0-41a2e2a3e002', 'phase3e-kah-01',
     'kah-01', 'phase3e-kah-01', 6, 2, 1006883131478, 'pc', 'weapons', 'background',
     'collection_failure', 3, 'temporary_failure', 30012, 503, 'battlelog_http',
     'HTTP 503 from Battlelog', 'c0ffee00-0000-4000-8000-0000000000a3',
     '{"retry_after_seconds": 21600}'),
    (now() - interval '26 hours', 'b2b3ef60-62e8-4d4a-91b0-41a2e2a3e003', 'phase3e-tcou',
     'tcou', 'phase3e-tcou', 902, 3, 455123987, 'pc', 'vehicles', 'background',
     'collection_persistence_failure', 1, 'persistence_failure', 2900, NULL,
     'psycopg.errors.DeadlockDetected', 'deadlock detected',
     'c0ffee00-0000-4000-8000-0000000000a4',
     '{"response_bytes": 455001, "stage": "persist_vehicle_success"}');
INSERT INTO public.collection_events (occurred_at, egress_key_snapshot, soldier_id, persona_id,
        platform, resource, lane, event_type, attempt_number, result, duration_ms, http_status,
        metadata) VALUES
    (now() - interval '26 hours', 'phase3e-tcou', 3, 455123987, 'pc', 'vehicles', 'background',
     'collection_duplicate_discarded', 1, 'duplicate_discarded', 2950, 200,
     '{"original_job_id": 902, "original_collector_uuid": "b2b3ef60-62e8-4d4a-91b0-41a2e2a3e003", "original_lease_token": "c0ffee00-0000-4000-8000-0000000000a4", "winner_event_id": 3, "reason": "confirmed_competing_success"}'),
    (now() - interval '12 minutes', NULL, 2, 1006883131478, 'pc', 'detailed', 'background',
     'collection_attempt_started', 1, NULL, NULL, NULL,
     '{"physical_request": true, "priority_class": "active", "retry": false}');

INSERT INTO public.stage9c_supervision_runs (run_id, state, cutover_at, since_event_id,
        started_at, deadline_at, watchdog_owner, watchdog_generation, heartbeat_at,
        lease_expires_at, created_at, updated_at) VALUES
    ('5a9c0000-0000-4000-8000-000000000001', 'completed', now() - interval '20 days', 1,
     now() - interval '20 days', now() - interval '20 days' + interval '6 hours',
     'b2b3ef60-62e8-4d4a-91b0-41a2e2a3e001', 4, now() - interval '19 days 18 hours',
     now() - interval '19 days 17 hours', now() - interval '20 days', now() - interval '19 days');

INSERT INTO public.outbound_dispatches (dispatch_id, job_id, attempt_number, resource,
        lease_token, collector_uuid, egress_key, lane, payload_fingerprint, admitted_at, phase,
        send_marked_at, acknowledged_at) VALUES
    ('d15a0000-0000-4000-8000-000000000001', 900, 1, 'detailed',
     'c0ffee00-0000-4000-8000-0000000000a1', 'b2b3ef60-62e8-4d4a-91b0-41a2e2a3e001',
     'phase3e-hnl-01', 'background', 'sha256:4be1f0c2', now() - interval '30 hours' - interval '3 seconds',
     'acknowledged', now() - interval '30 hours' - interval '2 seconds', now() - interval '30 hours');
