-- 0019: rates and waits at the boundary (issue 27). What one host, the
-- website or a reader can do to others is bounded by its share, in rate and
-- in time, whatever order it calls things in.
--
-- - A claim consumes a grant. bf4ps_collector_claim (protocol 3) takes the
--   egress gate's grant in its own statement: the caller's key slot and
--   pause, and for the background lane the fleet budget's slot and the key's
--   fair share of it; nothing is granted unless a job is claimed with it, so
--   a grant is never spent without a claim and a claim never goes without a
--   grant. bf4ps_collector_egress_pass, which booked a slot whether or not
--   a claim followed, is gone (42883), and its core bf4ps_egress_grant. Denied, the claim answers one row
--   without a job: how long to wait and whether the key is paused.
-- - Fair shares: a key that wants the budget (asked for a background claim
--   in the last minute) gets at most budget / (keys wanting it) of the
--   slots: after a budgeted grant its own next budget slot is that many
--   budget spacings away.
-- - Names, catalogs and profiles: bf4ps_name_ok also refuses zero-width and
--   invisible format characters; every catalog string and profile string is
--   checked (bf4ps_text_ok), country codes against ISO 3166-1 alpha-2,
--   battlelog_user_id > 0; a job may add at most
--   scheduling_settings.catalog_new_per_day new catalog entries a day per
--   catalog once it holds catalog_seed entries (53400 beyond).
-- - The website asks and never renames: a name passed for a known soldier
--   changes nothing. A resource that succeeded less than
--   scheduling_settings.interactive_cooldown ago is answered `fresh`, with
--   its last_success_at and no job.
-- - One host's word parks nothing: bf4ps_fail_job parks a pair as
--   `unavailable` only when the verdict confirms one given through another
--   login role (or the same role when no other role has a live collector on
--   the lane); until then the pair is rechecked after
--   scheduling_settings.unavailable_recheck.
-- - An outcome locks the soldier's row first (bf4ps_record_outcome), as
--   BF4PS's discovery does: the two never deadlock through
--   collection_state and the feeder's triggers.
-- - Readers no longer read bf4ps_leases (docs/security.md said so).
--
-- RELEASED once merged: never edit this file. Add a new migration instead.

CREATE OR REPLACE FUNCTION pg_temp.bf4ps_define(body text) RETURNS void
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

ALTER TABLE egress_gates
    -- When this key last asked for a budgeted claim (it wants the budget).
    ADD COLUMN budget_wanted_at timestamptz,
    -- The key's own next budget slot (its fair share).
    ADD COLUMN budget_next_at timestamptz;

ALTER TABLE scheduling_settings
    ADD COLUMN interactive_cooldown interval NOT NULL DEFAULT interval '10 minutes',
    ADD COLUMN catalog_seed integer NOT NULL DEFAULT 1000,
    ADD COLUMN catalog_new_per_day integer NOT NULL DEFAULT 50,
    -- An unconfirmed `unavailable` verdict is checked again after this.
    ADD COLUMN unavailable_recheck interval NOT NULL DEFAULT interval '1 hour',
    ADD CONSTRAINT scheduling_settings_unavailable_recheck_check
        CHECK (unavailable_recheck > interval '0'),
    ADD CONSTRAINT scheduling_settings_interactive_cooldown_check
        CHECK (interactive_cooldown >= interval '0'),
    ADD CONSTRAINT scheduling_settings_catalog_check
        CHECK (catalog_seed >= 0 AND catalog_new_per_day >= 0);

SELECT pg_temp.bf4ps_define($body$
-- The collector protocol of this schema (0019: 3, the claim takes the
-- egress grant; bf4ps_collector_egress_pass is gone).
CREATE OR REPLACE FUNCTION @schema@.bf4ps_collector_protocol() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, @schema@, pg_temp
AS $$ SELECT 3 $$;
$body$);


