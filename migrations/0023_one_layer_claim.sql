-- 0023: the claim in one layer (issue 36). bf4ps_take_job (the grant) and
-- bf4ps_claim_job (the claim) become one bf4ps_claim_job, which returns
-- what bf4ps_take_job returned, with the grant in two functions of its own
-- (bf4ps_egress_gate, bf4ps_egress_spend). A function's result type cannot
-- be replaced, so both go here; the schema source (schema/queue/
-- bf4ps_claim_job.sql, bf4ps_collector_claim.sql) defines the new ones in
-- the same transaction.
--
-- RELEASED once merged: never edit this file. Add a new migration instead.

DROP FUNCTION bf4ps_take_job(uuid, boolean, timestamptz);
DROP FUNCTION bf4ps_claim_job(uuid, boolean, timestamptz);
