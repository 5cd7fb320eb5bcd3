-- A time as collectors may be handed it: within 1970-9999 (chrono, and any
-- client, decodes it; an owner-written infinity cannot crash a collector).
-- NULL stays NULL (said with a CASE: STRICT would stop the inlining).
-- A SQL-standard body: bound at creation and inlined by the planner.
--
-- owner: migrator
-- execute: PUBLIC
CREATE OR REPLACE FUNCTION @schema@.bf4ps_sane_time(t timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN t IS NOT NULL
            THEN LEAST(GREATEST(t, '1970-01-01 00:00:00+00'::timestamptz),
                       '9999-12-31 00:00:00+00'::timestamptz) END;
