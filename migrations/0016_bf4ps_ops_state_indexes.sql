-- 0016: the indexes BF4PS's scheduling policy and the operator read model
-- need on BF4PS's tables (issues 21, 22), built in their own transaction:
-- CREATE INDEX takes a SHARE lock (readers go on, writers such as BF4PS's
-- discovery wait for the build; a few hundred milliseconds each at 200,000
-- soldiers, measured by `bench adopt`), never ACCESS EXCLUSIVE.
--   * soldier_sources by last_seen_at: who played in the active window
--     (discovery's bf4sw sightings) or was just submitted (manual), the
--     feeder's starting point;
--   * collection_state pairs in temporary_failure by due time: retries the
--     feeder brings back after a job gave up;
--   * collection_state by last success per resource: the oldest success of
--     `status` and the gauges, one index probe each.
--   * pending background jobs by budget class, then the contract's claim
--     order: a claim under the budget's shares takes the first job of a
--     class in one index probe, whatever the other classes hold.
--
-- RELEASED once merged: never edit this file. Add a new migration instead.

CREATE INDEX ix_soldier_sources_seen ON soldier_sources (last_seen_at);

CREATE INDEX ix_collection_state_detailed_retry ON collection_state (detailed_next_due_at)
    WHERE detailed_state = 'temporary_failure';
CREATE INDEX ix_collection_state_detailed_success ON collection_state (detailed_last_success_at)
    WHERE detailed_last_success_at IS NOT NULL;

CREATE INDEX ix_collection_state_profile_retry ON collection_state (profile_next_due_at)
    WHERE profile_state = 'temporary_failure';
CREATE INDEX ix_collection_state_profile_success ON collection_state (profile_last_success_at)
    WHERE profile_last_success_at IS NOT NULL;

CREATE INDEX ix_collection_state_weapons_retry ON collection_state (weapons_next_due_at)
    WHERE weapons_state = 'temporary_failure';
CREATE INDEX ix_collection_state_weapons_success ON collection_state (weapons_last_success_at)
    WHERE weapons_last_success_at IS NOT NULL;

CREATE INDEX ix_collection_state_vehicles_retry ON collection_state (vehicles_next_due_at)
    WHERE vehicles_state = 'temporary_failure';
CREATE INDEX ix_collection_state_vehicles_success ON collection_state (vehicles_last_success_at)
    WHERE vehicles_last_success_at IS NOT NULL;

CREATE INDEX ix_collection_jobs_budget_claim_order
    ON collection_jobs (bf4ps_budget_class(priority_class, last_error_at),
                        (CASE priority_class
                             WHEN 'interactive' THEN 1
                             WHEN 'active' THEN 2
                             WHEN 'recent' THEN 3
                             WHEN 'bootstrap' THEN 4
                         END),
                        priority_value DESC, eligible_at, created_at, job_id)
    WHERE status = 'pending' AND lane = 'background';
