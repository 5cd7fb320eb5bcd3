-- 0027: a new host counts on the interactive lane before its first claim
-- (issue 37, finding 7). A host with a live interactive collector that has
-- claimed nothing in the last minute counts as a host with no claims, so a
-- host ahead of it is not entitled and takes only jobs that waited a
-- second; such a grant passes over the new hosts present for a second, so a
-- host that is there but never claims delays one job by a second, not all.
--
-- - egress_hosts.interactive_passed_at: the host's last interactive grant
--   taken while it was not entitled (a job that waited a second): every new
--   host present a second before it was passed over then.
--
-- RELEASED once merged: never edit this file. Add a new migration instead.

ALTER TABLE egress_hosts ADD COLUMN interactive_passed_at timestamptz;
