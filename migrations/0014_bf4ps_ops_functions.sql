-- 0014: bf4ps-ops's functions and triggers on BF4PS's tables, and what each
-- role may do (issues 20 and 21).
--
-- The collector boundary: a collector writes nothing directly. Its whole
-- interface is the functions below, SECURITY DEFINER, owned by the NOLOGIN
-- bf4ps_definer, each checking the incarnation's secret, and the job steps
-- also the lease (job_id, collector_uuid, lease_token, unexpired):
--   bf4ps_collector_register / _heartbeat / _stopped   the incarnation
--   bf4ps_collector_egress_pass                        the gate
--   bf4ps_collector_claim (and start) / _start / _renew / _next_eligible
--   bf4ps_collector_succeed / _fail                    finalization
-- Only these (and triggers) write events and their identity snapshots
-- (taken from the registry, never from the caller), current_job_id, pauses,
-- the budget, freshness deltas and gameplay data (only for the job the
-- caller's lease holds). Every value is checked where it enters: times come
-- from the database clock, durations, counts and HTTP statuses are range
-- checked, names and hostnames are 1-200 characters without control
-- characters. The policy (lease, rates, budget, retries, cadence) is the
-- published scheduling_settings row, never the caller's.
--
-- Every function of ours pins search_path (pg_catalog first, pg_temp last),
-- so a session's temporary table can never stand in for one of ours.
--
-- RELEASED once merged: never edit this file. Add a new migration instead.

-- ---------------------------------------------------------------------------
-- Roles (as 0006, for a database that never ran it: BF4PS's). An existing
-- role is kept as it is.
-- ---------------------------------------------------------------------------

DO $roles$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['bf4ps_definer', 'bf4ps_collector', 'bf4ps_website', 'bf4ps_reader']
    LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION
                WHEN duplicate_object OR unique_violation THEN
                    NULL; -- created concurrently (another database of this cluster)
                WHEN insufficient_privilege THEN
                    RAISE EXCEPTION 'role % does not exist and % may not create roles', r, current_user
                        USING HINT = 'run deploy/sql/roles.sql once as a superuser (or a role with '
                                     'CREATEROLE), or give the migrating user CREATEROLE',
                              ERRCODE = 'insufficient_privilege';
            END;
        END IF;
    END LOOP;
    IF (SELECT rolcanlogin FROM pg_catalog.pg_roles WHERE rolname = 'bf4ps_definer') THEN
        RAISE EXCEPTION 'role bf4ps_definer can log in; it owns SECURITY DEFINER functions and must be NOLOGIN'
            USING HINT = 'ALTER ROLE bf4ps_definer NOLOGIN',
                  ERRCODE = 'invalid_role_specification';
    END IF;
    IF NOT pg_catalog.pg_has_role(current_user, 'bf4ps_definer', 'MEMBER') THEN
        BEGIN
            EXECUTE format('GRANT bf4ps_definer TO %I', current_user);
        EXCEPTION
            WHEN insufficient_privilege THEN
                RAISE EXCEPTION '% is not a member of bf4ps_definer and may not grant it', current_user
                    USING HINT = 'run deploy/sql/roles.sql once as a superuser with OWNER set to this user',
                          ERRCODE = 'insufficient_privilege';
        END;
    END IF;
END
$roles$;

-- The function bodies name our schema through @schema@ (replaced below with
-- the schema collection_jobs lives in, normally public).
CREATE FUNCTION pg_temp.bf4ps_define(body text) RETURNS void
LANGUAGE plpgsql
-- The migration's own search_path: it finds collection_jobs' schema.
SET search_path FROM CURRENT
AS $$
BEGIN
    EXECUTE replace(body, '@schema@',
                    (SELECT quote_ident(n.nspname)
                     FROM pg_catalog.pg_class c
                     JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                     WHERE c.oid = 'collection_jobs'::regclass));
END;
$$;

-- ---------------------------------------------------------------------------
-- Pure helpers.
-- ---------------------------------------------------------------------------

SELECT pg_temp.bf4ps_define($body$
-- The collector protocol of this schema. A collector that speaks an older
-- one is refused at claim (SQLSTATE BF001) and drains; bumped by any
-- migration that changes what collectors must do.
CREATE FUNCTION @schema@.bf4ps_collector_protocol() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, @schema@, pg_temp
AS $$ SELECT 2 $$;
$body$);

SELECT pg_temp.bf4ps_define($body$
-- x rounded to `scale` decimals, a tie going to the even neighbour (BF4PS
-- quantizes quit_percentage and longest_headshot so; numeric's round()
-- takes ties away from zero). Exact: numeric arithmetic throughout.
CREATE FUNCTION @schema@.bf4ps_round_half_even(x numeric, scale integer) RETURNS numeric
LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
    SELECT round(CASE
        WHEN abs(q.y - trunc(q.y)) = 0.5
            THEN (trunc(q.y) + CASE WHEN mod(trunc(q.y), 2) = 0 THEN 0 ELSE sign(x) END) / q.f
        ELSE round(x, scale)
    END, scale)
    FROM (SELECT x * power(10::numeric, scale) AS y, power(10::numeric, scale) AS f) AS q
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
-- Whether `t` is an acceptable operator-facing name: 1-`max_length`
-- characters after trimming, no control characters (C0, DEL, C1) and no
-- bidirectional overrides, which could forge what a terminal shows.
CREATE FUNCTION @schema@.bf4ps_name_ok(t text, max_length integer) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
    SELECT t IS NOT NULL
       AND length(btrim(t)) BETWEEN 1 AND max_length
       AND t !~ '[\x01-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]'
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
-- A time as collectors may be handed it: within 1970-9999 (chrono, and any
-- client, decodes it; an owner-written infinity cannot crash a collector).
CREATE FUNCTION @schema@.bf4ps_sane_time(t timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
    SELECT least(greatest(t, timestamptz '1970-01-01 00:00:00+00'),
                 timestamptz '9999-12-31 00:00:00+00')
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
-- The projection horizon (0003): the snapshot's oldest in-progress
-- transaction of this database, or its xmax when none is left (see 0003 for
-- why transactions of other databases are ignored). Transactions of roles
-- that cannot write an event are ignored too: a reader's open transaction
-- (one with an xid: `SELECT pg_current_xact_id()`) holds nothing back. A
-- role can write events when it may INSERT into collection_events or is a
-- collector or website (their functions write them).
CREATE FUNCTION @schema@.bf4ps_projection_horizon() RETURNS xid8
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    RETURN (
        SELECT coalesce(
            (SELECT min(x.xid)
             FROM pg_snapshot_xip(s.snap) AS x(xid)
             WHERE xid(x.xid) NOT IN (
                     SELECT a.backend_xid FROM pg_stat_get_activity(NULL) a
                     WHERE a.backend_xid IS NOT NULL
                       AND a.datid IS NOT NULL AND a.datid <> 0
                       AND (a.datid <> (SELECT d.oid FROM pg_database d
                                        WHERE d.datname = current_database())
                            OR (a.usesysid IS NOT NULL
                                AND NOT has_table_privilege(a.usesysid,
                                        '@schema@.collection_events', 'INSERT')
                                AND NOT pg_has_role(a.usesysid, 'bf4ps_collector', 'MEMBER')
                                AND NOT pg_has_role(a.usesysid, 'bf4ps_website', 'MEMBER'))))
               AND xid(x.xid) NOT IN (
                     SELECT p.transaction FROM pg_prepared_xacts p
                     WHERE p.database <> current_database())),
            pg_snapshot_xmax(s.snap))
        FROM (SELECT pg_current_snapshot() AS snap) s);
END;
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
-- The interactive ETA (0004): the larger of collector parallelism and the
-- egress spacing, always finite and >= 0, or NULL when no collector can
-- take the job.
CREATE FUNCTION @schema@.bf4ps_eta_seconds(
    queue_position bigint,
    healthy_collectors integer,
    mean_duration_s double precision,
    egress_rate double precision
) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
    SELECT CASE
        WHEN queue_position IS NULL OR healthy_collectors IS NULL OR healthy_collectors <= 0
            THEN NULL
        ELSE greatest(
            ceil(greatest(queue_position, 1)::double precision / healthy_collectors) * p.duration,
            CASE
                WHEN egress_rate > 0 AND egress_rate < 'Infinity'::double precision
                    THEN (greatest(queue_position, 1) - 1)::double precision
                         / greatest(egress_rate, 1e-6) + p.duration
                ELSE 0
            END)
    END
    FROM (SELECT CASE
                     WHEN mean_duration_s >= 0 AND mean_duration_s < 'Infinity'::double precision
                         THEN least(mean_duration_s, 3600)
                     ELSE 2.0
                 END AS duration) AS p
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
-- Freshness slots (0008): the 5-minute slot of a last success from a fixed
-- UTC origin, -infinity for never collected; slots older than 8 days are
-- kept as their UTC day.
CREATE FUNCTION @schema@.bf4ps_freshness_slot(t timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
    SELECT CASE WHEN t IS NULL THEN '-infinity'::timestamptz
                WHEN NOT isfinite(t) THEN t
                ELSE date_bin('5 minutes', t, '2000-01-01 00:00:00+00') END
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
CREATE FUNCTION @schema@.bf4ps_freshness_stored_slot(slot timestamptz, at timestamptz)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
    SELECT CASE WHEN isfinite(slot) AND slot < at - interval '8 days'
                THEN date_bin('1 day', slot, '2000-01-01 00:00:00+00')
                ELSE slot END
$$;
$body$);

-- ---------------------------------------------------------------------------
-- NOTIFY triggers (0002, 0005): a job became claimable; events appended.
-- ---------------------------------------------------------------------------

SELECT pg_temp.bf4ps_define($body$
-- Inserted jobs: one notification per lane per statement (a feeder batch
-- or BF4PS discovery's inserts call pg_notify once, not once per row).
CREATE FUNCTION @schema@.bf4ps_notify_jobs_claimable() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
DECLARE
    claimable_lane text;
BEGIN
    FOR claimable_lane IN
        SELECT DISTINCT n.lane FROM bf4ps_new_jobs n
        WHERE n.status = 'pending' AND n.eligible_at <= now()
    LOOP
        PERFORM pg_notify('bf4ps_jobs_' || claimable_lane, '');
    END LOOP;
    RETURN NULL;
END;
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
CREATE FUNCTION @schema@.bf4ps_notify_job_claimable() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    PERFORM pg_notify('bf4ps_jobs_' || NEW.lane, '');
    RETURN NULL;
END;
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
CREATE FUNCTION @schema@.bf4ps_notify_event() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    PERFORM pg_notify('bf4ps_events', '');
    RETURN NULL;
END;
$$;
$body$);

-- ---------------------------------------------------------------------------
-- Freshness (0008-0010) on BF4PS's collection_state: one row per soldier,
-- four pairs. Triggers append +n/-n per (resource, slot) to freshness_deltas
-- in the writer's own transaction, whoever the writer is (bf4ps-ops, or
-- BF4PS's discovery inserting default rows): SECURITY DEFINER, so no writer
-- needs a privilege on our tables, and pinned, so no writer's temporary
-- table receives the deltas.
-- ---------------------------------------------------------------------------

SELECT pg_temp.bf4ps_define($body$
CREATE FUNCTION @schema@.bf4ps_freshness_inserted() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    INSERT INTO @schema@.freshness_deltas (resource, slot, pairs)
    SELECT p.resource, p.slot, count(*)
    FROM bf4ps_new_state AS n
    CROSS JOIN LATERAL (VALUES
        ('detailed', @schema@.bf4ps_freshness_slot(n.detailed_last_success_at)),
        ('profile', @schema@.bf4ps_freshness_slot(n.profile_last_success_at)),
        ('weapons', @schema@.bf4ps_freshness_slot(n.weapons_last_success_at)),
        ('vehicles', @schema@.bf4ps_freshness_slot(n.vehicles_last_success_at))
    ) AS p(resource, slot)
    GROUP BY 1, 2;
    RETURN NULL;
END;
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
CREATE FUNCTION @schema@.bf4ps_freshness_deleted() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    INSERT INTO @schema@.freshness_deltas (resource, slot, pairs)
    SELECT p.resource, p.slot, -count(*)
    FROM bf4ps_old_state AS o
    CROSS JOIN LATERAL (VALUES
        ('detailed', @schema@.bf4ps_freshness_slot(o.detailed_last_success_at)),
        ('profile', @schema@.bf4ps_freshness_slot(o.profile_last_success_at)),
        ('weapons', @schema@.bf4ps_freshness_slot(o.weapons_last_success_at)),
        ('vehicles', @schema@.bf4ps_freshness_slot(o.vehicles_last_success_at))
    ) AS p(resource, slot)
    GROUP BY 1, 2;
    RETURN NULL;
END;
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
-- A pair whose last success moved to another slot: -1 from the old slot,
-- +1 to the new one. Called only for updates that change a last success
-- (the trigger's WHEN compares the raw columns; 0009).
CREATE FUNCTION @schema@.bf4ps_freshness_moved() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    INSERT INTO @schema@.freshness_deltas (resource, slot, pairs)
    SELECT m.resource, s.slot, s.pairs
    FROM (VALUES
        ('detailed', OLD.detailed_last_success_at, NEW.detailed_last_success_at),
        ('profile', OLD.profile_last_success_at, NEW.profile_last_success_at),
        ('weapons', OLD.weapons_last_success_at, NEW.weapons_last_success_at),
        ('vehicles', OLD.vehicles_last_success_at, NEW.vehicles_last_success_at)
    ) AS m(resource, old_at, new_at)
    CROSS JOIN LATERAL (VALUES
        (@schema@.bf4ps_freshness_slot(m.old_at), -1),
        (@schema@.bf4ps_freshness_slot(m.new_at), 1)
    ) AS s(slot, pairs)
    WHERE @schema@.bf4ps_freshness_slot(m.old_at)
          IS DISTINCT FROM @schema@.bf4ps_freshness_slot(m.new_at);
    RETURN NULL;
END;
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
-- TRUNCATE bypasses row and statement triggers: clear the rollup with it.
CREATE FUNCTION @schema@.bf4ps_freshness_truncated() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    DELETE FROM @schema@.freshness_deltas;
    DELETE FROM @schema@.freshness_rollup;
    DELETE FROM @schema@.freshness_bands;
    RETURN NULL;
END;
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
-- Folds the deltas into the rollup and the slots that aged past 8 days into
-- their day, in one transaction; one runner at a time (a row lock on
-- bf4ps_locks 'freshness_compaction', which no other role can take; a second
-- caller returns -1 at once). Returns the delta rows folded.
CREATE FUNCTION @schema@.bf4ps_freshness_compact() RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
DECLARE
    folded bigint;
BEGIN
    PERFORM 1 FROM @schema@.bf4ps_locks
    WHERE lock_name = 'freshness_compaction' FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN -1;
    END IF;
    WITH taken AS (
        DELETE FROM @schema@.freshness_deltas RETURNING resource, slot, pairs
    ), summed AS (
        SELECT resource, @schema@.bf4ps_freshness_stored_slot(slot, now()) AS slot,
               sum(pairs) AS pairs, count(*) AS n
        FROM taken GROUP BY 1, 2
    ), applied AS (
        INSERT INTO @schema@.freshness_rollup AS r (resource, slot, pairs)
        SELECT resource, slot, pairs FROM summed
        ON CONFLICT (resource, slot) DO UPDATE SET pairs = r.pairs + EXCLUDED.pairs
    )
    SELECT coalesce(sum(n), 0) INTO folded FROM summed;
    WITH aged AS (
        DELETE FROM @schema@.freshness_rollup AS r
        WHERE r.slot <> @schema@.bf4ps_freshness_stored_slot(r.slot, now())
        RETURNING r.resource, @schema@.bf4ps_freshness_stored_slot(r.slot, now()) AS slot, r.pairs
    )
    INSERT INTO @schema@.freshness_rollup AS r (resource, slot, pairs)
    SELECT resource, slot, sum(pairs) FROM aged GROUP BY 1, 2
    ON CONFLICT (resource, slot) DO UPDATE SET pairs = r.pairs + EXCLUDED.pairs;
    DELETE FROM @schema@.freshness_rollup WHERE pairs = 0;
    RETURN folded;
END;
$$;
$body$);

-- ---------------------------------------------------------------------------
-- The collector interface.
-- ---------------------------------------------------------------------------

SELECT pg_temp.bf4ps_define($body$
-- Raises 42501 unless `p_secret` is the secret of incarnation `p_uuid`.
-- (Called by the interface functions; granted to nobody.)
CREATE FUNCTION @schema@.bf4ps_collector_check_secret(p_uuid uuid, p_secret uuid)
RETURNS void
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    IF p_uuid IS NULL OR p_secret IS NULL OR NOT EXISTS (
        SELECT 1 FROM @schema@.collector_secrets AS cs
        WHERE cs.collector_uuid = p_uuid
          AND cs.secret_sha256 = sha256(convert_to(p_secret::text, 'UTF8')))
    THEN
        RAISE EXCEPTION 'collector % did not prove it is this incarnation (wrong secret)', p_uuid
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END;
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
-- Registers a collector incarnation. A non-retired collector that holds the
-- name (case-insensitively) is retired and the name taken only when it is
-- lost: marked lost, or silent for longer than the published
-- heartbeat_lost_after (never a caller's interval), or drained and idle (a
-- clean stop); otherwise nothing is written and the holder is described
-- (collector_uuid NULL). Bounds, per login role (session_user): at most
-- scheduling_settings.registrations_per_hour registrations in any hour and
-- collectors_per_role non-retired incarnations (SQLSTATE 53400 beyond).
-- Names and hostnames: 1-200 characters, egress keys 1-200, the software
-- version up to 200, none with control characters (SQLSTATE 22023). The
-- secret is returned once; only its SHA-256 is stored.
CREATE FUNCTION @schema@.bf4ps_collector_register(
    p_name text,
    p_hostname text,
    p_lane text,
    p_egress_key text,
    p_software_version text
) RETURNS TABLE (
    collector_uuid uuid,
    secret uuid,
    holder_hostname text,
    holder_age_s double precision
)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_name text := btrim(p_name);
    v_host text := btrim(p_hostname);
    v_key text := btrim(p_egress_key);
    v_role text := session_user;
    s record;
    h record;
    v_uuid uuid;
    v_secret uuid := gen_random_uuid();
    v_recent bigint;
    v_live bigint;
    v_owner text;
BEGIN
    IF NOT @schema@.bf4ps_name_ok(p_name, 200) THEN
        RAISE EXCEPTION 'collector name must be 1-200 characters without control characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT @schema@.bf4ps_name_ok(p_hostname, 200) THEN
        RAISE EXCEPTION 'hostname must be 1-200 characters without control characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT @schema@.bf4ps_name_ok(p_egress_key, 200) THEN
        RAISE EXCEPTION 'egress key must be 1-200 characters without control characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_lane IS NULL OR p_lane NOT IN ('background', 'interactive') THEN
        RAISE EXCEPTION 'lane must be background or interactive'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_software_version IS NOT NULL AND NOT @schema@.bf4ps_name_ok(p_software_version, 200) THEN
        RAISE EXCEPTION 'software version must be up to 200 characters without control characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT x.heartbeat_lost_after, x.registrations_per_hour, x.collectors_per_role INTO s
    FROM @schema@.scheduling_settings AS x;

    -- One registration at a time, so the bounds are exact (a row lock no
    -- other role can take; registrations are rare).
    PERFORM 1 FROM @schema@.bf4ps_locks WHERE lock_name = 'collector_registration' FOR UPDATE;
    SELECT count(*) FILTER (WHERE cs.created_at > now() - interval '1 hour'),
           count(*) FILTER (WHERE c.retired_at IS NULL)
      INTO v_recent, v_live
    FROM @schema@.collector_secrets AS cs
    JOIN @schema@.collectors AS c ON c.collector_uuid = cs.collector_uuid
    WHERE cs.registered_by = v_role
      AND (cs.created_at > now() - interval '1 hour' OR c.retired_at IS NULL);
    IF v_recent >= s.registrations_per_hour THEN
        RAISE EXCEPTION 'role % registered % collectors in the last hour; the limit is % (scheduling_settings.registrations_per_hour)',
                v_role, v_recent, s.registrations_per_hour
            USING ERRCODE = 'configuration_limit_exceeded',
                  HINT = 'a collector restarting in a loop? see its log; operators raise BF4PS_REGISTRATIONS_PER_HOUR';
    END IF;

    -- An egress key is one host's outbound address: the login role that
    -- registered a live collector on it owns it (another role could pause it
    -- for everyone by reporting throttling, or spend its rate).
    SELECT cs.registered_by INTO v_owner
    FROM @schema@.collectors AS c
    JOIN @schema@.collector_secrets AS cs ON cs.collector_uuid = c.collector_uuid
    WHERE c.egress_key = v_key AND c.retired_at IS NULL AND cs.registered_by <> v_role
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'egress key % is in use by collectors of role %', v_key, v_owner
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'each host registers its own egress key; an operator retires the other role''s collectors first (bf4ps-ops collectors retire NAME)';
    END IF;

    SELECT c.collector_uuid, c.hostname, c.heartbeat_state, c.drained, c.current_job_id,
           extract(epoch FROM now() - c.last_heartbeat_at)::float8 AS age_s,
           (SELECT cs.registered_by FROM @schema@.collector_secrets AS cs
            WHERE cs.collector_uuid = c.collector_uuid) AS registered_by
      INTO h
    FROM @schema@.collectors AS c
    WHERE lower(c.collector_name) = lower(v_name) AND c.retired_at IS NULL
    FOR UPDATE;
    IF FOUND THEN
        -- A name is taken over by the role that registered it only (or,
        -- for collectors registered before this release, by any).
        IF h.registered_by IS NOT NULL AND h.registered_by <> v_role THEN
            RAISE EXCEPTION 'collector name % belongs to role %', v_name, h.registered_by
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'pick another --name, or an operator retires it first (bf4ps-ops collectors retire NAME)';
        END IF;
        IF NOT (h.heartbeat_state = 'lost'
                OR h.age_s IS NULL
                OR h.age_s > extract(epoch FROM s.heartbeat_lost_after)
                OR (h.drained AND h.current_job_id IS NULL)) THEN
            collector_uuid := NULL;
            secret := NULL;
            holder_hostname := h.hostname;
            holder_age_s := CASE WHEN h.age_s >= 0 AND h.age_s < 'Infinity' THEN h.age_s ELSE 0 END;
            RETURN NEXT;
            RETURN;
        END IF;
        UPDATE @schema@.collectors AS c
        SET retired_at = now(), drained = true, updated_at = now()
        WHERE c.collector_uuid = h.collector_uuid;
        IF h.collector_uuid IN (SELECT cs.collector_uuid FROM @schema@.collector_secrets AS cs
                                WHERE cs.registered_by = v_role) THEN
            v_live := v_live - 1;
        END IF;
    END IF;
    IF v_live >= s.collectors_per_role THEN
        RAISE EXCEPTION 'role % has % collectors that are not retired; the limit is % (scheduling_settings.collectors_per_role)',
                v_role, v_live, s.collectors_per_role
            USING ERRCODE = 'configuration_limit_exceeded',
                  HINT = 'retire collectors that are gone (bf4ps-ops collectors retire NAME); operators raise BF4PS_COLLECTORS_PER_ROLE';
    END IF;
    BEGIN
        INSERT INTO @schema@.collectors AS c
            (collector_name, hostname, lane, egress_key, software_version,
             started_at, last_heartbeat_at, heartbeat_state)
        VALUES (v_name, v_host, p_lane, v_key, p_software_version, now(), now(), 'healthy')
        RETURNING c.collector_uuid INTO v_uuid;
    EXCEPTION WHEN unique_violation THEN
        -- A concurrent registration (of another role) took the name.
        collector_uuid := NULL;
        secret := NULL;
        holder_hostname := '(registering concurrently)';
        holder_age_s := 0;
        RETURN NEXT;
        RETURN;
    END;
    INSERT INTO @schema@.collector_secrets (collector_uuid, secret_sha256, registered_by)
    VALUES (v_uuid, sha256(convert_to(v_secret::text, 'UTF8')), v_role);
    collector_uuid := v_uuid;
    secret := v_secret;
    holder_hostname := NULL;
    holder_age_s := NULL;
    RETURN NEXT;
END;
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
-- One heartbeat of the incarnation holding `p_secret` (0006): routine ones
-- update last_heartbeat_at only; after an outage exactly one
-- heartbeat_restored. Returns the operator's verdict.
CREATE FUNCTION @schema@.bf4ps_collector_heartbeat(p_uuid uuid, p_secret uuid)
RETURNS TABLE (retired boolean, claimable boolean, restored boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    c record;
BEGIN
    PERFORM @schema@.bf4ps_collector_check_secret(p_uuid, p_secret);
    SELECT x.heartbeat_state, x.enabled, x.drained INTO c
    FROM @schema@.collectors AS x
    WHERE x.collector_uuid = p_uuid AND x.retired_at IS NULL
    FOR UPDATE;
    IF NOT FOUND THEN
        retired := true;
        claimable := false;
        restored := false;
        RETURN NEXT;
        RETURN;
    END IF;
    IF c.heartbeat_state = 'lost' THEN
        INSERT INTO @schema@.collection_events
            (collector_uuid, collector_name_snapshot, hostname_snapshot, egress_key_snapshot,
             lane, event_type, metadata)
        SELECT x.collector_uuid, x.collector_name, x.hostname, x.egress_key, x.lane,
               'heartbeat_restored',
               jsonb_build_object(
                   'lost_at', x.heartbeat_lost_at,
                   'last_heartbeat_at', x.last_heartbeat_at,
                   'outage_ms', CASE WHEN isfinite(x.heartbeat_lost_at)
                                     THEN floor(extract(epoch FROM now() - x.heartbeat_lost_at) * 1000)
                                END)
        FROM @schema@.collectors AS x WHERE x.collector_uuid = p_uuid;
    END IF;
    UPDATE @schema@.collectors AS x
    SET last_heartbeat_at = now(), heartbeat_state = 'healthy', heartbeat_lost_at = NULL,
        updated_at = now()
    WHERE x.collector_uuid = p_uuid;
    retired := false;
    claimable := c.enabled AND NOT c.drained;
    restored := c.heartbeat_state = 'lost';
    RETURN NEXT;
END;
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
-- The clean-stop mark (0006): drained, so the incarnation is neither swept to
-- lost nor blocks a restart under its name.
CREATE FUNCTION @schema@.bf4ps_collector_stopped(p_uuid uuid, p_secret uuid)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    PERFORM @schema@.bf4ps_collector_check_secret(p_uuid, p_secret);
    UPDATE @schema@.collectors AS x
    SET drained = true, updated_at = now()
    WHERE x.collector_uuid = p_uuid;
END;
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
-- One pass of the egress gate (0007) for a request on `p_key` at `p_now`
-- (collectors pass through bf4ps_collector_egress_pass, on the database's
-- clock; the scheduling simulation passes its virtual one). The request may
-- go now when the key's next slot, the key's pause and (`p_budget`:
-- background requests) the fleet budget's next slot have all passed; then
-- the key's slot moves the published egress_spacing on and the budget's
-- budget_spacing on, and `granted` is true. Otherwise nothing is reserved
-- and `wait_us` says when to try again (at most a day: a slot or pause an
-- owner set to infinity waits the longest step, never overflows). Locks:
-- the budget row first, then the key row (every caller alike).
CREATE FUNCTION @schema@.bf4ps_egress_grant(p_key text, p_budget boolean, p_now timestamptz)
RETURNS TABLE (granted boolean, wait_us bigint, throttle_streak integer, paused boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_spacing interval;
    v_budget_spacing interval;
    v_budget timestamptz;
    v_next timestamptz;
    v_paused timestamptz;
    v_streak integer;
    v_at timestamptz;
BEGIN
    SELECT s.egress_spacing, CASE WHEN p_budget THEN s.budget_spacing END
      INTO v_spacing, v_budget_spacing
    FROM @schema@.scheduling_settings AS s;
    IF v_budget_spacing IS NOT NULL THEN
        SELECT b.next_slot_at INTO v_budget
        FROM @schema@.egress_budget AS b WHERE b.singleton FOR UPDATE;
    END IF;
    SELECT g.next_slot_at, g.paused_until, g.throttle_streak INTO v_next, v_paused, v_streak
    FROM @schema@.egress_gates AS g WHERE g.egress_key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO @schema@.egress_gates (egress_key, next_slot_at, passes)
        VALUES (p_key, '-infinity', 0)
        ON CONFLICT (egress_key) DO NOTHING;
        SELECT g.next_slot_at, g.paused_until, g.throttle_streak INTO v_next, v_paused, v_streak
        FROM @schema@.egress_gates AS g WHERE g.egress_key = p_key FOR UPDATE;
    END IF;
    -- greatest() ignores NULLs (no pause, budget off).
    v_at := greatest(v_next, v_paused, v_budget);
    IF v_at > p_now THEN
        RETURN QUERY SELECT false,
            CASE WHEN v_at >= p_now + interval '1 day' THEN 86400000000::bigint
                 ELSE ceil(extract(epoch FROM v_at - p_now) * 1000000)::bigint END,
            v_streak,
            coalesce(v_paused > p_now, false);
        RETURN;
    END IF;
    UPDATE @schema@.egress_gates AS g
    SET next_slot_at = p_now + v_spacing, passes = g.passes + 1, updated_at = p_now
    WHERE g.egress_key = p_key;
    IF v_budget_spacing IS NOT NULL THEN
        UPDATE @schema@.egress_budget AS b
        SET next_slot_at = p_now + v_budget_spacing, passes = b.passes + 1, updated_at = p_now
        WHERE b.singleton;
    END IF;
    RETURN QUERY SELECT true, 0::bigint, v_streak, false;
END;
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
-- One pass of the egress gate for the caller's incarnation: its registered
-- key and lane (the fleet budget applies to the background lane), the
-- published spacing, the database's clock read after the locks.
CREATE FUNCTION @schema@.bf4ps_collector_egress_pass(p_uuid uuid, p_secret uuid)
RETURNS TABLE (granted boolean, wait_us bigint, throttle_streak integer, paused boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_key text;
    v_lane text;
BEGIN
    PERFORM @schema@.bf4ps_collector_check_secret(p_uuid, p_secret);
    SELECT c.egress_key, c.lane INTO v_key, v_lane
    FROM @schema@.collectors AS c WHERE c.collector_uuid = p_uuid;
    -- Lock order: the budget, then the key; the clock after both (a wait
    -- for them must not make the slot stale).
    IF v_lane = 'background' THEN
        PERFORM 1 FROM @schema@.egress_budget AS b WHERE b.singleton FOR UPDATE;
    END IF;
    PERFORM 1 FROM @schema@.egress_gates AS g WHERE g.egress_key = v_key FOR UPDATE;
    RETURN QUERY SELECT * FROM @schema@.bf4ps_egress_grant(v_key, v_lane = 'background',
                                                           clock_timestamp());
END;
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
-- The budget class of a background job: a retry (it failed before, or a
-- recent soldier's refresh, as BF4PS classifies recovery work), bootstrap
-- (a first collection) or active (a due refresh of a soldier who played).
CREATE FUNCTION @schema@.bf4ps_budget_class(priority_class text, last_error_at timestamptz)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
    SELECT CASE WHEN last_error_at IS NOT NULL OR priority_class = 'recent' THEN 'retry'
                WHEN priority_class = 'bootstrap' THEN 'bootstrap'
                ELSE 'active' END
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
-- Claims, at `p_now`, the next eligible job of the lane of incarnation
-- `p_uuid` (which must be enabled, undrained, unretired and hold no job),
-- and starts it unless `p_start` is false: the job goes pending -> running
-- (or claimed), current_job_id is set, `claimed` (then `started`) is
-- written with the registry's identity snapshots. The lease is the
-- published lease_duration.
--
-- Which job: the contract's order (FOR UPDATE SKIP LOCKED, served by
-- ix_collection_jobs_claim_order). In the background lane, while the fleet
-- budget is on, the budget's shares decide the class first, BF4PS's way:
-- bootstrap while it used less than share_bootstrap_min of the budget in
-- the budget window, then retries below share_retry_min, then active work
-- below share_active_max, then (borrowing an unused share) bootstrap,
-- retries, and active work last: active work exceeds its share only when
-- nothing else waits. The
-- shares are counted in budget_usage under the budget's row lock, so they
-- hold across every host. (Collectors call bf4ps_collector_claim, on the
-- database's clock; the scheduling simulation passes a virtual one.)
CREATE FUNCTION @schema@.bf4ps_claim_job(p_uuid uuid, p_start boolean, p_now timestamptz)
RETURNS TABLE (
    job_id bigint,
    soldier_id bigint,
    persona_id bigint,
    platform text,
    soldier_name text,
    resource text,
    lane text,
    priority_class text,
    attempt_count integer,
    lease_token uuid,
    lease_expires_at timestamptz,
    claimed_at timestamptz,
    created_at timestamptz,
    eligible_at timestamptz,
    budget_class text
)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    s record;
    me record;
    v_classes text[];
    v_class text;
    v_job bigint;
    v_budgeted boolean;
    v_active bigint;
    v_bootstrap bigint;
    v_retry bigint;
BEGIN
    SELECT x.lease_duration, x.budget_spacing, x.budget_requests, x.budget_window,
           x.share_active_max, x.share_bootstrap_min, x.share_retry_min
      INTO s
    FROM @schema@.scheduling_settings AS x;
    SELECT c.collector_uuid, c.collector_name, c.hostname, c.egress_key, c.lane INTO me
    FROM @schema@.collectors AS c
    WHERE c.collector_uuid = p_uuid AND c.enabled AND NOT c.drained AND c.retired_at IS NULL
      AND c.current_job_id IS NULL;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    v_budgeted := me.lane = 'background' AND s.budget_spacing IS NOT NULL;
    IF v_budgeted THEN
        -- The shares are counted and used under one lock.
        PERFORM 1 FROM @schema@.egress_budget AS b WHERE b.singleton FOR UPDATE;
        SELECT coalesce(sum(u.grants) FILTER (WHERE u.budget_class = 'active'), 0),
               coalesce(sum(u.grants) FILTER (WHERE u.budget_class = 'bootstrap'), 0),
               coalesce(sum(u.grants) FILTER (WHERE u.budget_class = 'retry'), 0)
          INTO v_active, v_bootstrap, v_retry
        FROM @schema@.budget_usage AS u
        -- Every minute whose span overlaps the window (the current one
        -- included, whatever the window's length).
        WHERE u.minute + interval '1 minute' > p_now - s.budget_window AND u.minute <= p_now;
        v_classes := ARRAY[]::text[];
        IF v_bootstrap < s.share_bootstrap_min * s.budget_requests THEN
            v_classes := v_classes || 'bootstrap'::text;
        END IF;
        IF v_retry < s.share_retry_min * s.budget_requests THEN
            v_classes := v_classes || 'retry'::text;
        END IF;
        IF v_active < s.share_active_max * s.budget_requests THEN
            v_classes := v_classes || 'active'::text;
        END IF;
        -- Borrowing: an unused share goes to the other classes, active
        -- last (its share is a cap: it exceeds it only when nothing else
        -- waits).
        FOREACH v_class IN ARRAY ARRAY['bootstrap', 'retry', 'active'] LOOP
            IF NOT (v_class = ANY (v_classes)) THEN
                v_classes := v_classes || v_class;
            END IF;
        END LOOP;
    ELSE
        v_classes := ARRAY['any'];
    END IF;
    FOREACH v_class IN ARRAY v_classes LOOP
        IF v_class = 'any' THEN
            -- Served by ix_collection_jobs_claim_order.
            SELECT j.job_id INTO v_job
            FROM @schema@.collection_jobs AS j
            WHERE j.status = 'pending' AND j.lane = me.lane AND j.eligible_at <= p_now
            ORDER BY CASE j.priority_class
                         WHEN 'interactive' THEN 1
                         WHEN 'active' THEN 2
                         WHEN 'recent' THEN 3
                         WHEN 'bootstrap' THEN 4
                     END,
                     j.priority_value DESC, j.eligible_at, j.created_at, j.job_id
            FOR UPDATE SKIP LOCKED
            LIMIT 1;
        ELSE
            -- One class of the background lane, in the contract's order:
            -- served by ix_collection_jobs_budget_claim_order (0016), whose
            -- predicate the literal lane matches in a generic plan too.
            SELECT j.job_id INTO v_job
            FROM @schema@.collection_jobs AS j
            WHERE j.status = 'pending' AND j.lane = 'background' AND j.eligible_at <= p_now
              AND @schema@.bf4ps_budget_class(j.priority_class, j.last_error_at) = v_class
            ORDER BY CASE j.priority_class
                         WHEN 'interactive' THEN 1
                         WHEN 'active' THEN 2
                         WHEN 'recent' THEN 3
                         WHEN 'bootstrap' THEN 4
                     END,
                     j.priority_value DESC, j.eligible_at, j.created_at, j.job_id
            FOR UPDATE SKIP LOCKED
            LIMIT 1;
        END IF;
        EXIT WHEN v_job IS NOT NULL;
    END LOOP;
    IF v_job IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH claimed AS (
        UPDATE @schema@.collection_jobs AS j
        SET status = CASE WHEN p_start THEN 'running' ELSE 'claimed' END,
            collector_uuid = p_uuid,
            lease_token = gen_random_uuid(),
            claimed_at = p_now,
            started_at = CASE WHEN p_start THEN p_now END,
            lease_expires_at = p_now + s.lease_duration,
            attempt_count = j.attempt_count + 1,
            updated_at = p_now
        WHERE j.job_id = v_job
        RETURNING j.*
    ), job AS (
        SELECT c.*, so.persona_id AS s_persona_id, so.platform AS s_platform,
               so.current_name AS s_name,
               @schema@.bf4ps_sane_time(c.eligible_at) AS sane_eligible_at,
               CASE WHEN c.lane = 'background'
                    THEN @schema@.bf4ps_budget_class(c.priority_class, c.last_error_at) END AS b_class
        FROM claimed AS c JOIN @schema@.soldiers AS so ON so.soldier_id = c.soldier_id
    ), holder AS (
        UPDATE @schema@.collectors AS c
        SET current_job_id = claimed.job_id, updated_at = p_now
        FROM claimed
        WHERE c.collector_uuid = p_uuid
    ), usage AS (
        INSERT INTO @schema@.budget_usage AS u (minute, budget_class, grants)
        SELECT date_trunc('minute', p_now), job.b_class, 1 FROM job WHERE v_budgeted
        ON CONFLICT (minute, budget_class) DO UPDATE SET grants = u.grants + 1
    ), events AS (
        INSERT INTO @schema@.collection_events
            (occurred_at, collector_uuid, collector_name_snapshot, hostname_snapshot,
             egress_key_snapshot, job_id, soldier_id, persona_id, platform, resource, lane,
             event_type, attempt_number, lease_token, metadata)
        SELECT p_now, me.collector_uuid, me.collector_name, me.hostname, me.egress_key,
               c.job_id, c.soldier_id, c.s_persona_id, c.s_platform, c.resource, c.lane,
               e.event_type, c.attempt_count, c.lease_token, e.metadata
        FROM job AS c CROSS JOIN LATERAL (VALUES
            (1, 'claimed', jsonb_build_object(
                'priority_class', c.priority_class, 'reason', c.reason,
                'budget_class', c.b_class,
                'queued_ms', floor(extract(epoch FROM p_now - c.sane_eligible_at) * 1000))),
            (2, 'started', jsonb_build_object('claim_to_start_ms', 0))
        ) AS e(ord, event_type, metadata)
        WHERE e.ord = 1 OR p_start
        ORDER BY e.ord
    )
    SELECT c.job_id, c.soldier_id, c.s_persona_id, c.s_platform, c.s_name, c.resource, c.lane,
           c.priority_class, c.attempt_count, c.lease_token, c.lease_expires_at, c.claimed_at,
           @schema@.bf4ps_sane_time(c.created_at), c.sane_eligible_at, c.b_class
    FROM job AS c;
END;
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
-- The collector's claim (bf4ps_claim_job on the database's clock), for the
-- incarnation holding `p_secret`; it commits without waiting for the WAL
-- flush (losing it in a crash loses the claim whole, which recovery
-- returns). No row: nothing claimable, or the caller may not claim. A
-- collector speaking an older protocol than the schema's is refused with
-- SQLSTATE BF001 (it drains; see bf4ps_collector_protocol).
CREATE FUNCTION @schema@.bf4ps_collector_claim(
    p_uuid uuid, p_secret uuid, p_protocol integer, p_start boolean DEFAULT true)
RETURNS TABLE (
    job_id bigint,
    soldier_id bigint,
    persona_id bigint,
    platform text,
    soldier_name text,
    resource text,
    lane text,
    priority_class text,
    attempt_count integer,
    lease_token uuid,
    lease_expires_at timestamptz,
    claimed_at timestamptz,
    created_at timestamptz,
    eligible_at timestamptz,
    budget_class text
)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    IF p_protocol IS NULL OR p_protocol < @schema@.bf4ps_collector_protocol() THEN
        RAISE EXCEPTION 'this collector speaks protocol %, the schema protocol %: upgrade bf4ps-ops on this host',
                coalesce(p_protocol::text, 'NULL'), @schema@.bf4ps_collector_protocol()
            USING ERRCODE = 'BF001';
    END IF;
    PERFORM @schema@.bf4ps_collector_check_secret(p_uuid, p_secret);
    PERFORM set_config('synchronous_commit', 'off', true);
    RETURN QUERY SELECT * FROM @schema@.bf4ps_claim_job(p_uuid, p_start, now());
END;
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
-- claimed -> running under the lease (the contract's start guard); writes
-- `started`. NULL: the lease is not the caller's (nothing written).
CREATE FUNCTION @schema@.bf4ps_collector_start(
    p_uuid uuid, p_secret uuid, p_job_id bigint, p_lease_token uuid)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
DECLARE
    v_expires timestamptz;
BEGIN
    PERFORM @schema@.bf4ps_collector_check_secret(p_uuid, p_secret);
    PERFORM set_config('synchronous_commit', 'off', true);
    WITH started AS (
        UPDATE @schema@.collection_jobs AS j
        SET status = 'running', started_at = now(), updated_at = now()
        WHERE j.job_id = p_job_id AND j.status = 'claimed' AND j.collector_uuid = p_uuid
          AND j.lease_token = p_lease_token AND j.lease_expires_at > now()
        RETURNING j.job_id, j.soldier_id, j.resource, j.lane, j.attempt_count, j.lease_token,
                  j.lease_expires_at, j.claimed_at
    ), event AS (
        INSERT INTO @schema@.collection_events
            (collector_uuid, collector_name_snapshot, hostname_snapshot, egress_key_snapshot,
             job_id, soldier_id, persona_id, platform, resource, lane, event_type,
             attempt_number, lease_token, metadata)
        SELECT p_uuid, c.collector_name, c.hostname, c.egress_key,
               j.job_id, j.soldier_id, s.persona_id, s.platform, j.resource, j.lane,
               'started', j.attempt_count, j.lease_token,
               jsonb_build_object('claim_to_start_ms',
                                  floor(extract(epoch FROM now() - j.claimed_at) * 1000))
        FROM started AS j
        JOIN @schema@.soldiers AS s ON s.soldier_id = j.soldier_id
        JOIN @schema@.collectors AS c ON c.collector_uuid = p_uuid
    )
    SELECT started.lease_expires_at INTO v_expires FROM started;
    RETURN v_expires;
END;
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
-- Extends the caller's unexpired lease by the published lease_duration.
-- Writes no event. NULL: the lease is lost.
CREATE FUNCTION @schema@.bf4ps_collector_renew(
    p_uuid uuid, p_secret uuid, p_job_id bigint, p_lease_token uuid)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
DECLARE
    v_expires timestamptz;
BEGIN
    PERFORM @schema@.bf4ps_collector_check_secret(p_uuid, p_secret);
    UPDATE @schema@.collection_jobs AS j
    SET lease_expires_at = now() + (SELECT s.lease_duration FROM @schema@.scheduling_settings AS s),
        updated_at = now()
    WHERE j.job_id = p_job_id AND j.collector_uuid = p_uuid AND j.lease_token = p_lease_token
      AND j.status IN ('claimed', 'running') AND j.lease_expires_at > now()
    RETURNING j.lease_expires_at INTO v_expires;
    RETURN v_expires;
END;
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
-- When the next pending job of the caller's lane becomes eligible (a
-- collector sleeps until then when nothing is claimable); NULL: none.
CREATE FUNCTION @schema@.bf4ps_collector_next_eligible(p_uuid uuid, p_secret uuid)
RETURNS timestamptz
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    PERFORM @schema@.bf4ps_collector_check_secret(p_uuid, p_secret);
    RETURN (SELECT @schema@.bf4ps_sane_time(min(j.eligible_at))
            FROM @schema@.collection_jobs AS j
            WHERE j.status = 'pending'
              AND j.lane = (SELECT c.lane FROM @schema@.collectors AS c
                            WHERE c.collector_uuid = p_uuid));
END;
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
-- The state columns of one resource after an outcome, in the one statement
-- every outcome uses: the group of `p_resource` gets the new values (as of
-- `p_now`), the three others keep theirs. Creates the row if the soldier
-- has none.
CREATE FUNCTION @schema@.bf4ps_record_outcome(
    p_soldier_id bigint, p_resource text, p_state text, p_success boolean,
    p_next_due_at timestamptz, p_failures integer, p_error_class text, p_error_message text,
    p_now timestamptz)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    FOR attempt IN 1..2 LOOP
        UPDATE @schema@.collection_state AS s SET
            detailed_state = CASE WHEN p_resource = 'detailed' THEN p_state ELSE s.detailed_state END,
            detailed_last_attempt_at = CASE WHEN p_resource = 'detailed' THEN p_now ELSE s.detailed_last_attempt_at END,
            detailed_last_success_at = CASE WHEN p_resource = 'detailed' AND p_success THEN p_now ELSE s.detailed_last_success_at END,
            detailed_next_due_at = CASE WHEN p_resource = 'detailed' THEN p_next_due_at ELSE s.detailed_next_due_at END,
            detailed_consecutive_failures = CASE WHEN p_resource = 'detailed' THEN p_failures ELSE s.detailed_consecutive_failures END,
            detailed_last_error_class = CASE WHEN p_resource = 'detailed' THEN p_error_class ELSE s.detailed_last_error_class END,
            detailed_last_error_message = CASE WHEN p_resource = 'detailed' THEN p_error_message ELSE s.detailed_last_error_message END,
            profile_state = CASE WHEN p_resource = 'profile' THEN p_state ELSE s.profile_state END,
            profile_last_attempt_at = CASE WHEN p_resource = 'profile' THEN p_now ELSE s.profile_last_attempt_at END,
            profile_last_success_at = CASE WHEN p_resource = 'profile' AND p_success THEN p_now ELSE s.profile_last_success_at END,
            profile_next_due_at = CASE WHEN p_resource = 'profile' THEN p_next_due_at ELSE s.profile_next_due_at END,
            profile_consecutive_failures = CASE WHEN p_resource = 'profile' THEN p_failures ELSE s.profile_consecutive_failures END,
            profile_last_error_class = CASE WHEN p_resource = 'profile' THEN p_error_class ELSE s.profile_last_error_class END,
            profile_last_error_message = CASE WHEN p_resource = 'profile' THEN p_error_message ELSE s.profile_last_error_message END,
            weapons_state = CASE WHEN p_resource = 'weapons' THEN p_state ELSE s.weapons_state END,
            weapons_last_attempt_at = CASE WHEN p_resource = 'weapons' THEN p_now ELSE s.weapons_last_attempt_at END,
            weapons_last_success_at = CASE WHEN p_resource = 'weapons' AND p_success THEN p_now ELSE s.weapons_last_success_at END,
            weapons_next_due_at = CASE WHEN p_resource = 'weapons' THEN p_next_due_at ELSE s.weapons_next_due_at END,
            weapons_consecutive_failures = CASE WHEN p_resource = 'weapons' THEN p_failures ELSE s.weapons_consecutive_failures END,
            weapons_last_error_class = CASE WHEN p_resource = 'weapons' THEN p_error_class ELSE s.weapons_last_error_class END,
            weapons_last_error_message = CASE WHEN p_resource = 'weapons' THEN p_error_message ELSE s.weapons_last_error_message END,
            vehicles_state = CASE WHEN p_resource = 'vehicles' THEN p_state ELSE s.vehicles_state END,
            vehicles_last_attempt_at = CASE WHEN p_resource = 'vehicles' THEN p_now ELSE s.vehicles_last_attempt_at END,
            vehicles_last_success_at = CASE WHEN p_resource = 'vehicles' AND p_success THEN p_now ELSE s.vehicles_last_success_at END,
            vehicles_next_due_at = CASE WHEN p_resource = 'vehicles' THEN p_next_due_at ELSE s.vehicles_next_due_at END,
            vehicles_consecutive_failures = CASE WHEN p_resource = 'vehicles' THEN p_failures ELSE s.vehicles_consecutive_failures END,
            vehicles_last_error_class = CASE WHEN p_resource = 'vehicles' THEN p_error_class ELSE s.vehicles_last_error_class END,
            vehicles_last_error_message = CASE WHEN p_resource = 'vehicles' THEN p_error_message ELSE s.vehicles_last_error_message END,
            updated_at = p_now
        WHERE s.soldier_id = p_soldier_id;
        EXIT WHEN FOUND;
        INSERT INTO @schema@.collection_state (soldier_id) VALUES (p_soldier_id)
        ON CONFLICT (soldier_id) DO NOTHING;
    END LOOP;
END;
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
-- Successful finalization, the contract's steps in one transaction, for the
-- unexpired running lease of incarnation `p_uuid` (no row: the lease is
-- lost, nothing is written), as of `p_now` (bf4ps_collector_succeed: the
-- database's clock). `p_data` is the normalized document of the job's resource
-- (docs/battlelog.md), written into BF4PS's tables as of p_now:
--   detailed  detailed_stats_current (quit_percentage and longest_headshot
--             rounded half-even to the column scale), and a
--             detailed_stats_history snapshot only when a quantized counter
--             differs from the latest snapshot (observed_at = p_now);
--   weapons / vehicles  the catalog upserted in guid order under the
--             catalog's row lock (one writer at a time, so concurrent
--             finalizations never deadlock), then the soldier's set
--             replaced as a whole (a null counter is 0 where BF4PS's column
--             is NOT NULL);
--   profile   battlelog_profiles (by username) and profile_soldiers.
-- Then collection_state (success; next due after the published cadence of
-- the resource; a `not_found` profile is unavailable), `succeeded` with
-- the registry's snapshots, current_job_id cleared, the job deleted, and
-- the key's throttle streak ended (Battlelog answered). Bad input is
-- refused (SQLSTATE 22023), writing nothing.
CREATE FUNCTION @schema@.bf4ps_succeed_job(
    p_uuid uuid, p_job_id bigint, p_lease_token uuid,
    p_data jsonb, p_duration_ms bigint, p_http_status integer, p_now timestamptz)
RETURNS TABLE (
    changed boolean,
    history_appended boolean,
    previous_success_at timestamptz,
    next_due_at timestamptz
)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    j record;
    v detailed_stats_current;
    v_changed boolean;
    v_hist boolean := false;
    v_prev timestamptz;
    v_next timestamptz;
    v_state text := 'success';
    v_cadence interval;
    v_profile bigint;
    v_fresh jsonb;
BEGIN
    IF p_duration_ms IS NULL OR p_duration_ms < 0 OR p_duration_ms > 86400000 THEN
        RAISE EXCEPTION 'duration_ms must be 0-86400000 (got %)', coalesce(p_duration_ms::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_http_status IS NULL OR NOT (p_http_status BETWEEN 200 AND 299
                                      OR (p_http_status = 404
                                          AND coalesce(p_data->>'access_state' = 'not_found',
                                                       false))) THEN
        RAISE EXCEPTION 'a success has a 2xx http_status, or 404 for a profile not found (got %)',
                coalesce(p_http_status::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_data IS NULL OR jsonb_typeof(p_data) <> 'object' THEN
        RAISE EXCEPTION 'data must be a JSON object'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    SELECT x.job_id, x.soldier_id, so.persona_id, so.platform, so.current_name, x.resource,
           x.lane, x.attempt_count, c.collector_name, c.hostname, c.egress_key
      INTO j
    FROM @schema@.collection_jobs AS x
    JOIN @schema@.soldiers AS so ON so.soldier_id = x.soldier_id
    JOIN @schema@.collectors AS c ON c.collector_uuid = x.collector_uuid
    WHERE x.job_id = p_job_id AND x.collector_uuid = p_uuid AND x.lease_token = p_lease_token
      AND x.status = 'running' AND x.lease_expires_at > p_now
    FOR UPDATE OF x;
    IF NOT FOUND THEN
        RETURN;
    END IF;

    IF p_http_status = 404 AND j.resource <> 'profile' THEN
        RAISE EXCEPTION 'only a profile job succeeds with 404 (an account Battlelog does not know)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    IF j.resource = 'detailed' THEN
        -- A detailed document: BF4PS's columns (and the persona it is for,
        -- which must be the job's), at least one of them.
        IF NOT ARRAY(SELECT jsonb_object_keys(p_data)) <@ (
               SELECT array_agg(a.attname::text) || 'persona_id'::text
               FROM pg_catalog.pg_attribute AS a
               WHERE a.attrelid = '@schema@.detailed_stats_current'::regclass
                 AND a.attnum > 0 AND NOT a.attisdropped
                 AND a.attname NOT IN ('soldier_id', 'source_fetched_at', 'updated_at'))
           OR NOT EXISTS (SELECT 1 FROM jsonb_object_keys(p_data) AS k(key)
                          WHERE k.key <> 'persona_id')
           OR (p_data ? 'persona_id'
               AND (p_data->'persona_id') IS DISTINCT FROM to_jsonb(j.persona_id)) THEN
            RAISE EXCEPTION 'detailed data must hold detailed_stats_current columns only (and the job''s persona_id)'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v := jsonb_populate_record(NULL::detailed_stats_current,
                 p_data - 'soldier_id' - 'source_fetched_at' - 'updated_at');
        IF EXISTS (SELECT 1 FROM jsonb_each(to_jsonb(v)) AS e
                   WHERE jsonb_typeof(e.value) = 'number' AND (e.value)::text::numeric < 0) THEN
            RAISE EXCEPTION 'detailed counters must not be negative'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v.soldier_id := j.soldier_id;
        v.quit_percentage := @schema@.bf4ps_round_half_even((p_data->>'quit_percentage')::numeric, 6);
        v.longest_headshot := @schema@.bf4ps_round_half_even((p_data->>'longest_headshot')::numeric, 4);
        IF v.quit_percentage = 'NaN'::numeric OR v.longest_headshot = 'NaN'::numeric THEN
            RAISE EXCEPTION 'quit_percentage and longest_headshot must be numbers'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v.source_fetched_at := p_now;
        v.updated_at := p_now;
        -- History only when a retained (quantized) value differs from the
        -- latest snapshot.
        SELECT (to_jsonb(h) - 'snapshot_id' - 'soldier_id' - 'observed_at')
               IS DISTINCT FROM (to_jsonb(v) - 'soldier_id' - 'source_fetched_at' - 'updated_at')
          INTO v_changed
        FROM @schema@.detailed_stats_history AS h
        WHERE h.soldier_id = j.soldier_id
        ORDER BY h.observed_at DESC, h.snapshot_id DESC
        LIMIT 1;
        v_changed := coalesce(v_changed, true);
        IF v_changed THEN
            INSERT INTO @schema@.detailed_stats_history (soldier_id,
                rank, time_played_seconds, assault_score, engineer_score, support_score,
                recon_score, commander_score, squad_score, vehicle_score, award_score,
                unlock_score, total_score, combat_score, conquest_score, rush_score,
                team_deathmatch_score, domination_score, obliteration_score, defuse_score,
                capture_the_flag_score, air_superiority_score, carrier_assault_score,
                chain_link_score, kills, deaths, kill_assists, wins, losses, shots_fired,
                shots_hit, repairs, revives, heals, resupplies, avenger_kills, savior_kills,
                suppression_assists, quit_percentage, flags_captured, flags_defended,
                dogtags_taken, vehicles_destroyed, vehicle_damage, headshots,
                longest_headshot, highest_kill_streak, nemesis_kills, highest_nemesis_streak,
                observed_at)
            VALUES (v.soldier_id,
                v.rank, v.time_played_seconds, v.assault_score, v.engineer_score,
                v.support_score, v.recon_score, v.commander_score, v.squad_score,
                v.vehicle_score, v.award_score, v.unlock_score, v.total_score,
                v.combat_score, v.conquest_score, v.rush_score, v.team_deathmatch_score,
                v.domination_score, v.obliteration_score, v.defuse_score,
                v.capture_the_flag_score, v.air_superiority_score, v.carrier_assault_score,
                v.chain_link_score, v.kills, v.deaths, v.kill_assists, v.wins, v.losses,
                v.shots_fired, v.shots_hit, v.repairs, v.revives, v.heals, v.resupplies,
                v.avenger_kills, v.savior_kills, v.suppression_assists, v.quit_percentage,
                v.flags_captured, v.flags_defended, v.dogtags_taken, v.vehicles_destroyed,
                v.vehicle_damage, v.headshots, v.longest_headshot, v.highest_kill_streak,
                v.nemesis_kills, v.highest_nemesis_streak,
                p_now);
            v_hist := true;
        END IF;
        INSERT INTO @schema@.detailed_stats_current AS d
        SELECT v.*
        ON CONFLICT (soldier_id) DO UPDATE SET
                rank = EXCLUDED.rank, time_played_seconds = EXCLUDED.time_played_seconds,
                assault_score = EXCLUDED.assault_score,
                engineer_score = EXCLUDED.engineer_score,
                support_score = EXCLUDED.support_score, recon_score = EXCLUDED.recon_score,
                commander_score = EXCLUDED.commander_score,
                squad_score = EXCLUDED.squad_score, vehicle_score = EXCLUDED.vehicle_score,
                award_score = EXCLUDED.award_score, unlock_score = EXCLUDED.unlock_score,
                total_score = EXCLUDED.total_score, combat_score = EXCLUDED.combat_score,
                conquest_score = EXCLUDED.conquest_score, rush_score = EXCLUDED.rush_score,
                team_deathmatch_score = EXCLUDED.team_deathmatch_score,
                domination_score = EXCLUDED.domination_score,
                obliteration_score = EXCLUDED.obliteration_score,
                defuse_score = EXCLUDED.defuse_score,
                capture_the_flag_score = EXCLUDED.capture_the_flag_score,
                air_superiority_score = EXCLUDED.air_superiority_score,
                carrier_assault_score = EXCLUDED.carrier_assault_score,
                chain_link_score = EXCLUDED.chain_link_score, kills = EXCLUDED.kills,
                deaths = EXCLUDED.deaths, kill_assists = EXCLUDED.kill_assists,
                wins = EXCLUDED.wins, losses = EXCLUDED.losses,
                shots_fired = EXCLUDED.shots_fired, shots_hit = EXCLUDED.shots_hit,
                repairs = EXCLUDED.repairs, revives = EXCLUDED.revives,
                heals = EXCLUDED.heals, resupplies = EXCLUDED.resupplies,
                avenger_kills = EXCLUDED.avenger_kills,
                savior_kills = EXCLUDED.savior_kills,
                suppression_assists = EXCLUDED.suppression_assists,
                quit_percentage = EXCLUDED.quit_percentage,
                flags_captured = EXCLUDED.flags_captured,
                flags_defended = EXCLUDED.flags_defended,
                dogtags_taken = EXCLUDED.dogtags_taken,
                vehicles_destroyed = EXCLUDED.vehicles_destroyed,
                vehicle_damage = EXCLUDED.vehicle_damage, headshots = EXCLUDED.headshots,
                longest_headshot = EXCLUDED.longest_headshot,
                highest_kill_streak = EXCLUDED.highest_kill_streak,
                nemesis_kills = EXCLUDED.nemesis_kills,
                highest_nemesis_streak = EXCLUDED.highest_nemesis_streak,
                source_fetched_at = EXCLUDED.source_fetched_at, updated_at = p_now;
    ELSIF j.resource = 'weapons' THEN
        IF jsonb_typeof(p_data->'weapons') IS DISTINCT FROM 'array'
           OR jsonb_array_length(p_data->'weapons') > 5000 THEN
            RAISE EXCEPTION 'weapons must be an array of at most 5000 entries'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF EXISTS (SELECT 1 FROM jsonb_to_recordset(p_data->'weapons') AS e(
                       guid text, name text, slug text, category text, kills bigint,
                       headshots bigint, shots_fired bigint, shots_hit bigint,
                       time_equipped_seconds bigint)
                   WHERE NOT @schema@.bf4ps_name_ok(e.guid, 200)
                      OR (e.name IS NOT NULL AND length(e.name) > 500)
                      OR (e.slug IS NOT NULL AND length(e.slug) > 500)
                      OR (e.category IS NOT NULL AND length(e.category) > 500)
                      OR e.kills < 0 OR e.headshots < 0 OR e.shots_fired < 0
                      OR e.shots_hit < 0 OR e.time_equipped_seconds < 0)
           OR (SELECT count(*) <> count(DISTINCT e->>'guid')
               FROM jsonb_array_elements(p_data->'weapons') AS e) THEN
            RAISE EXCEPTION 'a weapon has no guid, a guid twice, an overlong text or a negative counter'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        -- One catalog writer at a time, guids in order.
        PERFORM 1 FROM @schema@.bf4ps_locks WHERE lock_name = 'weapon_catalog' FOR UPDATE;
        WITH e AS (
            SELECT x.* FROM jsonb_to_recordset(p_data->'weapons') AS x(
                guid text, name text, slug text, category text, kills bigint,
                headshots bigint, shots_fired bigint, shots_hit bigint,
                time_equipped_seconds bigint)
        ), cat AS (
            INSERT INTO @schema@.weapon_catalog AS k
                (weapon_guid, name, slug, category, first_seen_at, last_seen_at)
            SELECT e.guid, coalesce(nullif(btrim(e.name), ''), nullif(btrim(e.slug), ''), e.guid),
                   e.slug, e.category, p_now, p_now
            FROM e ORDER BY e.guid
            ON CONFLICT (weapon_guid) DO UPDATE
            SET name = EXCLUDED.name, slug = EXCLUDED.slug, category = EXCLUDED.category,
                last_seen_at = greatest(k.last_seen_at, EXCLUDED.last_seen_at)
            RETURNING k.weapon_id, k.weapon_guid
        )
        SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'weapon_id', cat.weapon_id, 'kills', coalesce(e.kills, 0),
                   'headshots', coalesce(e.headshots, 0),
                   'shots_fired', coalesce(e.shots_fired, 0),
                   'shots_hit', coalesce(e.shots_hit, 0),
                   'time_equipped_seconds', coalesce(e.time_equipped_seconds, 0))), '[]')
          INTO v_fresh
        FROM e JOIN cat ON cat.weapon_guid = e.guid;
        -- The soldier's set, replaced as a whole (the old rows first, then
        -- the new: one key is never deleted and inserted by one statement).
        WITH old AS (
            DELETE FROM @schema@.soldier_weapon_stats AS w WHERE w.soldier_id = j.soldier_id
            RETURNING w.weapon_id, w.kills, w.headshots, w.shots_fired, w.shots_hit,
                      w.time_equipped_seconds
        ), fresh AS (
            SELECT f.* FROM jsonb_to_recordset(v_fresh) AS f(
                weapon_id bigint, kills bigint, headshots bigint, shots_fired bigint,
                shots_hit bigint, time_equipped_seconds bigint)
        )
        SELECT EXISTS ((SELECT * FROM old EXCEPT SELECT * FROM fresh)
                       UNION ALL (SELECT * FROM fresh EXCEPT SELECT * FROM old))
          INTO v_changed;
        INSERT INTO @schema@.soldier_weapon_stats
            (soldier_id, weapon_id, kills, headshots, shots_fired, shots_hit,
             time_equipped_seconds, source_fetched_at, updated_at)
        SELECT j.soldier_id, f.weapon_id, f.kills, f.headshots, f.shots_fired, f.shots_hit,
               f.time_equipped_seconds, p_now, p_now
        FROM jsonb_to_recordset(v_fresh) AS f(
            weapon_id bigint, kills bigint, headshots bigint, shots_fired bigint,
            shots_hit bigint, time_equipped_seconds bigint);
    ELSIF j.resource = 'vehicles' THEN
        IF jsonb_typeof(p_data->'vehicles') IS DISTINCT FROM 'array'
           OR jsonb_array_length(p_data->'vehicles') > 5000 THEN
            RAISE EXCEPTION 'vehicles must be an array of at most 5000 entries'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF EXISTS (SELECT 1 FROM jsonb_to_recordset(p_data->'vehicles') AS e(
                       guid text, name text, slug text, category text, kills bigint,
                       time_in_seconds bigint, destroy_x_in_y bigint)
                   WHERE NOT @schema@.bf4ps_name_ok(e.guid, 200)
                      OR (e.name IS NOT NULL AND length(e.name) > 500)
                      OR (e.slug IS NOT NULL AND length(e.slug) > 500)
                      OR (e.category IS NOT NULL AND length(e.category) > 500)
                      OR e.kills < 0 OR e.time_in_seconds < 0 OR e.destroy_x_in_y < 0)
           OR (SELECT count(*) <> count(DISTINCT e->>'guid')
               FROM jsonb_array_elements(p_data->'vehicles') AS e) THEN
            RAISE EXCEPTION 'a vehicle has no guid, a guid twice, an overlong text or a negative counter'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        PERFORM 1 FROM @schema@.bf4ps_locks WHERE lock_name = 'vehicle_catalog' FOR UPDATE;
        WITH e AS (
            SELECT x.* FROM jsonb_to_recordset(p_data->'vehicles') AS x(
                guid text, name text, slug text, category text, kills bigint,
                time_in_seconds bigint, destroy_x_in_y bigint)
        ), cat AS (
            INSERT INTO @schema@.vehicle_catalog AS k
                (vehicle_guid, name, slug, category, first_seen_at, last_seen_at)
            SELECT e.guid, coalesce(nullif(btrim(e.name), ''), nullif(btrim(e.slug), ''), e.guid),
                   e.slug, e.category, p_now, p_now
            FROM e ORDER BY e.guid
            ON CONFLICT (vehicle_guid) DO UPDATE
            SET name = EXCLUDED.name, slug = EXCLUDED.slug, category = EXCLUDED.category,
                last_seen_at = greatest(k.last_seen_at, EXCLUDED.last_seen_at)
            RETURNING k.vehicle_id, k.vehicle_guid
        )
        SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'vehicle_id', cat.vehicle_id, 'kills', coalesce(e.kills, 0),
                   'time_in_seconds', coalesce(e.time_in_seconds, 0),
                   'destroy_x_in_y', e.destroy_x_in_y)), '[]')
          INTO v_fresh
        FROM e JOIN cat ON cat.vehicle_guid = e.guid;
        WITH old AS (
            DELETE FROM @schema@.soldier_vehicle_stats AS w WHERE w.soldier_id = j.soldier_id
            RETURNING w.vehicle_id, w.kills, w.time_in_seconds, w.destroy_x_in_y
        ), fresh AS (
            SELECT f.* FROM jsonb_to_recordset(v_fresh) AS f(
                vehicle_id bigint, kills bigint, time_in_seconds bigint, destroy_x_in_y bigint)
        )
        SELECT EXISTS ((SELECT * FROM old EXCEPT SELECT * FROM fresh)
                       UNION ALL (SELECT * FROM fresh EXCEPT SELECT * FROM old))
          INTO v_changed;
        INSERT INTO @schema@.soldier_vehicle_stats
            (soldier_id, vehicle_id, kills, time_in_seconds, destroy_x_in_y,
             source_fetched_at, updated_at)
        SELECT j.soldier_id, f.vehicle_id, f.kills, f.time_in_seconds, f.destroy_x_in_y,
               p_now, p_now
        FROM jsonb_to_recordset(v_fresh) AS f(
            vehicle_id bigint, kills bigint, time_in_seconds bigint, destroy_x_in_y bigint);
    ELSE
        -- profile: the Battlelog account behind the soldier.
        -- The account is the soldier's: its user page was fetched by the
        -- soldier's current name (a lease never writes another account).
        IF lower(btrim(p_data->>'battlelog_username')) IS DISTINCT FROM lower(btrim(j.current_name)) THEN
            RAISE EXCEPTION 'a profile is the account of the job''s soldier (battlelog_username = its current name)'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF NOT @schema@.bf4ps_name_ok(p_data->>'battlelog_username', 200)
           OR (p_data->>'access_state') IS NULL
           OR (p_data->>'access_state') NOT IN ('public_country', 'public_no_country',
                                                'friends_only', 'not_found')
           OR (p_data->>'country_code') !~ '^[A-Z]{2}$'
           OR length(p_data->>'country_name') > 200 THEN
            RAISE EXCEPTION 'a profile has a username (1-200 characters), an access_state of public_country, public_no_country, friends_only or not_found, and an upper-case two-letter country_code if any'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT (b.country_code, b.country_name, b.access_state)
               IS DISTINCT FROM (p_data->>'country_code', p_data->>'country_name',
                                 p_data->>'access_state')
          INTO v_changed
        FROM @schema@.battlelog_profiles AS b
        WHERE lower(b.battlelog_username) = lower(btrim(p_data->>'battlelog_username'));
        v_changed := coalesce(v_changed, true);
        INSERT INTO @schema@.battlelog_profiles AS b
            (battlelog_username, battlelog_user_id, country_code, country_name, access_state,
             last_checked_at, last_success_at, last_error)
        VALUES (btrim(p_data->>'battlelog_username'), (p_data->>'battlelog_user_id')::bigint,
                p_data->>'country_code', p_data->>'country_name', p_data->>'access_state',
                p_now, p_now, NULL)
        ON CONFLICT ((lower(battlelog_username))) DO UPDATE
        SET battlelog_user_id = coalesce(EXCLUDED.battlelog_user_id, b.battlelog_user_id),
            country_code = EXCLUDED.country_code, country_name = EXCLUDED.country_name,
            access_state = EXCLUDED.access_state, last_checked_at = p_now,
            last_success_at = p_now, last_error = NULL, updated_at = p_now
        RETURNING b.profile_id INTO v_profile;
        INSERT INTO @schema@.profile_soldiers AS ps (profile_id, soldier_id, first_seen_at, last_seen_at)
        VALUES (v_profile, j.soldier_id, p_now, p_now)
        ON CONFLICT (profile_id, soldier_id) DO UPDATE SET last_seen_at = p_now;
        IF p_data->>'access_state' = 'not_found' THEN
            v_state := 'unavailable';
        END IF;
    END IF;

    SELECT CASE j.resource WHEN 'detailed' THEN s.refresh_detailed
                           WHEN 'profile' THEN s.refresh_profile
                           WHEN 'weapons' THEN s.refresh_weapons
                           ELSE s.refresh_vehicles END
      INTO v_cadence
    FROM @schema@.scheduling_settings AS s;
    SELECT CASE j.resource WHEN 'detailed' THEN st.detailed_last_success_at
                           WHEN 'profile' THEN st.profile_last_success_at
                           WHEN 'weapons' THEN st.weapons_last_success_at
                           ELSE st.vehicles_last_success_at END
      INTO v_prev
    FROM @schema@.collection_state AS st WHERE st.soldier_id = j.soldier_id;
    v_next := CASE WHEN v_state = 'success' THEN p_now + v_cadence END;
    PERFORM @schema@.bf4ps_record_outcome(j.soldier_id, j.resource, v_state, true, v_next, 0,
                                          NULL, NULL, p_now);

    INSERT INTO @schema@.collection_events
        (occurred_at, collector_uuid, collector_name_snapshot, hostname_snapshot,
         egress_key_snapshot, job_id, soldier_id, persona_id, platform, resource, lane,
         event_type, attempt_number, lease_token, result, duration_ms, http_status, metadata)
    VALUES (p_now, p_uuid, j.collector_name, j.hostname, j.egress_key, j.job_id, j.soldier_id,
            j.persona_id, j.platform, j.resource, j.lane, 'succeeded', j.attempt_count,
            p_lease_token, CASE WHEN v_changed THEN 'changed' ELSE 'unchanged' END,
            p_duration_ms, p_http_status,
            jsonb_build_object('previous_success_at', @schema@.bf4ps_sane_time(v_prev),
                               'changed', v_changed, 'history_appended', v_hist));
    UPDATE @schema@.collectors AS c SET current_job_id = NULL, updated_at = p_now
    WHERE c.collector_uuid = p_uuid AND c.current_job_id = p_job_id;
    DELETE FROM @schema@.collection_jobs AS x WHERE x.job_id = p_job_id;
    -- Battlelog answered on this key: its throttle streak ends, unless a pause
    -- is still running (this answer was in flight before it began).
    UPDATE @schema@.egress_gates AS g SET throttle_streak = 0, updated_at = p_now
    WHERE g.egress_key = j.egress_key AND g.throttle_streak > 0
      AND (g.paused_until IS NULL OR g.paused_until <= p_now);

    changed := v_changed;
    history_appended := v_hist;
    previous_success_at := @schema@.bf4ps_sane_time(v_prev);
    next_due_at := v_next;
    RETURN NEXT;
END;
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
-- The collector's successful finalization (bf4ps_succeed_job on the
-- database's clock) for the incarnation holding `p_secret`.
CREATE FUNCTION @schema@.bf4ps_collector_succeed(
    p_uuid uuid, p_secret uuid, p_job_id bigint, p_lease_token uuid,
    p_data jsonb, p_duration_ms bigint, p_http_status integer)
RETURNS TABLE (
    changed boolean,
    history_appended boolean,
    previous_success_at timestamptz,
    next_due_at timestamptz
)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    PERFORM @schema@.bf4ps_collector_check_secret(p_uuid, p_secret);
    RETURN QUERY SELECT * FROM @schema@.bf4ps_succeed_job(
        p_uuid, p_job_id, p_lease_token, p_data, p_duration_ms, p_http_status, now());
END;
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
-- Failure finalization for the unexpired running lease of incarnation
-- `p_uuid` as of `p_now` (no row: the lease is lost, nothing written;
-- bf4ps_collector_fail: the database's clock). Never touches gameplay data. The pair's
-- collection_state columns become what BF4PS's scheduler expects:
--   throttled    the caller's egress key pauses (for throttle_pause, doubling
--                while throttling continues, up to throttle_pause_max; a pause
--                already running is kept); the job is pending again from the
--                pause's end plus jitter and the attempt does not count;
--                temporary_failure, due again then;
--   unavailable  the persona does not exist: unavailable, out of the retry
--                loop (no due time), the job removed;
--   other        temporary_failure, the failure count and class, and the
--                retry time: the retry ladder's step for this failure in a
--                row (+-retry_jitter); the job pending again then, or, past
--                retry_max_attempts, removed (the feeder brings the pair back
--                when it is due).
-- Events: `failed` (+ `retry_scheduled` when the job waits). Bad input is
-- refused (SQLSTATE 22023), writing nothing.
CREATE FUNCTION @schema@.bf4ps_fail_job(
    p_uuid uuid, p_job_id bigint, p_lease_token uuid,
    p_error_class text, p_http_status integer, p_message text, p_duration_ms bigint,
    p_now timestamptz)
RETURNS TABLE (
    outcome text,
    eligible_at timestamptz,
    next_due_at timestamptz,
    paused_until timestamptz
)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    j record;
    s record;
    v_message text;
    v_failures integer;
    v_attempts integer;
    v_delay interval;
    v_paused timestamptz;
    v_eligible timestamptz;
    v_next timestamptz;
    v_outcome text;
    v_retry boolean;
BEGIN
    IF p_error_class IS NULL OR p_error_class NOT IN
           ('transport', 'timeout', 'server', 'parse', 'throttled', 'http', 'unavailable') THEN
        RAISE EXCEPTION 'unknown error class % (expected transport, timeout, server, parse, throttled, http or unavailable)',
                coalesce(quote_literal(left(p_error_class, 40)), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_http_status IS NOT NULL AND (p_http_status < 100 OR p_http_status > 599) THEN
        RAISE EXCEPTION 'http_status must be 100-599 (got %)', p_http_status
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_duration_ms IS NULL OR p_duration_ms < 0 OR p_duration_ms > 86400000 THEN
        RAISE EXCEPTION 'duration_ms must be 0-86400000 (got %)', coalesce(p_duration_ms::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_message := regexp_replace(left(coalesce(p_message, ''), 500),
                                '[\x01-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]', ' ', 'g');

    SELECT x.job_id, x.soldier_id, so.persona_id, so.platform, x.resource, x.lane,
           x.attempt_count, x.throttled_attempts, c.collector_name, c.hostname, c.egress_key,
           CASE x.resource WHEN 'detailed' THEN st.detailed_consecutive_failures
                           WHEN 'profile' THEN st.profile_consecutive_failures
                           WHEN 'weapons' THEN st.weapons_consecutive_failures
                           ELSE st.vehicles_consecutive_failures END AS failures
      INTO j
    FROM @schema@.collection_jobs AS x
    JOIN @schema@.soldiers AS so ON so.soldier_id = x.soldier_id
    JOIN @schema@.collectors AS c ON c.collector_uuid = x.collector_uuid
    LEFT JOIN @schema@.collection_state AS st ON st.soldier_id = x.soldier_id
    WHERE x.job_id = p_job_id AND x.collector_uuid = p_uuid AND x.lease_token = p_lease_token
      AND x.status = 'running' AND x.lease_expires_at > p_now
    FOR UPDATE OF x;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT x.throttle_pause, x.throttle_pause_max, x.retry_ladder, x.retry_jitter,
           x.retry_max_attempts
      INTO s
    FROM @schema@.scheduling_settings AS x;
    v_failures := least(coalesce(j.failures, 0), 1000000) + 1;

    IF p_error_class = 'throttled' THEN
        -- The whole key pauses (every collector on it), unless a pause is
        -- running already: this answer was in flight before it began.
        INSERT INTO @schema@.egress_gates AS g (egress_key, next_slot_at, paused_until, throttle_streak)
        VALUES (j.egress_key, p_now, p_now + s.throttle_pause, 1)
        ON CONFLICT (egress_key) DO UPDATE
        SET paused_until = CASE
                WHEN g.paused_until > p_now THEN g.paused_until
                ELSE p_now + least(s.throttle_pause * power(2, least(g.throttle_streak, 30)),
                                   s.throttle_pause_max) END,
            throttle_streak = CASE
                WHEN g.paused_until > p_now THEN g.throttle_streak
                ELSE least(g.throttle_streak + 1, 1000) END,
            updated_at = p_now
        RETURNING g.paused_until INTO v_paused;
        -- After the pause, spread out (the whole key's jobs wait for it).
        v_delay := least(v_paused - p_now, interval '1 day') * (1 + random() * s.retry_jitter);
        v_retry := true;
        v_outcome := 'throttled';
    ELSIF p_error_class = 'unavailable' THEN
        v_retry := false;
        v_outcome := 'unavailable';
    ELSE
        v_attempts := j.attempt_count - j.throttled_attempts;
        v_delay := s.retry_ladder[least(v_failures, cardinality(s.retry_ladder))]
                   * (1 + (random() * 2 - 1) * s.retry_jitter);
        v_retry := v_attempts < s.retry_max_attempts;
        v_outcome := CASE WHEN v_retry THEN 'retry_scheduled' ELSE 'gave_up' END;
    END IF;
    v_next := CASE WHEN p_error_class = 'unavailable' THEN NULL ELSE p_now + v_delay END;

    PERFORM @schema@.bf4ps_record_outcome(
        j.soldier_id, j.resource,
        CASE WHEN p_error_class = 'unavailable' THEN 'unavailable' ELSE 'temporary_failure' END,
        false, v_next, v_failures, p_error_class, v_message, p_now);

    IF v_retry THEN
        UPDATE @schema@.collection_jobs AS x
        SET status = 'pending', collector_uuid = NULL, lease_token = NULL,
            claimed_at = NULL, started_at = NULL, lease_expires_at = NULL,
            eligible_at = v_next,
            throttled_attempts = x.throttled_attempts
                                 + CASE WHEN p_error_class = 'throttled' THEN 1 ELSE 0 END,
            last_error_class = p_error_class, last_error_at = p_now, updated_at = p_now
        WHERE x.job_id = p_job_id;
        v_eligible := v_next;
    ELSE
        DELETE FROM @schema@.collection_jobs AS x WHERE x.job_id = p_job_id;
    END IF;
    UPDATE @schema@.collectors AS c SET current_job_id = NULL, updated_at = p_now
    WHERE c.collector_uuid = p_uuid AND c.current_job_id = p_job_id;

    INSERT INTO @schema@.collection_events
        (occurred_at, collector_uuid, collector_name_snapshot, hostname_snapshot,
         egress_key_snapshot, job_id, soldier_id, persona_id, platform, resource, lane,
         event_type, attempt_number, lease_token, result, duration_ms, http_status,
         error_class, error_message, metadata)
    SELECT p_now, p_uuid, j.collector_name, j.hostname, j.egress_key, j.job_id, j.soldier_id,
           j.persona_id, j.platform, j.resource, j.lane, e.event_type, j.attempt_count,
           p_lease_token, e.result, e.duration_ms, e.http_status, e.error_class, e.error_message,
           e.metadata
    FROM (VALUES
        (1, 'failed',
            CASE WHEN v_retry THEN 'retry' ELSE v_outcome END,
            p_duration_ms, p_http_status, p_error_class, v_message,
            jsonb_build_object('next_due_at', v_next, 'consecutive_failures', v_failures)),
        (2, 'retry_scheduled', NULL, NULL, NULL, NULL, NULL,
            jsonb_build_object('delay_ms', floor(extract(epoch FROM v_delay) * 1000),
                               'eligible_at', v_eligible)
            || CASE WHEN v_paused IS NULL THEN '{}'::jsonb
                    ELSE jsonb_build_object('egress_paused_until', v_paused) END)
    ) AS e(ord, event_type, result, duration_ms, http_status, error_class, error_message,
           metadata)
    WHERE e.ord = 1 OR v_retry
    ORDER BY e.ord;

    outcome := v_outcome;
    eligible_at := v_eligible;
    next_due_at := v_next;
    paused_until := v_paused;
    RETURN NEXT;
END;
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
-- The collector's failure finalization (bf4ps_fail_job on the database's
-- clock) for the incarnation holding `p_secret`.
CREATE FUNCTION @schema@.bf4ps_collector_fail(
    p_uuid uuid, p_secret uuid, p_job_id bigint, p_lease_token uuid,
    p_error_class text, p_http_status integer, p_message text, p_duration_ms bigint)
RETURNS TABLE (
    outcome text,
    eligible_at timestamptz,
    next_due_at timestamptz,
    paused_until timestamptz
)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    PERFORM @schema@.bf4ps_collector_check_secret(p_uuid, p_secret);
    RETURN QUERY SELECT * FROM @schema@.bf4ps_fail_job(
        p_uuid, p_job_id, p_lease_token, p_error_class, p_http_status, p_message, p_duration_ms,
        now());
END;
$$;
$body$);

-- ---------------------------------------------------------------------------
-- The website's entry point.
-- ---------------------------------------------------------------------------

SELECT pg_temp.bf4ps_define($body$
-- Interactive refresh of one soldier, for the website (inside its own
-- transaction) and `bf4ps-ops request` (0004, 0006; now on BF4PS's tables).
--
-- The soldier is written as BF4PS writes a manual submission: an unknown one
-- is created with `soldier_name` (required for it: the website passes the
-- name from the Battlelog soldier URL; SQLSTATE 22023 without one) as
-- current_name, first and last seen now, a soldier_names row and source
-- 'manual'; a known one gets its 'manual' source row refreshed (and, with a
-- name, the name recorded as its latest observation). Its default
-- collection_state row is created if missing. Then per requested resource
-- (canonical order detailed, profile, weapons, vehicles):
--   * no live job         -> a new interactive job, `created`  (state 'created')
--   * pending background  -> promoted to the interactive lane and class,
--                            eligible now, `promoted`            (state 'promoted')
--   * pending interactive -> left alone                          (state 'pending')
--   * claimed / running   -> left alone                          (state 'claimed' | 'running')
-- Calling it again changes nothing. New and promoted jobs wake interactive
-- collectors when the caller commits.
--
-- Admission: a call that added pending interactive jobs takes the row lock
-- bf4ps_locks 'interactive_admission' (no role but ours can hold it) and
-- counts the pending interactive jobs; beyond
-- scheduling_settings.max_pending_interactive it raises SQLSTATE 53400 and
-- nothing it wrote survives. Concurrent admissions are serialized from that
-- count until the caller commits (call it in a short transaction); a call
-- waits at most 2 s for the lock, then fails with SQLSTATE 55P03
-- (lock_not_available), writing nothing.
--
-- position / eta_seconds: as 0004 (1-based place among pending interactive
-- jobs in claim order, 0 for claimed/running; the ETA of bf4ps_eta_seconds).
-- Errors (22023): unknown platform or resource, empty resource list,
-- persona_id <= 0, a bad eta_window/egress_rate, a bad or missing name.
-- SECURITY DEFINER: the website's role needs only EXECUTE.
CREATE FUNCTION @schema@.bf4ps_request_refresh(
    platform text,
    persona_id bigint,
    resources text[] DEFAULT ARRAY['detailed', 'profile', 'weapons', 'vehicles'],
    eta_window interval DEFAULT NULL,
    egress_rate double precision DEFAULT NULL,
    soldier_name text DEFAULT NULL
) RETURNS TABLE (
    resource text,
    job_id bigint,
    state text,
    "position" bigint,
    eta_seconds double precision
)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    all_resources constant text[] := ARRAY['detailed', 'profile', 'weapons', 'vehicles'];
    v_platform text := bf4ps_request_refresh.platform;
    v_persona bigint := bf4ps_request_refresh.persona_id;
    v_name text := btrim(bf4ps_request_refresh.soldier_name);
    v_window interval;
    v_rate double precision;
    v_cap integer;
    v_wanted text[];
    v_bad text;
    v_soldier bigint;
    v_resource text;
    v_job bigint;
    v_status text;
    v_lane text;
    v_class text;
    v_attempts integer;
    v_state text;
    v_settled boolean;
    v_jobs bigint[] := ARRAY[]::bigint[];
    v_states text[] := ARRAY[]::text[];
    v_admitted integer := 0;
    v_pending bigint;
    v_collectors integer;
    v_egress_keys integer;
    v_mean double precision;
    v_lock_timeout text;
    i integer;
BEGIN
    IF v_platform IS NULL OR NOT (v_platform = ANY (ARRAY['pc', 'ps4', 'xboxone'])) THEN
        RAISE EXCEPTION 'unknown platform % (expected one of: pc, ps4, xboxone)',
                coalesce('"' || left(v_platform, 40) || '"', 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_persona IS NULL OR v_persona <= 0 THEN
        RAISE EXCEPTION 'persona_id must be a positive integer (got %)',
                coalesce(v_persona::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF bf4ps_request_refresh.soldier_name IS NOT NULL
       AND NOT @schema@.bf4ps_name_ok(bf4ps_request_refresh.soldier_name, 200) THEN
        RAISE EXCEPTION 'soldier_name must be 1-200 characters without control characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF bf4ps_request_refresh.resources IS NULL
       OR cardinality(bf4ps_request_refresh.resources) = 0 THEN
        RAISE EXCEPTION 'no resources requested (expected one or more of: detailed, profile, weapons, vehicles)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT r INTO v_bad
    FROM unnest(bf4ps_request_refresh.resources) AS r
    WHERE r IS NULL OR NOT (r = ANY (all_resources))
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'unknown resource % (expected one of: detailed, profile, weapons, vehicles)',
                coalesce('"' || left(v_bad, 40) || '"', 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT array_agg(r ORDER BY array_position(all_resources, r)) INTO v_wanted
    FROM (SELECT DISTINCT r FROM unnest(bf4ps_request_refresh.resources) AS r) AS d;

    SELECT coalesce(bf4ps_request_refresh.eta_window, s.eta_window),
           coalesce(bf4ps_request_refresh.egress_rate, s.egress_rate),
           s.max_pending_interactive
      INTO v_window, v_rate, v_cap
    FROM @schema@.scheduling_settings AS s;
    v_window := coalesce(v_window, interval '15 minutes');
    v_rate := coalesce(v_rate, 0.2);
    v_cap := coalesce(v_cap, 1000);
    IF v_window <= interval '0' OR NOT isfinite(v_window) THEN
        RAISE EXCEPTION 'eta_window must be positive and finite (got %)', v_window
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT (v_rate > 0 AND v_rate < 'Infinity'::double precision) THEN
        RAISE EXCEPTION 'egress_rate must be a finite number > 0 (got %)', v_rate
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- The soldier, as BF4PS writes a manual submission.
    SELECT s.soldier_id INTO v_soldier
    FROM @schema@.soldiers AS s
    WHERE s.persona_id = v_persona AND s.platform = v_platform;
    IF v_soldier IS NULL AND v_name IS NULL THEN
        RAISE EXCEPTION 'soldier %/% is not known yet: pass its name (soldier_name)',
                v_platform, v_persona
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_name IS NOT NULL THEN
        INSERT INTO @schema@.soldiers AS s
            (persona_id, platform, current_name, first_seen_at, last_seen_at)
        VALUES (v_persona, v_platform, v_name, now(), now())
        ON CONFLICT (persona_id, platform) DO UPDATE
        SET current_name = CASE WHEN EXCLUDED.last_seen_at >= s.last_seen_at
                                THEN EXCLUDED.current_name ELSE s.current_name END,
            first_seen_at = least(s.first_seen_at, EXCLUDED.first_seen_at),
            last_seen_at = greatest(s.last_seen_at, EXCLUDED.last_seen_at),
            updated_at = now()
        RETURNING s.soldier_id INTO v_soldier;
        INSERT INTO @schema@.soldier_names AS n (soldier_id, name, first_seen_at, last_seen_at)
        VALUES (v_soldier, v_name, now(), now())
        ON CONFLICT (soldier_id, name) DO UPDATE
        SET first_seen_at = least(n.first_seen_at, EXCLUDED.first_seen_at),
            last_seen_at = greatest(n.last_seen_at, EXCLUDED.last_seen_at);
    ELSE
        UPDATE @schema@.soldiers AS s
        SET last_seen_at = greatest(s.last_seen_at, now()), updated_at = now()
        WHERE s.soldier_id = v_soldier;
    END IF;
    INSERT INTO @schema@.soldier_sources AS o (soldier_id, source_type, first_seen_at, last_seen_at)
    VALUES (v_soldier, 'manual', now(), now())
    ON CONFLICT (soldier_id, source_type) DO UPDATE
    SET first_seen_at = least(o.first_seen_at, EXCLUDED.first_seen_at),
        last_seen_at = greatest(o.last_seen_at, EXCLUDED.last_seen_at);
    INSERT INTO @schema@.collection_state (soldier_id) VALUES (v_soldier)
    ON CONFLICT (soldier_id) DO NOTHING;

    -- One job per resource. A job can be finalized (deleted) or fed between
    -- our statements; each pass re-reads and settles within a few tries.
    FOREACH v_resource IN ARRAY v_wanted LOOP
        v_settled := false;
        FOR attempt IN 1..5 LOOP
            SELECT j.job_id, j.status, j.lane, j.priority_class, j.attempt_count
              INTO v_job, v_status, v_lane, v_class, v_attempts
            FROM @schema@.collection_jobs AS j
            WHERE j.soldier_id = v_soldier AND j.resource = v_resource;

            IF NOT FOUND THEN
                INSERT INTO @schema@.collection_jobs AS j
                    (soldier_id, resource, lane, priority_class, reason, priority_value)
                VALUES (v_soldier, v_resource, 'interactive', 'interactive', 'requested', 0)
                ON CONFLICT (soldier_id, resource) DO NOTHING
                RETURNING j.job_id, j.attempt_count INTO v_job, v_attempts;
                IF v_job IS NOT NULL THEN
                    INSERT INTO @schema@.collection_events
                        (job_id, soldier_id, persona_id, platform, resource, lane,
                         event_type, attempt_number, metadata)
                    VALUES (v_job, v_soldier, v_persona, v_platform, v_resource, 'interactive',
                            'created', v_attempts,
                            jsonb_build_object('priority_class', 'interactive',
                                               'reason', 'requested'));
                    v_state := 'created';
                    v_admitted := v_admitted + 1;
                    v_settled := true;
                END IF;
            ELSIF v_status = 'pending' AND v_lane = 'background' THEN
                UPDATE @schema@.collection_jobs AS j
                SET lane = 'interactive',
                    priority_class = 'interactive',
                    reason = 'requested',
                    priority_value = 0,
                    eligible_at = now(),
                    updated_at = now()
                WHERE j.job_id = v_job AND j.status = 'pending' AND j.lane = 'background'
                RETURNING j.attempt_count INTO v_attempts;
                IF FOUND THEN
                    INSERT INTO @schema@.collection_events
                        (job_id, soldier_id, persona_id, platform, resource, lane,
                         event_type, attempt_number, metadata)
                    VALUES (v_job, v_soldier, v_persona, v_platform, v_resource, 'interactive',
                            'promoted', v_attempts,
                            jsonb_build_object('from_lane', 'background',
                                               'from_priority_class', v_class,
                                               'reason', 'requested'));
                    v_state := 'promoted';
                    v_admitted := v_admitted + 1;
                    v_settled := true;
                END IF;
            ELSE
                -- pending interactive, or claimed/running in either lane.
                v_state := v_status;
                v_settled := true;
            END IF;
            EXIT WHEN v_settled;
        END LOOP;
        IF NOT v_settled THEN
            RAISE EXCEPTION 'the % job of soldier % kept changing under the request; retry',
                    v_resource, v_soldier
                USING ERRCODE = 'serialization_failure';
        END IF;
        v_jobs := v_jobs || v_job;
        v_states := v_states || v_state;
    END LOOP;

    -- Admission: every call that added pending interactive jobs counts them
    -- under one row lock held until its caller commits, so concurrent
    -- callers see each other's admissions and the cap is exact.
    IF v_admitted > 0 THEN
        v_lock_timeout := current_setting('lock_timeout');
        PERFORM set_config('lock_timeout', '2s', true);
        PERFORM 1 FROM @schema@.bf4ps_locks AS l
        WHERE l.lock_name = 'interactive_admission' FOR UPDATE;
        PERFORM set_config('lock_timeout', v_lock_timeout, true);
        SELECT count(*) INTO v_pending
        FROM (SELECT 1 FROM @schema@.collection_jobs AS j
              WHERE j.lane = 'interactive' AND j.status = 'pending'
              LIMIT v_cap::bigint + 1) AS p;
        IF v_pending > v_cap THEN
            RAISE EXCEPTION 'too many pending interactive refreshes: the limit is % (scheduling_settings.max_pending_interactive); nothing was queued',
                    v_cap
                USING ERRCODE = 'configuration_limit_exceeded',
                      HINT = 'retry after a while; operators raise the limit with BF4PS_MAX_PENDING_INTERACTIVE';
        END IF;
    END IF;

    -- ETA inputs, once per call.
    SELECT count(*)::integer, count(DISTINCT c.egress_key)::integer
      INTO v_collectors, v_egress_keys
    FROM @schema@.collectors AS c
    WHERE c.lane = 'interactive'
      AND c.retired_at IS NULL
      AND c.enabled
      AND NOT c.drained
      AND c.heartbeat_state = 'healthy';
    SELECT avg(e.duration_ms) / 1000.0 INTO v_mean
    FROM (
        SELECT e.duration_ms
        FROM @schema@.collection_events AS e
        WHERE e.lane = 'interactive'
          AND e.event_type IN ('succeeded', 'failed')
          AND e.occurred_at > now() - v_window
          AND e.duration_ms IS NOT NULL
        ORDER BY e.occurred_at DESC
        LIMIT 1000
    ) AS e;

    FOR i IN 1 .. cardinality(v_wanted) LOOP
        resource := v_wanted[i];
        job_id := v_jobs[i];
        state := v_states[i];
        IF state IN ('claimed', 'running') THEN
            "position" := 0;
            eta_seconds := @schema@.bf4ps_eta_seconds(0, 1, v_mean, NULL);
        ELSE
            SELECT count(*) INTO "position"
            FROM @schema@.collection_jobs AS me, @schema@.collection_jobs AS o
            WHERE me.job_id = v_jobs[i]
              AND o.lane = 'interactive'
              AND o.status = 'pending'
              AND (CASE o.priority_class WHEN 'interactive' THEN 1 WHEN 'active' THEN 2
                                         WHEN 'recent' THEN 3 WHEN 'bootstrap' THEN 4 END,
                   -o.priority_value::bigint, o.eligible_at, o.created_at, o.job_id)
                  <= (CASE me.priority_class WHEN 'interactive' THEN 1 WHEN 'active' THEN 2
                                             WHEN 'recent' THEN 3 WHEN 'bootstrap' THEN 4 END,
                      -me.priority_value::bigint, me.eligible_at, me.created_at, me.job_id);
            eta_seconds := @schema@.bf4ps_eta_seconds("position", v_collectors, v_mean,
                                                      v_rate * greatest(v_egress_keys, 1));
            IF eta_seconds IS NOT NULL THEN
                SELECT greatest(eta_seconds,
                                CASE WHEN j.eligible_at <= now() THEN 0
                                     WHEN j.eligible_at > now() + interval '100 years' THEN 3.2e9
                                     ELSE extract(epoch FROM (j.eligible_at - now()))::double precision
                                END)
                  INTO eta_seconds
                FROM @schema@.collection_jobs AS j
                WHERE j.job_id = v_jobs[i];
            END IF;
        END IF;
        RETURN NEXT;
    END LOOP;
END;
$fn$;
$body$);

-- ---------------------------------------------------------------------------
-- Ownership and what each role may do. The same on every database: first
-- everything of ours is revoked from the groups, then granted.
-- ---------------------------------------------------------------------------

DO $owners$
DECLARE
    s text := (SELECT quote_ident(n.nspname)
               FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
               WHERE c.oid = 'collection_jobs'::regclass);
    f text;
BEGIN
    -- bf4ps_definer needs CREATE on the schema only while it is handed the
    -- functions.
    EXECUTE format('GRANT USAGE, CREATE ON SCHEMA %s TO bf4ps_definer', s);
    FOREACH f IN ARRAY ARRAY[
        'bf4ps_collector_check_secret(uuid, uuid)',
        'bf4ps_collector_register(text, text, text, text, text)',
        'bf4ps_collector_heartbeat(uuid, uuid)',
        'bf4ps_collector_stopped(uuid, uuid)',
        'bf4ps_collector_egress_pass(uuid, uuid)',
        'bf4ps_collector_claim(uuid, uuid, integer, boolean)',
        'bf4ps_collector_start(uuid, uuid, bigint, uuid)',
        'bf4ps_collector_renew(uuid, uuid, bigint, uuid)',
        'bf4ps_collector_next_eligible(uuid, uuid)',
        'bf4ps_collector_succeed(uuid, uuid, bigint, uuid, jsonb, bigint, integer)',
        'bf4ps_collector_fail(uuid, uuid, bigint, uuid, text, integer, text, bigint)',
        'bf4ps_request_refresh(text, bigint, text[], interval, double precision, text)',
        'bf4ps_freshness_inserted()',
        'bf4ps_freshness_deleted()',
        'bf4ps_freshness_moved()',
        'bf4ps_freshness_truncated()']
    LOOP
        EXECUTE format('ALTER FUNCTION %s.%s OWNER TO bf4ps_definer', s, f);
        EXECUTE format('REVOKE ALL ON FUNCTION %s.%s FROM PUBLIC', s, f);
    END LOOP;
    EXECUTE format('REVOKE CREATE ON SCHEMA %s FROM bf4ps_definer', s);
    EXECUTE format('GRANT USAGE ON SCHEMA %s TO bf4ps_collector, bf4ps_website, bf4ps_reader', s);
END
$owners$;

-- (BF4PS's alembic_version is not ours: left as it is.)
DO $revoke$
DECLARE
    t text;
BEGIN
    FOR t IN SELECT c.relname FROM pg_catalog.pg_class c
             WHERE c.relnamespace = (SELECT relnamespace FROM pg_catalog.pg_class
                                     WHERE oid = 'collection_jobs'::regclass)
               AND c.relkind = 'r' AND c.relname <> 'alembic_version'
             ORDER BY c.relname
    LOOP
        EXECUTE format('REVOKE ALL ON %I FROM bf4ps_definer, bf4ps_collector, bf4ps_website, bf4ps_reader', t);
    END LOOP;
END
$revoke$;

-- bf4ps_definer: exactly what the function bodies touch.
GRANT SELECT, INSERT, UPDATE ON soldiers, soldier_names, soldier_sources TO bf4ps_definer;
GRANT SELECT, INSERT, UPDATE ON collection_state TO bf4ps_definer;
GRANT SELECT, INSERT, UPDATE, DELETE ON collection_jobs TO bf4ps_definer;
GRANT SELECT, INSERT ON collection_events TO bf4ps_definer;
GRANT SELECT, INSERT, UPDATE ON collectors TO bf4ps_definer;
GRANT SELECT, INSERT ON collector_secrets TO bf4ps_definer;
GRANT SELECT ON scheduling_settings TO bf4ps_definer;
GRANT SELECT, INSERT, UPDATE ON egress_gates, egress_budget TO bf4ps_definer;
GRANT SELECT, UPDATE ON bf4ps_locks TO bf4ps_definer;
GRANT SELECT, INSERT, DELETE ON freshness_deltas, freshness_rollup, freshness_bands TO bf4ps_definer;
GRANT SELECT, INSERT, UPDATE ON detailed_stats_current TO bf4ps_definer;
GRANT SELECT, INSERT ON detailed_stats_history TO bf4ps_definer;
GRANT SELECT, INSERT, UPDATE ON weapon_catalog, vehicle_catalog TO bf4ps_definer;
GRANT SELECT, INSERT, DELETE ON soldier_weapon_stats, soldier_vehicle_stats TO bf4ps_definer;
GRANT SELECT, INSERT, UPDATE ON battlelog_profiles, profile_soldiers TO bf4ps_definer;
GRANT SELECT, INSERT, UPDATE, DELETE ON budget_usage TO bf4ps_definer;
GRANT EXECUTE ON FUNCTION bf4ps_collector_check_secret(uuid, uuid) TO bf4ps_definer;

-- The cores the definer functions call with the database's clock (and the
-- scheduling simulation with its own): not callable by collectors, the
-- website or readers.
REVOKE ALL ON FUNCTION
    bf4ps_egress_grant(text, boolean, timestamptz),
    bf4ps_claim_job(uuid, boolean, timestamptz),
    bf4ps_succeed_job(uuid, bigint, uuid, jsonb, bigint, integer, timestamptz),
    bf4ps_fail_job(uuid, bigint, uuid, text, integer, text, bigint, timestamptz),
    bf4ps_record_outcome(bigint, text, text, boolean, timestamptz, integer, text, text,
                         timestamptz)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    bf4ps_egress_grant(text, boolean, timestamptz),
    bf4ps_claim_job(uuid, boolean, timestamptz),
    bf4ps_succeed_job(uuid, bigint, uuid, jsonb, bigint, integer, timestamptz),
    bf4ps_fail_job(uuid, bigint, uuid, text, integer, text, bigint, timestamptz),
    bf4ps_record_outcome(bigint, text, text, boolean, timestamptz, integer, text, text,
                         timestamptz)
    TO bf4ps_definer;

-- bf4ps_website: the entry point, nothing else.
GRANT EXECUTE ON FUNCTION bf4ps_request_refresh(text, bigint, text[], interval, double precision, text)
    TO bf4ps_website;

-- bf4ps_collector: the interface functions; no INSERT, UPDATE or DELETE on
-- any table, and no SELECT but on the migrations (to check it is current).
GRANT EXECUTE ON FUNCTION
    bf4ps_collector_register(text, text, text, text, text),
    bf4ps_collector_heartbeat(uuid, uuid),
    bf4ps_collector_stopped(uuid, uuid),
    bf4ps_collector_egress_pass(uuid, uuid),
    bf4ps_collector_claim(uuid, uuid, integer, boolean),
    bf4ps_collector_start(uuid, uuid, bigint, uuid),
    bf4ps_collector_renew(uuid, uuid, bigint, uuid),
    bf4ps_collector_next_eligible(uuid, uuid),
    bf4ps_collector_succeed(uuid, uuid, bigint, uuid, jsonb, bigint, integer),
    bf4ps_collector_fail(uuid, uuid, bigint, uuid, text, integer, text, bigint)
    TO bf4ps_collector;
GRANT SELECT ON _sqlx_migrations TO bf4ps_collector;

-- bf4ps_reader: every table but the secrets and the locks, read only
-- (BF4PS's alembic_version is left as it is).
DO $reader$
DECLARE
    t text;
BEGIN
    FOR t IN SELECT c.relname FROM pg_catalog.pg_class c
             WHERE c.relnamespace = (SELECT relnamespace FROM pg_catalog.pg_class
                                     WHERE oid = 'collection_jobs'::regclass)
               AND c.relkind = 'r'
               AND c.relname NOT IN ('collector_secrets', 'bf4ps_locks', 'alembic_version')
             ORDER BY c.relname
    LOOP
        EXECUTE format('GRANT SELECT ON %I TO bf4ps_reader', t);
    END LOOP;
END
$reader$;

-- ---------------------------------------------------------------------------
-- The triggers, last: creating one takes a SHARE ROW EXCLUSIVE lock on its
-- table (BF4PS's discovery's writes wait for it) until this migration
-- commits, so they come after every function definition and are held only
-- for the rollup's fill and the commit.
-- ---------------------------------------------------------------------------

CREATE TRIGGER trg_collection_jobs_notify_insert
    AFTER INSERT ON collection_jobs
    REFERENCING NEW TABLE AS bf4ps_new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION bf4ps_notify_jobs_claimable();

-- The row became pending and eligible now (returned to pending, promoted,
-- or its backoff cut short). Row level with a WHEN: claims, starts and
-- renewals never call PL/pgSQL.
CREATE TRIGGER trg_collection_jobs_notify_claimable
    AFTER UPDATE ON collection_jobs
    FOR EACH ROW
    WHEN (NEW.status = 'pending' AND NEW.eligible_at <= now()
          AND (OLD.status <> 'pending' OR OLD.lane <> NEW.lane OR OLD.eligible_at > now()))
    EXECUTE FUNCTION bf4ps_notify_job_claimable();

-- bf4ps.notify_events: 'off' never notifies, 'all' every insert, anything
-- else ('outcomes', the default) every event but claimed/started.
CREATE TRIGGER trg_collection_events_notify
    AFTER INSERT ON collection_events
    FOR EACH ROW
    WHEN (coalesce(current_setting('bf4ps.notify_events', true), '') = 'all'
          OR (coalesce(current_setting('bf4ps.notify_events', true), '') <> 'off'
              AND NEW.event_type NOT IN ('claimed', 'started')))
    EXECUTE FUNCTION bf4ps_notify_event();

CREATE TRIGGER trg_collection_state_freshness_insert
    AFTER INSERT ON collection_state
    REFERENCING NEW TABLE AS bf4ps_new_state
    FOR EACH STATEMENT EXECUTE FUNCTION bf4ps_freshness_inserted();

CREATE TRIGGER trg_collection_state_freshness_delete
    AFTER DELETE ON collection_state
    REFERENCING OLD TABLE AS bf4ps_old_state
    FOR EACH STATEMENT EXECUTE FUNCTION bf4ps_freshness_deleted();

CREATE TRIGGER trg_collection_state_freshness_update
    AFTER UPDATE ON collection_state
    FOR EACH ROW
    WHEN (OLD.detailed_last_success_at IS DISTINCT FROM NEW.detailed_last_success_at
          OR OLD.profile_last_success_at IS DISTINCT FROM NEW.profile_last_success_at
          OR OLD.weapons_last_success_at IS DISTINCT FROM NEW.weapons_last_success_at
          OR OLD.vehicles_last_success_at IS DISTINCT FROM NEW.vehicles_last_success_at)
    EXECUTE FUNCTION bf4ps_freshness_moved();

CREATE TRIGGER trg_collection_state_freshness_truncate
    AFTER TRUNCATE ON collection_state
    FOR EACH STATEMENT EXECUTE FUNCTION bf4ps_freshness_truncated();

-- The rollup from the rows as they are now (the triggers above already hold
-- collection_state against writers until this migration commits, so nothing
-- slips between the fill and the first delta). 0.1's rollup counted the same
-- pairs; it is rebuilt all the same, from BF4PS's columns.
DELETE FROM freshness_deltas;
DELETE FROM freshness_bands;
DELETE FROM freshness_rollup;
-- The 5-minute slot is bf4ps_freshness_slot's body, inlined (a function
-- that pins its search_path is not inlined, and calling it per pair would
-- hold the lock several times longer on BF4PS's 188k soldiers).
INSERT INTO freshness_rollup (resource, slot, pairs)
SELECT x.resource, bf4ps_freshness_stored_slot(x.slot, now()), sum(x.pairs)
FROM (
    SELECT p.resource,
           CASE WHEN p.at IS NULL THEN '-infinity'::timestamptz
                WHEN NOT isfinite(p.at) THEN p.at
                ELSE date_bin('5 minutes', p.at, '2000-01-01 00:00:00+00') END AS slot,
           count(*) AS pairs
    FROM collection_state AS s
    CROSS JOIN LATERAL (VALUES
        ('detailed', s.detailed_last_success_at),
        ('profile', s.profile_last_success_at),
        ('weapons', s.weapons_last_success_at),
        ('vehicles', s.vehicles_last_success_at)
    ) AS p(resource, at)
    GROUP BY 1, 2
) AS x
GROUP BY 1, 2;
