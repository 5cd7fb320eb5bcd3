-- The fleet budget's class of a background job: 'retry' (an earlier attempt
-- failed, or the soldier is recent), 'bootstrap' (never collected) or
-- 'active'. The claim's order and ix_collection_jobs_budget_claim_order
-- use it: its results must never change without a migration that rebuilds
-- that index. A SQL-standard body: bound at creation and inlined.
--
-- owner: migrator
-- execute: PUBLIC
CREATE OR REPLACE FUNCTION @schema@.bf4ps_budget_class(priority_class text, last_error_at timestamptz)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN last_error_at IS NOT NULL OR priority_class = 'recent' THEN 'retry'
            WHEN priority_class = 'bootstrap' THEN 'bootstrap'
            ELSE 'active' END;