SELECT pg_temp.bf4ps_define($body$
-- Whether text that others will read is acceptable (NULL is): at most
-- `max_length` characters; no control characters (C0, DEL, C1), no
-- bidirectional marks, embeddings, overrides or isolates (which forge what a
-- terminal or page shows), no zero-width or invisible format characters
-- (U+00AD, U+180E, U+200B-U+200D, U+2060-U+2064, U+FEFF), which make two
-- different strings look identical.
CREATE FUNCTION @schema@.bf4ps_text_ok(t text, max_length integer) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
    SELECT t IS NULL
        OR (length(t) <= max_length
            AND t !~ '[\x01-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]')
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
-- Whether `t` is an acceptable operator-facing name: 1-`max_length`
-- characters after trimming, none of bf4ps_text_ok's characters.
CREATE OR REPLACE FUNCTION @schema@.bf4ps_name_ok(t text, max_length integer) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
    SELECT t IS NOT NULL
       AND length(btrim(t)) BETWEEN 1 AND max_length
       AND @schema@.bf4ps_text_ok(t, max_length)
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
-- Whether `code` is an ISO 3166-1 alpha-2 country code (upper case).
CREATE FUNCTION @schema@.bf4ps_country_ok(code text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
    SELECT code = ANY ('{
        AD,AE,AF,AG,AI,AL,AM,AO,AQ,AR,AS,AT,AU,AW,AX,AZ,BA,BB,BD,BE,BF,BG,BH,BI,BJ,BL,BM,BN,BO,BQ,
        BR,BS,BT,BV,BW,BY,BZ,CA,CC,CD,CF,CG,CH,CI,CK,CL,CM,CN,CO,CR,CU,CV,CW,CX,CY,CZ,DE,DJ,DK,DM,
        DO,DZ,EC,EE,EG,EH,ER,ES,ET,FI,FJ,FK,FM,FO,FR,GA,GB,GD,GE,GF,GG,GH,GI,GL,GM,GN,GP,GQ,GR,GS,
        GT,GU,GW,GY,HK,HM,HN,HR,HT,HU,ID,IE,IL,IM,IN,IO,IQ,IR,IS,IT,JE,JM,JO,JP,KE,KG,KH,KI,KM,KN,
        KP,KR,KW,KY,KZ,LA,LB,LC,LI,LK,LR,LS,LT,LU,LV,LY,MA,MC,MD,ME,MF,MG,MH,MK,ML,MM,MN,MO,MP,MQ,
        MR,MS,MT,MU,MV,MW,MX,MY,MZ,NA,NC,NE,NF,NG,NI,NL,NO,NP,NR,NU,NZ,OM,PA,PE,PF,PG,PH,PK,PL,PM,
        PN,PR,PS,PT,PW,PY,QA,RE,RO,RS,RU,RW,SA,SB,SC,SD,SE,SG,SH,SI,SJ,SK,SL,SM,SN,SO,SR,SS,ST,SV,
        SX,SY,SZ,TC,TD,TF,TG,TH,TJ,TK,TL,TM,TN,TO,TR,TT,TV,TW,TZ,UA,UG,UM,US,UY,UZ,VA,VC,VE,VG,VI,
        VN,VU,WF,WS,YE,YT,ZA,ZM,ZW
    }'::text[])
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
-- One claim with its grant, for incarnation `p_uuid` (enabled, undrained,
-- unretired, holding no job) at `p_now` (NULL: the database's clock read
-- after the locks, so a wait for them never makes a slot stale; the
-- scheduling simulation passes its virtual one).
--
-- The egress gate (0007) and the claim (bf4ps_claim_job) in one
-- transaction: the request may go when the key's next slot and pause have
-- passed and, for the background lane while the budget is on, the fleet
-- budget's next slot and the key's own next budget slot too. Then, and only
-- if a job is claimed, the grant is spent: the key's slot moves the
-- published egress_spacing on, the budget's budget_spacing on, and the
-- key's own budget slot budget_spacing x (unpaused keys that wanted the
-- budget in the last minute, at least 1) on, so no key takes more than its fair share
-- while others want it, and a lone key may take the whole budget.
--
-- Rows: none (nothing claimable, or the caller may not claim; nothing
-- spent); one without a job (granted false: wait wait_us, at most a day;
-- paused: Battlelog throttled the key); or the claimed job (granted true).
-- A caller the database says holds a job holds none (it claims): that
-- lease ends now and the caller claims anyway (after a restore or a lost
-- answer, the fleet collects again at once, not after the lease).
-- Locks: the budget row, then the key row (every caller alike); the
-- caller's collector row only when a job is claimed (or a lease freed), so
-- a claim waiting for the budget never holds up its own heartbeat.
CREATE FUNCTION @schema@.bf4ps_take_job(p_uuid uuid, p_start boolean, p_now timestamptz)
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
    budget_class text,
    granted boolean,
    wait_us bigint,
    paused boolean
)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_key text;
    v_lane text;
    v_spacing interval;
    v_budget_spacing interval;
    v_budget timestamptz;
    v_next timestamptz;
    v_paused timestamptz;
    v_own timestamptz;
    v_at timestamptz;
    v_now timestamptz;
    v_keys bigint;
    v_held bigint;
