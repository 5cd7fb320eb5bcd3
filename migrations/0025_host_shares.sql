-- 0025: shares per host (issue 37). The fleet budget's fair share and the
-- interactive lane's share belong to a host (the login role that registered
-- the collectors: collector_secrets.registered_by), not to an egress key: a
-- host that registers 50 keys gets one host's share. Wanting costs the
-- wanter: a claim that may not go writes nothing, and only hosts that spend
-- count in the others' shares.
--
-- - egress_hosts: one row per host (created at its first grant): its own
--   next budget slot and last budgeted grant, and its interactive claims
--   (a counter that catches up with the other active hosts') and the last.
-- - egress_gates.host / budget_spent_at: the host a key's last grant was
--   for, and the key's last budgeted grant that was its own share (the keys
--   of one host share the host's share).
-- - egress_gates.budget_wanted_at is no longer written (a denied claim
--   marked it; that cost others their share and wrote a row each time).
-- - bf4ps_egress_gate and bf4ps_egress_spend take the host (and the spend
--   whether the grant was the caller's own share): the old signatures go
--   (schema/egress/ defines the new ones).
--
-- RELEASED once merged: never edit this file. Add a new migration instead.

CREATE TABLE egress_hosts (
    host text PRIMARY KEY,
    -- The host's own next budget slot (its fair share); NULL: never granted.
    budget_next_at timestamptz,
    -- Its last budgeted grant taken as its own share (it wants the budget).
    budget_spent_at timestamptz,
    -- Its interactive claims taken as its own share, caught up with the
    -- least of the other active hosts' at each claim.
    interactive_claims bigint NOT NULL DEFAULT 0,
    -- Its last such interactive claim.
    interactive_at timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT egress_hosts_host_nonempty CHECK (host <> ''),
    CONSTRAINT egress_hosts_interactive_claims_check CHECK (interactive_claims >= 0)
);

ALTER TABLE egress_gates
    -- The host of the key's last grant.
    ADD COLUMN host text,
    -- The key's last budgeted grant taken as its own share.
    ADD COLUMN budget_spent_at timestamptz;

GRANT SELECT, INSERT, UPDATE ON egress_hosts TO bf4ps_definer;
GRANT SELECT ON egress_hosts TO bf4ps_reader;

DROP FUNCTION IF EXISTS bf4ps_egress_gate(text, interval, timestamptz);
DROP FUNCTION IF EXISTS bf4ps_egress_spend(text, interval, interval, timestamptz);
