-- The freshness slot of a last success: its 5-minute slot from a fixed UTC
-- origin, -infinity for never collected, an infinite time as itself.
-- A SQL-standard body: bound at creation and inlined by the planner (the
-- freshness triggers call it eight times per changed state row).
--
-- owner: migrator
-- execute: PUBLIC
CREATE OR REPLACE FUNCTION @schema@.bf4ps_freshness_slot(t timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN t IS NULL THEN '-infinity'::timestamptz
            WHEN NOT pg_catalog.isfinite(t) THEN t
            ELSE pg_catalog.date_bin('5 minutes'::interval, t,
                                     '2000-01-01 00:00:00+00'::timestamptz) END;
