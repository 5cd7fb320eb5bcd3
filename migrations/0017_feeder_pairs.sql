-- 0017: the feeder's incremental queue (issue 29). A feed cycle used to
-- start from every soldier sighted in the active window (one
-- soldier_sources row each, then their state rows): 19 s a cycle with
-- 1,000,000 soldiers in the window. feeder_pairs is a derived copy of what
-- the sightings policy needs per (soldier, resource), kept by triggers on
-- BF4PS's tables in the writer's own transaction, so a cycle reads only
-- the pairs it moves or feeds:
--
--   kind     1 never attempted (bootstrap), 2 success (refreshed when due),
--            0 anything else (temporary_failure: the retry indexes of 0016;
--            unavailable: never);
--   live_at  the sighting that keeps the pair in the active window: any
--            source for a bootstrap pair, discovery's (bf4sw) for a
--            success pair (BF4PS refreshes only soldiers it saw play);
--   seen_at  the latest sighting of any source (the active order);
--   phase    0 parked, 1 waiting for due_at, 2 ready to feed. Only the
--            feeder moves a pair forward, one bounded step each cycle, at
--            its own clock and window (so the scheduling simulation's
--            virtual clock works as the real one): parked pairs whose
--            live_at entered the window become waiting (success) or ready
--            (bootstrap), waiting pairs whose due_at passed become ready,
--            ready or waiting pairs whose live_at left the window are
--            parked. A trigger parks a pair whose kind or due time changed.
--
-- collection_state, soldier_sources and soldiers stay the truth: every
-- trigger recomputes the pairs of the soldiers a statement touched from
-- them (bf4ps_feeder_sync), so the copy cannot drift from what discovery
-- and finalization wrote. The triggers are SECURITY DEFINER (owned by
-- bf4ps_definer, pinned search_path): BF4PS's discovery needs no privilege
-- on feeder_pairs.
--
-- RELEASED once merged: never edit this file. Add a new migration instead.

CREATE TABLE feeder_pairs (
    soldier_id bigint NOT NULL,
    resource text NOT NULL,
    kind smallint NOT NULL,
    phase smallint NOT NULL DEFAULT 0,
    due_at timestamptz,
    live_at timestamptz,
    seen_at timestamptz,
    first_seen_at timestamptz,

    PRIMARY KEY (soldier_id, resource),
    CONSTRAINT feeder_pairs_resource_check
        CHECK (resource IN ('detailed', 'profile', 'weapons', 'vehicles')),
    CONSTRAINT feeder_pairs_kind_check CHECK (kind IN (0, 1, 2)),
    CONSTRAINT feeder_pairs_phase_check CHECK (phase IN (0, 1, 2))
);

-- Every cycle moves a few pairs between phases (an update of an indexed
-- column, never HOT): vacuum it sooner than the default 20 % of its rows.
ALTER TABLE feeder_pairs SET (autovacuum_vacuum_scale_factor = 0.02,
                              autovacuum_analyze_scale_factor = 0.02);

-- Pairs that may be fed, by phase and the sighting that keeps them: the
-- feeder parks the waiting and ready slice that left the window, and wakes
-- the parked slice inside it (normally only what a sighting or a
-- finalization touched since the last cycle). Phase leads, so each step is
-- one range whatever the statistics say.
CREATE INDEX ix_feeder_pairs_live ON feeder_pairs (phase, live_at) WHERE kind > 0;
-- Success pairs by phase and due time: the feeder promotes the waiting ones
-- that came due.
CREATE INDEX ix_feeder_pairs_due ON feeder_pairs (phase, due_at) WHERE kind = 2 AND phase = 1;
-- Ready pairs in the policy's orders: bootstrap by the soldier's first
-- sighting, active by the latest sighting first.
CREATE INDEX ix_feeder_pairs_bootstrap ON feeder_pairs (resource, first_seen_at, soldier_id)
    WHERE phase = 2 AND kind = 1;
CREATE INDEX ix_feeder_pairs_active ON feeder_pairs (resource, seen_at DESC, soldier_id)
    WHERE phase = 2 AND kind = 2;

CREATE OR REPLACE FUNCTION pg_temp.bf4ps_define(body text) RETURNS void
LANGUAGE plpgsql
-- The migration's own search_path: it finds collection_jobs' schema.
SET search_path FROM CURRENT
AS $$
BEGIN
    EXECUTE replace(body, '@schema@',
                    (SELECT quote_ident(n.nspname)
                     FROM pg_catalog.pg_class c
                     JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                     WHERE c.oid = 'collection_jobs'::regclass));
END;
$$;