BEGIN
    SELECT c.egress_key, c.lane, c.current_job_id INTO v_key, v_lane, v_held
    FROM @schema@.collectors AS c
    WHERE c.collector_uuid = p_uuid AND c.enabled AND NOT c.drained AND c.retired_at IS NULL;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v_held IS NOT NULL THEN
        -- A collector claims only when it holds nothing, so the job the
        -- database says it holds is not held: the database went back in
        -- time (a restore, a failover that lost its tail) or the answer to
        -- an earlier claim was lost. That lease ends now (the monitor
        -- returns the job with lease_expired + reclaimed) and the caller
        -- claims at once.
        UPDATE @schema@.collection_jobs AS j
        SET lease_expires_at = least(j.lease_expires_at, clock_timestamp()),
            updated_at = clock_timestamp()
        WHERE j.job_id = v_held AND j.collector_uuid = p_uuid
          AND j.status IN ('claimed', 'running');
        UPDATE @schema@.collectors AS c SET current_job_id = NULL, updated_at = clock_timestamp()
        WHERE c.collector_uuid = p_uuid AND c.current_job_id = v_held;
    END IF;
    SELECT s.egress_spacing, CASE WHEN v_lane = 'background' THEN s.budget_spacing END
      INTO v_spacing, v_budget_spacing
    FROM @schema@.scheduling_settings AS s;
    IF v_budget_spacing IS NOT NULL THEN
        SELECT b.next_slot_at INTO v_budget
        FROM @schema@.egress_budget AS b WHERE b.singleton FOR UPDATE;
    END IF;
    SELECT g.next_slot_at, g.paused_until, g.budget_next_at INTO v_next, v_paused, v_own
    FROM @schema@.egress_gates AS g WHERE g.egress_key = v_key FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO @schema@.egress_gates (egress_key, next_slot_at, passes)
        VALUES (v_key, '-infinity', 0)
        ON CONFLICT (egress_key) DO NOTHING;
        SELECT g.next_slot_at, g.paused_until, g.budget_next_at INTO v_next, v_paused, v_own
        FROM @schema@.egress_gates AS g WHERE g.egress_key = v_key FOR UPDATE;
    END IF;
    v_now := coalesce(p_now, clock_timestamp());
    IF v_budget_spacing IS NOT NULL THEN
        -- This key wants the budget: it counts in everyone's fair share.
        UPDATE @schema@.egress_gates AS g SET budget_wanted_at = v_now
        WHERE g.egress_key = v_key;
    ELSE
        v_own := NULL;
    END IF;
    -- greatest() ignores NULLs (no pause, budget off).
    v_at := greatest(v_next, v_paused, v_budget, v_own);
    IF v_at > v_now THEN
        RETURN QUERY SELECT NULL::bigint, NULL::bigint, NULL::bigint, NULL::text, NULL::text,
            NULL::text, NULL::text, NULL::text, NULL::integer, NULL::uuid, NULL::timestamptz,
            NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::text, false,
            CASE WHEN v_at >= v_now + interval '1 day' THEN 86400000000::bigint
                 ELSE ceil(extract(epoch FROM v_at - v_now) * 1000000)::bigint END,
            coalesce(v_paused > v_now, false);
        RETURN;
    END IF;
    RETURN QUERY
    SELECT c.*, true, 0::bigint, false
    FROM @schema@.bf4ps_claim_job(p_uuid, p_start, v_now) AS c;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- The grant, spent by this claim.
    IF v_budget_spacing IS NOT NULL THEN
        -- (A paused key wants it but may not use it: not counted.)
        SELECT count(*) INTO v_keys
        FROM @schema@.egress_gates AS g
        WHERE g.budget_wanted_at > v_now - interval '1 minute'
          AND (g.paused_until IS NULL OR g.paused_until <= v_now);
        UPDATE @schema@.egress_budget AS b
        SET next_slot_at = v_now + v_budget_spacing, passes = b.passes + 1, updated_at = v_now
        WHERE b.singleton;
    END IF;
    UPDATE @schema@.egress_gates AS g
    SET next_slot_at = v_now + v_spacing, passes = g.passes + 1, updated_at = v_now,
        budget_next_at = CASE WHEN v_budget_spacing IS NULL THEN g.budget_next_at
                              ELSE v_now + v_budget_spacing * greatest(v_keys, 1) END
    WHERE g.egress_key = v_key;
