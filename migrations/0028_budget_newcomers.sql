-- 0028: a new host counts in the fleet budget's shares before its first
-- grant (issue 37, finding 3 at the start). A host counted in the others'
-- shares only once it had taken a slot of its own, so it had to win a race
-- at a slot's opening first, against a lone host that was entitled at every
-- slot: one host with 40 keys asking every 5 ms took 23 to 43 % of the
-- budget in 4 runs of 11 (CI: 46.6 %), its eight honest peers' first grants
-- coming 10 to 20 s late. Now a host with a live background collector that
-- took no share of its own in the last minute counts as one (a newcomer)
-- until it was passed over: a slot that no entitled host took within half a
-- spacing, taken a spacing or more after the newcomer came, passes over
-- every newcomer then, so a host that is there but never claims costs the
-- budget one such grace per collector start.
--
-- - egress_hosts.budget_passed_at: the host's last budgeted grant taken
--   while it was not entitled (a slot left open half a spacing).
--
-- RELEASED once merged: never edit this file. Add a new migration instead.

ALTER TABLE egress_hosts ADD COLUMN budget_passed_at timestamptz;
