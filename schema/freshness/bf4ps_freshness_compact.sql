-- Folds the deltas into the rollup and the slots that aged past 8 days into
-- their day, in one transaction; one runner at a time (a row lock on
-- bf4ps_locks 'freshness_compaction', which no other role can take; a second
-- caller returns -1 at once). Returns the delta rows folded.
--
-- owner: migrator
-- execute: PUBLIC
CREATE OR REPLACE FUNCTION @schema@.bf4ps_freshness_compact() RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
DECLARE
    folded bigint;
BEGIN
    PERFORM 1 FROM @schema@.bf4ps_locks
    WHERE lock_name = 'freshness_compaction' FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN -1;
    END IF;
    WITH taken AS (
        DELETE FROM @schema@.freshness_deltas RETURNING resource, slot, pairs
    ), summed AS (
        SELECT resource, @schema@.bf4ps_freshness_stored_slot(slot, now()) AS slot,
               sum(pairs) AS pairs, count(*) AS n
        FROM taken GROUP BY 1, 2
    ), applied AS (
        INSERT INTO @schema@.freshness_rollup AS r (resource, slot, pairs)
        SELECT resource, slot, pairs FROM summed
        ON CONFLICT (resource, slot) DO UPDATE SET pairs = r.pairs + EXCLUDED.pairs
    )
    SELECT coalesce(sum(n), 0) INTO folded FROM summed;
    WITH aged AS (
        DELETE FROM @schema@.freshness_rollup AS r
        WHERE r.slot <> @schema@.bf4ps_freshness_stored_slot(r.slot, now())
        RETURNING r.resource, @schema@.bf4ps_freshness_stored_slot(r.slot, now()) AS slot, r.pairs
    )
    INSERT INTO @schema@.freshness_rollup AS r (resource, slot, pairs)
    SELECT resource, slot, sum(pairs) FROM aged GROUP BY 1, 2
    ON CONFLICT (resource, slot) DO UPDATE SET pairs = r.pairs + EXCLUDED.pairs;
    DELETE FROM @schema@.freshness_rollup WHERE pairs = 0;
    RETURN folded;
END;
$$;