END;
$$;
$body$);

DROP FUNCTION bf4ps_collector_egress_pass(uuid, uuid);
-- Its core: bf4ps_take_job grants in the claim now.
DROP FUNCTION bf4ps_egress_grant(text, boolean, timestamptz);
DROP FUNCTION bf4ps_collector_claim(uuid, uuid, integer, boolean);

SELECT pg_temp.bf4ps_define($body$
-- The collector's claim (bf4ps_take_job on the database's clock: the grant
-- and the claim in one statement), for the incarnation holding `p_secret`;
-- it commits without waiting for the WAL flush (losing it in a crash loses
-- the claim and its grant whole; recovery returns the job). Rows: none
-- (nothing claimable, or the caller may not claim), one with granted false
-- and no job (wait wait_us: the key's rate, its pause, the budget or the
-- key's share of it), or the job. A collector speaking an older protocol
-- than the schema's is refused with SQLSTATE BF001 (it drains; see
-- bf4ps_collector_protocol).
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
    budget_class text,
    granted boolean,
    wait_us bigint,
    paused boolean
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
    RETURN QUERY SELECT * FROM @schema@.bf4ps_take_job(p_uuid, p_start, NULL);
END;
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
-- Checks what a `p_resource` document brings into tables others read
-- (bf4ps_succeed_job checks its shape and ranges): every catalog string
-- (name, slug, category) and profile string passes bf4ps_text_ok (a slug
-- is also [A-Za-z0-9._-] only and a catalog string has no < or >), a
-- country code is ISO 3166-1 alpha-2, battlelog_user_id is > 0 (SQLSTATE
-- 22023 otherwise). New catalog entries are bounded (SQLSTATE 53400
-- beyond): a catalog fills up to scheduling_settings.catalog_seed entries,
-- then takes at most catalog_new_per_day new ones a day (Battlelog adds
-- weapons a few times a year); counted under the catalog's row lock, which
-- the finalization takes next anyway.
CREATE FUNCTION @schema@.bf4ps_check_document(p_resource text, p_data jsonb, p_now timestamptz)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
DECLARE
    v_list text := CASE p_resource WHEN 'weapons' THEN 'weapons'
                                   WHEN 'vehicles' THEN 'vehicles' END;
    v_seed integer;
    v_per_day integer;
    v_new bigint;
    v_size bigint;
    v_recent bigint;
    v_bad text;
