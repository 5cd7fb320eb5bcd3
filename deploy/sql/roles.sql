-- bf4ps-ops database roles, for an administrator who will not give the
-- migrating user CREATEROLE. Run once per cluster as a superuser (or a role
-- with CREATEROLE), BEFORE the first `bf4ps-ops migrate`:
--
--   psql -v owner=bf4ps_owner -f deploy/sql/roles.sql postgres
--
-- `owner` is the login role that runs `migrate` and `serve` and owns the
-- bf4ps database. Migrations 0006 and 0014 then find the roles and only grant
-- privileges on their own objects. Safe to run again.

\set ON_ERROR_STOP on

-- NOLOGIN group roles (names are part of the interface).
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['bf4ps_definer', 'bf4ps_collector', 'bf4ps_website', 'bf4ps_reader']
    LOOP
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = r) THEN
            EXECUTE format('CREATE ROLE %I NOLOGIN', r);
        END IF;
    END LOOP;
END
$$;

-- The owner hands the SECURITY DEFINER functions to bf4ps_definer, which
-- requires membership of it.
GRANT bf4ps_definer TO :"owner";

-- serve's monitor ends a collector's or website's session whose transaction
-- stays open past BF4PS_CLIENT_TRANSACTION_LIMIT (it would hold the fleet's
-- row locks and the projection horizon): signalling another role's backend
-- needs pg_signal_backend.
GRANT pg_signal_backend TO :"owner";

-- Login roles, one per unit (examples: adapt the names and set passwords
-- with \password NAME, or use certificate authentication):
--
--   CREATE ROLE bf4ps_owner LOGIN;                          -- migrate + serve
--   CREATE DATABASE bf4ps OWNER bf4ps_owner;
--   CREATE ROLE bf4ps_collector_host1 LOGIN IN ROLE bf4ps_collector; -- one per host:
--                                 -- its collectors' names and egress keys are its own
--   CREATE ROLE bf4ps_web LOGIN IN ROLE bf4ps_website;      -- the website
--   CREATE ROLE bf4ps_grafana LOGIN IN ROLE bf4ps_reader;   -- dashboards, status
--
-- and in pg_hba.conf accept them over TLS only, e.g.
--   hostssl bf4ps all 10.0.0.0/8 scram-sha-256
