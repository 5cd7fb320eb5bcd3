-- The collector protocol of this schema (0019: 3, the claim takes the
-- egress grant; bf4ps_collector_egress_pass is gone).
--
-- owner: migrator
-- execute: PUBLIC
CREATE OR REPLACE FUNCTION @schema@.bf4ps_collector_protocol() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, @schema@, pg_temp
AS $$ SELECT 3 $$;
