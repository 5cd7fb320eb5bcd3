-- 0015: the cutover (issue 21). Every collector registered before this
-- release is disabled: BF4PS's own collectors (their runtime exits once
-- `enabled` is false; the leases they hold expire and `serve`'s monitor
-- recovers them with lease_expired + reclaimed events), and a 0.1
-- database's incarnations (which cannot work on this schema: their SQL
-- wrote tables collectors may no longer write). Nothing else of theirs
-- changes; their names are taken over as the registry allows (lost, or
-- drained and idle), and their history stays on their UUIDs.
--
-- From here on a schema change that changes what collectors must do bumps
-- bf4ps_collector_protocol(), and collectors of an older release stop
-- claiming by themselves (SQLSTATE BF001): no later release needs a cutover.
--
-- RELEASED once merged: never edit this file. Add a new migration instead.

UPDATE collectors
SET enabled = false, updated_at = now()
WHERE enabled AND retired_at IS NULL;