BEGIN
    -- (An oversized or malformed list is bf4ps_succeed_job's to refuse.)
    IF v_list IS NOT NULL AND jsonb_typeof(p_data->v_list) = 'array'
       AND jsonb_array_length(p_data->v_list) <= 5000 THEN
        SELECT format('entry %s', e.guid) INTO v_bad
        FROM jsonb_to_recordset(p_data->v_list) AS e(guid text, name text, slug text, category text)
        WHERE NOT @schema@.bf4ps_text_ok(e.name, 200) OR NOT @schema@.bf4ps_text_ok(e.category, 200)
           OR e.name ~ '[<>]' OR e.category ~ '[<>]'
           OR e.slug !~ '^[A-Za-z0-9._-]{1,200}$' OR e.slug ~ '\.\.'
        LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'a % % has a name, slug or category with characters others must not be shown (control, bidirectional, zero-width or invisible characters, < or >; a slug is [A-Za-z0-9._-] without ..)',
                    p_resource, left(v_bad, 80)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT s.catalog_seed, s.catalog_new_per_day INTO v_seed, v_per_day
        FROM @schema@.scheduling_settings AS s;
        IF p_resource = 'weapons' THEN
            SELECT count(DISTINCT e.guid) INTO v_new
            FROM jsonb_to_recordset(p_data->'weapons') AS e(guid text)
            WHERE NOT EXISTS (SELECT 1 FROM @schema@.weapon_catalog AS k
                              WHERE k.weapon_guid = e.guid);
            IF v_new > 0 THEN
                PERFORM 1 FROM @schema@.bf4ps_locks WHERE lock_name = 'weapon_catalog' FOR UPDATE;
                SELECT count(*), count(*) FILTER (WHERE k.first_seen_at > p_now - interval '1 day')
                  INTO v_size, v_recent
                FROM @schema@.weapon_catalog AS k;
            END IF;
        ELSE
            SELECT count(DISTINCT e.guid) INTO v_new
            FROM jsonb_to_recordset(p_data->'vehicles') AS e(guid text)
            WHERE NOT EXISTS (SELECT 1 FROM @schema@.vehicle_catalog AS k
                              WHERE k.vehicle_guid = e.guid);
            IF v_new > 0 THEN
                PERFORM 1 FROM @schema@.bf4ps_locks WHERE lock_name = 'vehicle_catalog' FOR UPDATE;
                SELECT count(*), count(*) FILTER (WHERE k.first_seen_at > p_now - interval '1 day')
                  INTO v_size, v_recent
                FROM @schema@.vehicle_catalog AS k;
            END IF;
        END IF;
        IF v_new > 0
           AND v_new > greatest(v_seed - v_size, 0) + greatest(v_per_day - v_recent, 0) THEN
            RAISE EXCEPTION 'this % list adds % new catalog entries; the catalog holds % and took % in the last day (it fills up to % entries, then takes % a day: scheduling_settings.catalog_seed, catalog_new_per_day)',
                    p_resource, v_new, v_size, v_recent, v_seed, v_per_day
                USING ERRCODE = 'configuration_limit_exceeded';
        END IF;
    ELSIF p_resource = 'profile' THEN
        IF NOT @schema@.bf4ps_text_ok(p_data->>'battlelog_username', 200)
           OR NOT @schema@.bf4ps_text_ok(p_data->>'country_name', 200)
           OR NOT coalesce(@schema@.bf4ps_country_ok(p_data->>'country_code'), true)
           OR jsonb_typeof(p_data->'battlelog_user_id') = 'number'
              AND (p_data->>'battlelog_user_id')::numeric <= 0 THEN
            RAISE EXCEPTION 'a profile has a username and country name without control, bidirectional, zero-width or invisible characters, an ISO 3166-1 alpha-2 country_code if any, and a battlelog_user_id > 0 if any'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
END;
$$;
$body$);

