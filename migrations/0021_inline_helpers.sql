-- 0021: the hot SQL helpers inlined (issue 29). bf4ps_freshness_slot (the
-- freshness triggers call it eight times per changed state row),
-- bf4ps_budget_class (the claim, the feeder's depth count),
-- bf4ps_sane_time (the claim, the finalization's events), and
-- bf4ps_text_ok and bf4ps_name_ok (the checks of a weapons or vehicles
-- list: three calls per entry) were SQL functions with a SET search_path
-- clause: PostgreSQL never inlines such a function, so every call ran its
-- own little executor, planned its body and set and restored the GUC. In
-- `bench schedule` they took 0.3 ms of a finalization and 0.15 ms of a
-- claim.
--
-- Each is restated with a SQL-standard body (RETURN): it is parsed when the
-- function is created, every name and operator bound then, so the caller's
-- search_path cannot reach it, which is what the SET clause was for; and
-- without the SET clause the planner inlines it into the calling statement.
-- Same arguments, same results for every input (bf4ps_sane_time keeps
-- NULL → NULL by saying so instead of STRICT, which would stop the inlining
-- of a body with least/greatest), same owner and grants.
-- ix_collection_jobs_budget_claim_order (0016) indexes bf4ps_budget_class:
-- its results do not change, and the planner inlines the index expression
-- and the claim's the same way, so the claim still matches it.
--
-- RELEASED once merged: never edit this file. Add a new migration instead.

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
CREATE OR REPLACE FUNCTION @schema@.bf4ps_freshness_slot(t timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN t IS NULL THEN '-infinity'::timestamptz
            WHEN NOT pg_catalog.isfinite(t) THEN t
            ELSE pg_catalog.date_bin('5 minutes'::interval, t,
                                     '2000-01-01 00:00:00+00'::timestamptz) END;
$body$);

SELECT pg_temp.bf4ps_define($body$
CREATE OR REPLACE FUNCTION @schema@.bf4ps_budget_class(priority_class text, last_error_at timestamptz)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN last_error_at IS NOT NULL OR priority_class = 'recent' THEN 'retry'
            WHEN priority_class = 'bootstrap' THEN 'bootstrap'
            ELSE 'active' END;
$body$);

SELECT pg_temp.bf4ps_define($body$
CREATE OR REPLACE FUNCTION @schema@.bf4ps_sane_time(t timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN t IS NOT NULL
            THEN LEAST(GREATEST(t, '1970-01-01 00:00:00+00'::timestamptz),
                       '9999-12-31 00:00:00+00'::timestamptz) END;
$body$);

SELECT pg_temp.bf4ps_define($body$
CREATE OR REPLACE FUNCTION @schema@.bf4ps_text_ok(t text, max_length integer) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN t IS NULL
    OR (length(t) <= max_length
        AND t !~ '[\x01-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]');
$body$);

SELECT pg_temp.bf4ps_define($body$
CREATE OR REPLACE FUNCTION @schema@.bf4ps_name_ok(t text, max_length integer) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN t IS NOT NULL
   AND length(btrim(t)) BETWEEN 1 AND max_length
   AND @schema@.bf4ps_text_ok(t, max_length);
$body$);
