-- 0008: freshness rollups maintained incrementally, so the freshness gauges
-- and `status` never scan collection_state (issue 14).
--   * freshness_rollup: pairs per (resource, slot of last_success_at): the
--     5-minute slot, or for slots older than 8 days the UTC day; the slot
--     '-infinity' counts pairs never collected;
--   * freshness_deltas: +n/-n per (resource, slot), appended by triggers on
--     collection_state in the writer's own transaction (an unindexed heap
--     append: concurrent finalizations never wait for each other), folded
--     into freshness_rollup by bf4ps_freshness_compact() (serve, on its
--     gauge interval). Readers sum both in one snapshot, so the rollup is
--     exact whatever the compaction lag;
--   * the rollup is filled from collection_state here, after the triggers
--     exist: CREATE TRIGGER locks out writers until this migration commits,
--     so nothing slips between the fill and the first delta.
-- A pair's freshness band is read from the start of its slot: ages are
-- rounded up to the 5-minute slot (to the day past 8 days, beyond every
-- band boundary but the oldest), and counted exactly at that resolution.
--
-- RELEASED once merged: never edit this file. Add a new migration instead.

-- The slot of a last success: 5-minute slots from a fixed UTC origin;
-- NULL (never collected) is -infinity.
CREATE FUNCTION bf4ps_freshness_slot(t timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN t IS NULL THEN '-infinity'::timestamptz
                ELSE date_bin('5 minutes', t, '2000-01-01 00:00:00+00') END
$$;

-- A slot as the rollup keeps it at `at`: slots older than 8 days fold into
-- their UTC day (every band boundary is younger than 8 days, so a pair's
-- band never changes by this).
CREATE FUNCTION bf4ps_freshness_stored_slot(slot timestamptz, at timestamptz)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN slot > '-infinity' AND slot < at - interval '8 days'
                THEN date_bin('1 day', slot, '2000-01-01 00:00:00+00')
                ELSE slot END
$$;

CREATE TABLE freshness_rollup (
    resource text NOT NULL,
    slot timestamptz NOT NULL,
    pairs bigint NOT NULL,

    PRIMARY KEY (resource, slot),
    CONSTRAINT freshness_rollup_resource_check
        CHECK (resource IN ('detailed', 'profile', 'weapons', 'vehicles'))
);

CREATE TABLE freshness_deltas (
    resource text NOT NULL,
    slot timestamptz NOT NULL,
    pairs integer NOT NULL
);

-- Pairs inserted or deleted: one aggregated delta per statement (a bulk
-- import of a million pairs writes a handful of rows).
CREATE FUNCTION bf4ps_freshness_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO freshness_deltas (resource, slot, pairs)
    SELECT n.resource, bf4ps_freshness_slot(n.last_success_at), count(*)
    FROM bf4ps_new_state AS n
    GROUP BY 1, 2;
    RETURN NULL;
END;
$$;

CREATE FUNCTION bf4ps_freshness_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO freshness_deltas (resource, slot, pairs)
    SELECT o.resource, bf4ps_freshness_slot(o.last_success_at), -count(*)
    FROM bf4ps_old_state AS o
    GROUP BY 1, 2;
    RETURN NULL;
END;
$$;

-- A pair whose last success (or resource) changed moves between slots.
-- Row level with a WHEN condition: updates that keep last_success_at (a
-- failure, a reschedule) never call PL/pgSQL.
CREATE FUNCTION bf4ps_freshness_moved() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO freshness_deltas (resource, slot, pairs)
    VALUES (OLD.resource, bf4ps_freshness_slot(OLD.last_success_at), -1),
           (NEW.resource, bf4ps_freshness_slot(NEW.last_success_at), 1);
    RETURN NULL;
END;
$$;

CREATE TRIGGER trg_collection_state_freshness_insert
    AFTER INSERT ON collection_state
    REFERENCING NEW TABLE AS bf4ps_new_state
    FOR EACH STATEMENT EXECUTE FUNCTION bf4ps_freshness_inserted();

CREATE TRIGGER trg_collection_state_freshness_delete
    AFTER DELETE ON collection_state
    REFERENCING OLD TABLE AS bf4ps_old_state
    FOR EACH STATEMENT EXECUTE FUNCTION bf4ps_freshness_deleted();

CREATE TRIGGER trg_collection_state_freshness_update
    AFTER UPDATE ON collection_state
    FOR EACH ROW
    WHEN (bf4ps_freshness_slot(OLD.last_success_at) IS DISTINCT FROM
              bf4ps_freshness_slot(NEW.last_success_at)
          OR OLD.resource IS DISTINCT FROM NEW.resource)
    EXECUTE FUNCTION bf4ps_freshness_moved();

-- TRUNCATE bypasses row and statement triggers: clear the rollup with it.
CREATE FUNCTION bf4ps_freshness_truncated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM freshness_deltas;
    DELETE FROM freshness_rollup;
    RETURN NULL;
END;
$$;

CREATE TRIGGER trg_collection_state_freshness_truncate
    AFTER TRUNCATE ON collection_state
    FOR EACH STATEMENT EXECUTE FUNCTION bf4ps_freshness_truncated();

-- The fill for an existing database (the triggers above already hold
-- collection_state against writers until this migration commits).
INSERT INTO freshness_rollup (resource, slot, pairs)
SELECT resource, bf4ps_freshness_stored_slot(bf4ps_freshness_slot(last_success_at), now()),
       count(*)
FROM collection_state
GROUP BY 1, 2;

-- Folds the deltas into the rollup and the slots that aged past 8 days into
-- their day, in one transaction; one runner at a time (transaction-scoped
-- advisory lock 7090412320918499955, "bf4psfrs", src/locks.rs; a second
-- caller returns -1 at once). Returns the delta rows folded.
CREATE FUNCTION bf4ps_freshness_compact() RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    folded bigint;
BEGIN
    IF NOT pg_try_advisory_xact_lock(7090412320918499955) THEN
        RETURN -1;
    END IF;
    WITH taken AS (
        DELETE FROM freshness_deltas RETURNING resource, slot, pairs
    ), summed AS (
        SELECT resource, bf4ps_freshness_stored_slot(slot, now()) AS slot,
               sum(pairs) AS pairs, count(*) AS n
        FROM taken GROUP BY 1, 2
    ), applied AS (
        INSERT INTO freshness_rollup AS r (resource, slot, pairs)
        SELECT resource, slot, pairs FROM summed
        ON CONFLICT (resource, slot) DO UPDATE SET pairs = r.pairs + EXCLUDED.pairs
    )
    SELECT coalesce(sum(n), 0) INTO folded FROM summed;
    WITH aged AS (
        DELETE FROM freshness_rollup AS r
        WHERE r.slot <> bf4ps_freshness_stored_slot(r.slot, now())
        RETURNING r.resource, bf4ps_freshness_stored_slot(r.slot, now()) AS slot, r.pairs
    )
    INSERT INTO freshness_rollup AS r (resource, slot, pairs)
    SELECT resource, slot, sum(pairs) FROM aged GROUP BY 1, 2
    ON CONFLICT (resource, slot) DO UPDATE SET pairs = r.pairs + EXCLUDED.pairs;
    DELETE FROM freshness_rollup WHERE pairs = 0;
    RETURN folded;
END;
$$;

-- Who writes collection_state appends deltas (triggers run as the writer).
GRANT INSERT ON freshness_deltas TO bf4ps_collector, bf4ps_definer;
GRANT SELECT ON freshness_rollup, freshness_deltas TO bf4ps_reader;