SELECT pg_temp.bf4ps_define($body$
-- Successful finalization for the caller's lease (bf4ps_succeed_job on the
-- database's clock), after bf4ps_check_document (0019) on the job's
-- resource: no row when the lease is not the caller's.
CREATE OR REPLACE FUNCTION @schema@.bf4ps_collector_succeed(
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
DECLARE
    v_resource text;
BEGIN
    PERFORM @schema@.bf4ps_collector_check_secret(p_uuid, p_secret);
    SELECT j.resource INTO v_resource
    FROM @schema@.collection_jobs AS j
    WHERE j.job_id = p_job_id AND j.collector_uuid = p_uuid AND j.lease_token = p_lease_token
      AND j.status = 'running' AND j.lease_expires_at > now();
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM @schema@.bf4ps_check_document(v_resource, p_data, now());
    RETURN QUERY SELECT * FROM @schema@.bf4ps_succeed_job(
        p_uuid, p_job_id, p_lease_token, p_data, p_duration_ms, p_http_status, now());
END;
$$;
$body$);

DROP FUNCTION bf4ps_request_refresh(text, bigint, text[], interval, double precision, text);

SELECT pg_temp.bf4ps_define($body$
-- Interactive refresh of one soldier, for the website (inside its own
-- transaction) and `bf4ps-ops request` (0004, 0006; now on BF4PS's tables).
--
-- The soldier is written as BF4PS writes a manual submission: an unknown one
-- is created with `soldier_name` (required for it: the website passes the
-- name from the Battlelog soldier URL; SQLSTATE 22023 without one) as
-- current_name, first and last seen now, a soldier_names row and source
-- 'manual'; a known one gets its 'manual' source row refreshed and nothing
-- else: a name passed for it changes nothing (0019: discovery and BF4PS's
-- own sources own names; the website asks, it never renames). Its default
-- collection_state row is created if missing. Then per requested resource
-- (canonical order detailed, profile, weapons, vehicles):
--   * no live job, a success less than scheduling_settings.interactive_cooldown
--     ago                 -> nothing queued                     (state 'fresh')
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
-- jobs in claim order, 0 for claimed/running; the ETA of bf4ps_eta_seconds);
-- NULL for a fresh one (job_id NULL too). last_success_at: the pair's last
-- success (NULL: never), whatever the state.
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
    eta_seconds double precision,
    last_success_at timestamptz
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
    v_cooldown interval;
    v_last timestamptz;
    v_lasts timestamptz[] := ARRAY[]::timestamptz[];
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
           s.max_pending_interactive, s.interactive_cooldown
      INTO v_window, v_rate, v_cap, v_cooldown
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
    IF v_soldier IS NULL THEN
        INSERT INTO @schema@.soldiers AS s
            (persona_id, platform, current_name, first_seen_at, last_seen_at)
        VALUES (v_persona, v_platform, v_name, now(), now())
        ON CONFLICT (persona_id, platform) DO UPDATE
        -- Created concurrently: known now, so not renamed.
        SET first_seen_at = least(s.first_seen_at, EXCLUDED.first_seen_at),
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
        SELECT @schema@.bf4ps_sane_time(CASE v_resource
                   WHEN 'detailed' THEN cs.detailed_last_success_at
                   WHEN 'profile' THEN cs.profile_last_success_at
                   WHEN 'weapons' THEN cs.weapons_last_success_at
                   WHEN 'vehicles' THEN cs.vehicles_last_success_at END)
          INTO v_last
        FROM @schema@.collection_state AS cs WHERE cs.soldier_id = v_soldier;
        FOR attempt IN 1..5 LOOP
            SELECT j.job_id, j.status, j.lane, j.priority_class, j.attempt_count
              INTO v_job, v_status, v_lane, v_class, v_attempts
            FROM @schema@.collection_jobs AS j
            WHERE j.soldier_id = v_soldier AND j.resource = v_resource;

            IF NOT FOUND AND v_last > now() - v_cooldown THEN
                -- Fetched moments ago: answered as fresh, nothing spent.
                v_job := NULL;
                v_state := 'fresh';
                v_settled := true;
            ELSIF NOT FOUND THEN
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
        v_lasts := v_lasts || v_last;
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
        last_success_at := v_lasts[i];
        IF state = 'fresh' THEN
            "position" := NULL;
            eta_seconds := NULL;
        ELSIF state IN ('claimed', 'running') THEN
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
--   unavailable  the persona does not exist. One host's word parks nothing
--                (0019): the verdict is confirmed when the pair's latest
--                outcome is an `unavailable` verdict given through another
--                login role, or through the same role when no other role has
--                a live collector on the job's lane. Confirmed: unavailable,
--                out of the retry loop (no due time), the job removed.
--                Unconfirmed: temporary_failure, the job pending again after
--                scheduling_settings.unavailable_recheck (the attempt counts
--                toward nothing else; the `failed` event's metadata says
--                verdict: unconfirmed);
--   other        temporary_failure, the failure count and class, and the
--                retry time: the retry ladder's step for this failure in a
--                row (+-retry_jitter); the job pending again then, or, past
--                retry_max_attempts, removed (the feeder brings the pair back
--                when it is due).
-- Events: `failed` (+ `retry_scheduled` when the job waits). Bad input is
-- refused (SQLSTATE 22023), writing nothing.
CREATE OR REPLACE FUNCTION @schema@.bf4ps_fail_job(
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
    v_prev record;
    v_role text;
    v_unconfirmed boolean := false;
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
           x.retry_max_attempts, x.unavailable_recheck
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
        SELECT cs.registered_by INTO v_role
        FROM @schema@.collector_secrets AS cs WHERE cs.collector_uuid = p_uuid;
        -- The pair's latest outcome (a soldier's few events, newest first).
        SELECT e.event_type = 'failed' AND e.error_class = 'unavailable' AS verdict,
               cs.registered_by
          INTO v_prev
        FROM @schema@.collection_events AS e
        LEFT JOIN @schema@.collector_secrets AS cs ON cs.collector_uuid = e.collector_uuid
        WHERE e.soldier_id = j.soldier_id AND e.resource = j.resource
          AND e.event_type IN ('succeeded', 'failed')
        ORDER BY e.occurred_at DESC, e.event_id DESC
        LIMIT 1;
        v_unconfirmed := NOT coalesce(
            v_prev.verdict
            AND (v_prev.registered_by <> v_role
                 OR NOT EXISTS (
                     SELECT 1
                     FROM @schema@.collectors AS c
                     JOIN @schema@.collector_secrets AS cs ON cs.collector_uuid = c.collector_uuid
                     WHERE c.lane = j.lane AND c.retired_at IS NULL AND c.enabled
                       AND NOT c.drained AND c.heartbeat_state <> 'lost'
                       AND cs.registered_by <> v_role)),
            false);
        IF v_unconfirmed THEN
            v_delay := s.unavailable_recheck;
            v_retry := true;
            v_outcome := 'retry_scheduled';
        ELSE
            v_retry := false;
            v_outcome := 'unavailable';
        END IF;
    ELSE
        v_attempts := j.attempt_count - j.throttled_attempts;
        v_delay := s.retry_ladder[least(v_failures, cardinality(s.retry_ladder))]
                   * (1 + (random() * 2 - 1) * s.retry_jitter);
        v_retry := v_attempts < s.retry_max_attempts;
        v_outcome := CASE WHEN v_retry THEN 'retry_scheduled' ELSE 'gave_up' END;
    END IF;
    v_next := CASE WHEN v_outcome = 'unavailable' THEN NULL ELSE p_now + v_delay END;

    PERFORM @schema@.bf4ps_record_outcome(
        j.soldier_id, j.resource,
        CASE WHEN v_outcome = 'unavailable' THEN 'unavailable' ELSE 'temporary_failure' END,
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
            jsonb_build_object('next_due_at', v_next, 'consecutive_failures', v_failures)
            || CASE WHEN v_unconfirmed THEN jsonb_build_object('verdict', 'unconfirmed')
                    ELSE '{}'::jsonb END),
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
-- The state columns of one resource after an outcome, in the one statement
-- every outcome uses: the group of `p_resource` gets the new values (as of
-- `p_now`), the three others keep theirs. Creates the row if the soldier
-- has none. (0019) The soldier's row is locked first, as BF4PS's
-- discovery locks it first (its sighting upserts the soldier, then its
-- source and state, whose triggers touch feeder_pairs): an outcome and a
-- sighting of one soldier queue on that row and never deadlock through
-- collection_state and feeder_pairs.
CREATE OR REPLACE FUNCTION @schema@.bf4ps_record_outcome(
    p_soldier_id bigint, p_resource text, p_state text, p_success boolean,
    p_next_due_at timestamptz, p_failures integer, p_error_class text, p_error_message text,
    p_now timestamptz)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    PERFORM 1 FROM @schema@.soldiers AS so WHERE so.soldier_id = p_soldier_id
    FOR NO KEY UPDATE;
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

DO $owners$
DECLARE
    s text := (SELECT quote_ident(n.nspname)
               FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
               WHERE c.oid = 'collection_jobs'::regclass);
    f text;
BEGIN
    EXECUTE format('GRANT USAGE, CREATE ON SCHEMA %s TO bf4ps_definer', s);
    FOREACH f IN ARRAY ARRAY[
        'bf4ps_collector_claim(uuid, uuid, integer, boolean)',
        'bf4ps_request_refresh(text, bigint, text[], interval, double precision, text)']
    LOOP
        EXECUTE format('ALTER FUNCTION %s.%s OWNER TO bf4ps_definer', s, f);
        EXECUTE format('REVOKE ALL ON FUNCTION %s.%s FROM PUBLIC', s, f);
    END LOOP;
    EXECUTE format('REVOKE CREATE ON SCHEMA %s FROM bf4ps_definer', s);
END
$owners$;

REVOKE ALL ON FUNCTION
    bf4ps_take_job(uuid, boolean, timestamptz),
    bf4ps_check_document(text, jsonb, timestamptz)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    bf4ps_take_job(uuid, boolean, timestamptz),
    bf4ps_check_document(text, jsonb, timestamptz)
    TO bf4ps_definer;
GRANT EXECUTE ON FUNCTION bf4ps_collector_claim(uuid, uuid, integer, boolean) TO bf4ps_collector;
GRANT EXECUTE ON FUNCTION bf4ps_request_refresh(text, bigint, text[], interval, double precision, text)
    TO bf4ps_website;

-- docs/security.md: readers see no lease holder (host and pid of `serve`).
REVOKE SELECT ON bf4ps_leases FROM bf4ps_reader;
