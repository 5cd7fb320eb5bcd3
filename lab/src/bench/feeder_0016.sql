-- The sightings policy's choice as the feeder made it up to migration 0016,
-- before feeder_pairs (0017): one statement from every soldier sighted in
-- the active window. tests/it/feeder.rs checks that the incremental feeder
-- chooses exactly these, in this order; `bench feeder` times both. Binds as
-- the feeder's.
WITH active AS MATERIALIZED (
            SELECT src.soldier_id, max(src.last_seen_at) AS seen_at,
                   bool_or(src.source_type = 'bf4sw') AS sighted
            FROM soldier_sources AS src
            WHERE src.last_seen_at > $1 - make_interval(secs => $2::float8)
              AND src.last_seen_at <= $1
            GROUP BY src.soldier_id
        ), pairs AS MATERIALIZED (
            SELECT a.soldier_id, a.seen_at, a.sighted, p.resource, p.state, p.due_at,
                   p.error_class, p.attempted_at
            FROM active AS a
            JOIN collection_state AS cs ON cs.soldier_id = a.soldier_id
            CROSS JOIN LATERAL (VALUES
                ('detailed', cs.detailed_state, cs.detailed_next_due_at,
                 cs.detailed_last_error_class, cs.detailed_last_attempt_at),
                ('profile', cs.profile_state, cs.profile_next_due_at,
                 cs.profile_last_error_class, cs.profile_last_attempt_at),
                ('weapons', cs.weapons_state, cs.weapons_next_due_at,
                 cs.weapons_last_error_class, cs.weapons_last_attempt_at),
                ('vehicles', cs.vehicles_state, cs.vehicles_next_due_at,
                 cs.vehicles_last_error_class, cs.vehicles_last_attempt_at)
            ) AS p(resource, state, due_at, error_class, attempted_at)
            WHERE p.resource = ANY ($4::text[])
              AND (p.state = 'never_attempted' OR (p.state = 'success' AND p.due_at <= $1))
              AND NOT EXISTS (SELECT 1 FROM collection_jobs AS j
                              WHERE j.soldier_id = a.soldier_id AND j.resource = p.resource)
        ), boot AS (
            SELECT p.soldier_id, p.resource, 'bootstrap' AS class, 'bf4sw_new_soldier' AS reason,
                   $1 AS due_at, NULL::text AS error_class, NULL::timestamptz AS error_at,
                   row_number() OVER (ORDER BY so.first_seen_at, p.soldier_id, p.resource) AS k
            FROM pairs AS p JOIN soldiers AS so ON so.soldier_id = p.soldier_id
            WHERE p.state = 'never_attempted'
            ORDER BY so.first_seen_at, p.soldier_id, p.resource
            LIMIT $5
        ), act AS (
            SELECT p.soldier_id, p.resource, 'active', 'bf4sw_active_refresh', p.due_at,
                   NULL::text, NULL::timestamptz,
                   row_number() OVER (ORDER BY p.seen_at DESC, p.soldier_id,
                       (CASE p.resource WHEN 'detailed' THEN $10::integer
                            WHEN 'profile' THEN $11::integer WHEN 'weapons' THEN $12::integer
                            ELSE $13::integer END) DESC)
            FROM pairs AS p
            WHERE p.state = 'success' AND p.sighted
            ORDER BY p.seen_at DESC, p.soldier_id,
                     (CASE p.resource WHEN 'detailed' THEN $10::integer WHEN 'profile' THEN $11::integer
                      WHEN 'weapons' THEN $12::integer ELSE $13::integer END) DESC
            LIMIT $7
        ), retry AS (
            SELECT r.soldier_id, r.resource, 'active', 'retry', r.due_at, r.error_class,
                   r.attempted_at, row_number() OVER (ORDER BY r.due_at, r.soldier_id)
            FROM (
                (SELECT cs.soldier_id, 'detailed' AS resource, cs.detailed_next_due_at AS due_at,
                        cs.detailed_last_error_class AS error_class,
                        cs.detailed_last_attempt_at AS attempted_at
                 FROM collection_state AS cs
                 WHERE cs.detailed_state = 'temporary_failure' AND cs.detailed_next_due_at <= $1
                   AND NOT EXISTS (SELECT 1 FROM collection_jobs AS j
                                   WHERE j.soldier_id = cs.soldier_id AND j.resource = 'detailed')
                 ORDER BY cs.detailed_next_due_at LIMIT $6)
                UNION ALL
                (SELECT cs.soldier_id, 'profile', cs.profile_next_due_at,
                        cs.profile_last_error_class, cs.profile_last_attempt_at
                 FROM collection_state AS cs
                 WHERE cs.profile_state = 'temporary_failure' AND cs.profile_next_due_at <= $1
                   AND NOT EXISTS (SELECT 1 FROM collection_jobs AS j
                                   WHERE j.soldier_id = cs.soldier_id AND j.resource = 'profile')
                 ORDER BY cs.profile_next_due_at LIMIT $6)
                UNION ALL
                (SELECT cs.soldier_id, 'weapons', cs.weapons_next_due_at,
                        cs.weapons_last_error_class, cs.weapons_last_attempt_at
                 FROM collection_state AS cs
                 WHERE cs.weapons_state = 'temporary_failure' AND cs.weapons_next_due_at <= $1
                   AND NOT EXISTS (SELECT 1 FROM collection_jobs AS j
                                   WHERE j.soldier_id = cs.soldier_id AND j.resource = 'weapons')
                 ORDER BY cs.weapons_next_due_at LIMIT $6)
                UNION ALL
                (SELECT cs.soldier_id, 'vehicles', cs.vehicles_next_due_at,
                        cs.vehicles_last_error_class, cs.vehicles_last_attempt_at
                 FROM collection_state AS cs
                 WHERE cs.vehicles_state = 'temporary_failure' AND cs.vehicles_next_due_at <= $1
                   AND NOT EXISTS (SELECT 1 FROM collection_jobs AS j
                                   WHERE j.soldier_id = cs.soldier_id AND j.resource = 'vehicles')
                 ORDER BY cs.vehicles_next_due_at LIMIT $6)
            ) AS r
            WHERE r.resource = ANY ($4::text[])
              AND NOT EXISTS (SELECT 1 FROM collection_jobs AS j
                              WHERE j.soldier_id = r.soldier_id AND j.resource = r.resource)
            ORDER BY r.due_at
            LIMIT $6
        ), others AS (
            SELECT src.soldier_id,
                   src.last_seen_at > $1 - make_interval(secs => $3::float8) AS recent
            FROM soldier_sources AS src
            WHERE ($14 OR $15) AND src.source_type = 'bf4sw'
              AND src.last_seen_at <= $1 - make_interval(secs => $2::float8)
              AND (($14 AND src.last_seen_at > $1 - make_interval(secs => $3::float8))
                   OR ($15 AND src.last_seen_at <= $1 - make_interval(secs => $3::float8)))
        ), later AS (
            SELECT o.soldier_id, p.resource, 'recent',
                   CASE WHEN o.recent THEN 'recent_refresh' ELSE 'inactive_refresh' END,
                   p.due_at, NULL::text, NULL::timestamptz,
                   row_number() OVER (ORDER BY p.due_at, o.soldier_id)
            FROM others AS o
            JOIN collection_state AS cs ON cs.soldier_id = o.soldier_id
            CROSS JOIN LATERAL (VALUES
                ('detailed', cs.detailed_state, cs.detailed_next_due_at),
                ('profile', cs.profile_state, cs.profile_next_due_at),
                ('weapons', cs.weapons_state, cs.weapons_next_due_at),
                ('vehicles', cs.vehicles_state, cs.vehicles_next_due_at)
            ) AS p(resource, state, due_at)
            WHERE p.resource = ANY ($4::text[]) AND p.state = 'success' AND p.due_at <= $1
              AND NOT EXISTS (SELECT 1 FROM collection_jobs AS j
                              WHERE j.soldier_id = o.soldier_id AND j.resource = p.resource)
            ORDER BY p.due_at, o.soldier_id
            LIMIT $8
        ), chosen AS (
            SELECT c.*, row_number() OVER () AS n FROM (
                SELECT *, 1 AS tier FROM boot
                UNION ALL SELECT *, 2 FROM retry
                UNION ALL SELECT *, 3 FROM act
                UNION ALL SELECT *, 4 FROM later
            ) AS c
            ORDER BY c.tier, c.k
            LIMIT $8
        )
SELECT soldier_id, resource, class, reason FROM chosen ORDER BY n
