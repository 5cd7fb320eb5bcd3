-- 0009: a cheaper freshness trigger on the job cycle's hot path (issue 14).
--
-- 0008's update trigger decided in its WHEN clause, by calling
-- bf4ps_freshness_slot() on OLD and NEW, whether a pair moved between
-- slots. PostgreSQL prepares a trigger's WHEN expression again for every
-- statement that updates the table, and preparing it inlines those SQL
-- functions: their bodies are parsed and analysed anew each time. On the
-- job cycle (one collection_state update per finalization) that was about
-- two thirds of the trigger's cost, 70-90 µs of database CPU per job
-- (docs/benchmarks.md). The WHEN clause now compares the raw columns
-- (cheap, no function), and the function compares the slots itself: it is
-- called for every update that changes last_success_at or resource, and
-- writes a delta exactly when 0008's did. Updates that keep both (failures,
-- reschedules) still never call PL/pgSQL; the rollup stays exact for every
-- writer.
--
-- RELEASED once merged: never edit this file. Add a new migration instead.

CREATE OR REPLACE FUNCTION bf4ps_freshness_moved() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF bf4ps_freshness_slot(OLD.last_success_at) IS DISTINCT FROM
           bf4ps_freshness_slot(NEW.last_success_at)
       OR OLD.resource IS DISTINCT FROM NEW.resource THEN
        INSERT INTO freshness_deltas (resource, slot, pairs)
        VALUES (OLD.resource, bf4ps_freshness_slot(OLD.last_success_at), -1),
               (NEW.resource, bf4ps_freshness_slot(NEW.last_success_at), 1);
    END IF;
    RETURN NULL;
END;
$$;

-- Dropped and created in one transaction (the migration's): no update of
-- collection_state can run in between (DROP TRIGGER locks the table).
DROP TRIGGER trg_collection_state_freshness_update ON collection_state;

CREATE TRIGGER trg_collection_state_freshness_update
    AFTER UPDATE ON collection_state
    FOR EACH ROW
    WHEN (OLD.last_success_at IS DISTINCT FROM NEW.last_success_at
          OR OLD.resource IS DISTINCT FROM NEW.resource)
    EXECUTE FUNCTION bf4ps_freshness_moved();
