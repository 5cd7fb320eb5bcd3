-- 0024: what serve's monitor needs to see and end client sessions (issue 37).
--   PostgreSQL 15 shows xact_start, state, wait_event_type, query_start and
--   backend_xmin of another role's session only to members of that role or
--   of pg_read_all_stats, and lets a role end another role's session only as
--   a member of pg_signal_backend (else pg_terminate_backend raises). A
--   migrating user with CREATEROLE (not a superuser: it has both already)
--   grants itself the two roles here; one without runs deploy/sql/roles.sql,
--   which grants them. When neither happened, serve says at start, in its
--   log and in /readyz, which protection is off and why.
--
-- RELEASED once merged: never edit this file. Add a new migration instead.

DO $grant$
DECLARE
    r text;
BEGIN
    IF (SELECT rolcreaterole AND NOT rolsuper FROM pg_catalog.pg_roles
        WHERE rolname = current_user) THEN
        FOREACH r IN ARRAY ARRAY['pg_read_all_stats', 'pg_signal_backend']
        LOOP
            IF NOT pg_catalog.pg_has_role(current_user, r, 'MEMBER') THEN
                BEGIN
                    EXECUTE format('GRANT %I TO %I', r, current_user);
                EXCEPTION
                    WHEN insufficient_privilege THEN
                        RAISE NOTICE '% may not grant itself %: run deploy/sql/roles.sql', current_user, r;
                END;
            END IF;
        END LOOP;
    END IF;
END
$grant$;
