-- The slot a freshness_rollup row is kept under: slots older than 8 days
-- (at `at`) are kept as their UTC day, so the rollup stays small.
--
-- owner: migrator
-- execute: PUBLIC
CREATE OR REPLACE FUNCTION @schema@.bf4ps_freshness_stored_slot(slot timestamptz, at timestamptz)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
    SELECT CASE WHEN isfinite(slot) AND slot < at - interval '8 days'
                THEN date_bin('1 day', slot, '2000-01-01 00:00:00+00')
                ELSE slot END
$$;
