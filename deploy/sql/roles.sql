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

-- serve's monitor bounds client sessions (docs/security.md#limits): a
-- collector's or website's transaction past BF4PS_CLIENT_TRANSACTION_LIMIT,
-- a reader's snapshot past BF4PS_READER_SNAPSHOT_LIMIT, a NOTIFY queue
-- holder. PostgreSQL 15 shows another role's transaction start, state and
-- waits only to members of pg_read_all_stats, and lets it end another
-- role's session only as a member of pg_signal_backend. Without them serve
-- logs at start, and /readyz says (protections_off), which bound is off.
GRANT pg_read_all_stats TO :"owner";
GRANT pg_signal_backend TO :"owner";

-- Login roles, one per host, each in its group with the limits a host needs
-- (connection limit, temp_file_limit, statement and idle timeouts), as a
-- superuser, once the database is migrated:
--
--   CREATE ROLE bf4ps_owner LOGIN;                      -- migrate + serve
--   CREATE DATABASE bf4ps OWNER bf4ps_owner;
--   bf4ps-ops role add collector bf4ps_collector_host1  -- one per host: its
--                          -- collectors' names and egress keys are its own
--   bf4ps-ops role add website bf4ps_web                -- the website
--   bf4ps-ops role add reader bf4ps_grafana             -- dashboards, status
--   bf4ps-ops role list                                 -- each with its limits
--
-- (DATABASE_URL a superuser's URL of the bf4ps database). Set each password
-- with \password NAME, or use certificate authentication, and in
-- pg_hba.conf accept them over TLS only, e.g.
--   hostssl bf4ps all 10.0.0.0/8 scram-sha-256