SELECT pg_temp.bf4ps_define($body$
-- The pairs of soldiers `p_ids`, recomputed from collection_state,
-- soldier_sources and soldiers. A pair whose kind or due time changed is
-- parked (the feeder brings it forward at its own clock); one whose
-- sightings changed keeps its phase. A soldier without a state row has no
-- pairs.
CREATE FUNCTION @schema@.bf4ps_feeder_sync(p_ids bigint[]) RETURNS void
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
    -- (Each id probes the indexes, never `= ANY (p_ids)` against every row:
    -- a bulk statement passes thousands.)
    DELETE FROM @schema@.feeder_pairs AS f
    WHERE f.soldier_id IN (
        SELECT i.id FROM unnest(p_ids) AS i(id)
        WHERE NOT EXISTS (SELECT 1 FROM @schema@.collection_state AS cs
                          WHERE cs.soldier_id = i.id));
    INSERT INTO @schema@.feeder_pairs AS f
        (soldier_id, resource, kind, phase, due_at, live_at, seen_at, first_seen_at)
    SELECT cs.soldier_id, p.resource, p.kind, 0, p.due_at,
           CASE p.kind WHEN 1 THEN src.seen_any ELSE src.seen_bf4sw END,
           src.seen_any, so.first_seen_at
    FROM (SELECT DISTINCT i.id FROM unnest(p_ids) AS i(id)) AS i
    JOIN @schema@.collection_state AS cs ON cs.soldier_id = i.id
    LEFT JOIN @schema@.soldiers AS so ON so.soldier_id = cs.soldier_id
    LEFT JOIN LATERAL (
        SELECT max(s.last_seen_at) AS seen_any,
               max(s.last_seen_at) FILTER (WHERE s.source_type = 'bf4sw') AS seen_bf4sw
        FROM @schema@.soldier_sources AS s WHERE s.soldier_id = cs.soldier_id
    ) AS src ON true
    CROSS JOIN LATERAL (VALUES
        ('detailed', cs.detailed_state, cs.detailed_next_due_at),
        ('profile', cs.profile_state, cs.profile_next_due_at),
        ('weapons', cs.weapons_state, cs.weapons_next_due_at),
        ('vehicles', cs.vehicles_state, cs.vehicles_next_due_at)
    ) AS x(resource, state, due_at)
    CROSS JOIN LATERAL (SELECT x.resource,
                               (CASE x.state WHEN 'never_attempted' THEN 1
                                             WHEN 'success' THEN 2 ELSE 0 END)::smallint AS kind,
                               x.due_at) AS p
    ORDER BY cs.soldier_id, p.resource
    ON CONFLICT (soldier_id, resource) DO UPDATE
    SET kind = EXCLUDED.kind, due_at = EXCLUDED.due_at, live_at = EXCLUDED.live_at,
        seen_at = EXCLUDED.seen_at, first_seen_at = EXCLUDED.first_seen_at,
        phase = CASE WHEN f.kind = EXCLUDED.kind
                          AND f.due_at IS NOT DISTINCT FROM EXCLUDED.due_at
                          AND EXCLUDED.live_at IS NOT NULL
                     THEN f.phase ELSE 0 END
    WHERE (f.kind, f.due_at, f.live_at, f.seen_at, f.first_seen_at)
          IS DISTINCT FROM (EXCLUDED.kind, EXCLUDED.due_at, EXCLUDED.live_at,
                            EXCLUDED.seen_at, EXCLUDED.first_seen_at);
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
-- Statement triggers with a transition table named bf4ps_rows (inserted,
-- updated or deleted rows of collection_state or soldier_sources).
CREATE FUNCTION @schema@.bf4ps_feeder_rows_changed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    PERFORM @schema@.bf4ps_feeder_sync(
        ARRAY(SELECT DISTINCT r.soldier_id FROM bf4ps_rows AS r ORDER BY 1));
    RETURN NULL;
END;
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
-- Row triggers (a finalization's state row, a soldier's first sighting).
CREATE FUNCTION @schema@.bf4ps_feeder_row_changed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    PERFORM @schema@.bf4ps_feeder_sync(ARRAY[NEW.soldier_id]);
    RETURN NULL;
END;
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
-- TRUNCATE of collection_state bypasses row and statement triggers.
CREATE FUNCTION @schema@.bf4ps_feeder_truncated() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    DELETE FROM @schema@.feeder_pairs;
    RETURN NULL;
END;
$$;
$body$);

DO $owners$
DECLARE
    s text := (SELECT quote_ident(n.nspname)
               FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
               WHERE c.oid = 'collection_jobs'::regclass);
    f text;
BEGIN
    EXECUTE format('GRANT USAGE, CREATE ON SCHEMA %s TO bf4ps_definer', s);
    FOREACH f IN ARRAY ARRAY[
        'bf4ps_feeder_sync(bigint[])',
        'bf4ps_feeder_rows_changed()',
        'bf4ps_feeder_row_changed()',
        'bf4ps_feeder_truncated()']
    LOOP
        EXECUTE format('ALTER FUNCTION %s.%s OWNER TO bf4ps_definer', s, f);
        EXECUTE format('REVOKE ALL ON FUNCTION %s.%s FROM PUBLIC', s, f);
    END LOOP;
    EXECUTE format('REVOKE CREATE ON SCHEMA %s FROM bf4ps_definer', s);
END
$owners$;

GRANT SELECT, INSERT, UPDATE, DELETE ON feeder_pairs TO bf4ps_definer;
GRANT SELECT ON feeder_pairs TO bf4ps_reader;

-- The triggers, then the fill from the rows as they are now: creating a
-- trigger takes a SHARE ROW EXCLUSIVE lock on its table until this
-- migration commits, so nothing slips between the fill and the first
-- trigger call (BF4PS's discovery waits for the fill: ~1 s per 200,000
-- soldiers).
CREATE TRIGGER trg_collection_state_feeder_insert
    AFTER INSERT ON collection_state
    REFERENCING NEW TABLE AS bf4ps_rows
    FOR EACH STATEMENT EXECUTE FUNCTION bf4ps_feeder_rows_changed();

CREATE TRIGGER trg_collection_state_feeder_delete
    AFTER DELETE ON collection_state
    REFERENCING OLD TABLE AS bf4ps_rows
    FOR EACH STATEMENT EXECUTE FUNCTION bf4ps_feeder_rows_changed();

-- Row level with a WHEN on the raw columns: a finalization calls PL/pgSQL
-- only when a state or a due time changed.
CREATE TRIGGER trg_collection_state_feeder_update
    AFTER UPDATE ON collection_state
    FOR EACH ROW
    WHEN (OLD.detailed_state IS DISTINCT FROM NEW.detailed_state
          OR OLD.detailed_next_due_at IS DISTINCT FROM NEW.detailed_next_due_at
          OR OLD.profile_state IS DISTINCT FROM NEW.profile_state
          OR OLD.profile_next_due_at IS DISTINCT FROM NEW.profile_next_due_at
          OR OLD.weapons_state IS DISTINCT FROM NEW.weapons_state
          OR OLD.weapons_next_due_at IS DISTINCT FROM NEW.weapons_next_due_at
          OR OLD.vehicles_state IS DISTINCT FROM NEW.vehicles_state
          OR OLD.vehicles_next_due_at IS DISTINCT FROM NEW.vehicles_next_due_at
          OR OLD.soldier_id IS DISTINCT FROM NEW.soldier_id)
    EXECUTE FUNCTION bf4ps_feeder_row_changed();

CREATE TRIGGER trg_collection_state_feeder_truncate
    AFTER TRUNCATE ON collection_state
    FOR EACH STATEMENT EXECUTE FUNCTION bf4ps_feeder_truncated();

CREATE TRIGGER trg_soldier_sources_feeder_insert
    AFTER INSERT ON soldier_sources
    REFERENCING NEW TABLE AS bf4ps_rows
    FOR EACH STATEMENT EXECUTE FUNCTION bf4ps_feeder_rows_changed();

CREATE TRIGGER trg_soldier_sources_feeder_update
    AFTER UPDATE ON soldier_sources
    REFERENCING NEW TABLE AS bf4ps_rows
    FOR EACH STATEMENT EXECUTE FUNCTION bf4ps_feeder_rows_changed();

CREATE TRIGGER trg_soldier_sources_feeder_delete
    AFTER DELETE ON soldier_sources
    REFERENCING OLD TABLE AS bf4ps_rows
    FOR EACH STATEMENT EXECUTE FUNCTION bf4ps_feeder_rows_changed();

CREATE TRIGGER trg_soldiers_feeder_first_seen
    AFTER UPDATE ON soldiers
    FOR EACH ROW
    WHEN (OLD.first_seen_at IS DISTINCT FROM NEW.first_seen_at)
    EXECUTE FUNCTION bf4ps_feeder_row_changed();

-- The fill: every pair parked; the feeder's first cycles bring the window's
-- forward (bounded steps, at its clock and window).
INSERT INTO feeder_pairs (soldier_id, resource, kind, phase, due_at, live_at, seen_at, first_seen_at)
SELECT cs.soldier_id, p.resource, p.kind, 0, p.due_at,
       CASE p.kind WHEN 1 THEN src.seen_any ELSE src.seen_bf4sw END,
       src.seen_any, so.first_seen_at
FROM collection_state AS cs
LEFT JOIN soldiers AS so ON so.soldier_id = cs.soldier_id
LEFT JOIN (
    SELECT s.soldier_id, max(s.last_seen_at) AS seen_any,
           max(s.last_seen_at) FILTER (WHERE s.source_type = 'bf4sw') AS seen_bf4sw
    FROM soldier_sources AS s GROUP BY s.soldier_id
) AS src ON src.soldier_id = cs.soldier_id
CROSS JOIN LATERAL (VALUES
    ('detailed', cs.detailed_state, cs.detailed_next_due_at),
    ('profile', cs.profile_state, cs.profile_next_due_at),
    ('weapons', cs.weapons_state, cs.weapons_next_due_at),
    ('vehicles', cs.vehicles_state, cs.vehicles_next_due_at)
) AS x(resource, state, due_at)
CROSS JOIN LATERAL (SELECT x.resource,
                           (CASE x.state WHEN 'never_attempted' THEN 1
                                         WHEN 'success' THEN 2 ELSE 0 END)::smallint AS kind,
                           x.due_at) AS p;
