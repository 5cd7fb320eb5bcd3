-- 0020: the feeder's sync in PL/pgSQL (issue 29). bf4ps_feeder_sync (0017)
-- runs in the writer's transaction on every change of a soldier's state or
-- sightings: once per finalization, once per discovery statement. As a SQL
-- function with a SET clause it is never inlined and PostgreSQL 15 plans
-- its two statements again on every call: 2.2 ms of a finalization's 4.8 ms
-- (pg_stat_user_functions self time, `bench schedule`). The same two
-- statements in PL/pgSQL keep their plans for the session. Nothing else
-- changes: same arguments, same rows written, same owner and grants.
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

SELECT pg_temp.bf4ps_define($body$
CREATE OR REPLACE FUNCTION @schema@.bf4ps_feeder_sync(p_ids bigint[]) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    -- (Each id probes the indexes, never `= ANY (p_ids)` against every row:
    -- a bulk statement passes thousands.)
    DELETE FROM @schema@.feeder_pairs AS f
    WHERE f.soldier_id IN (
        SELECT i.id FROM unnest(p_ids) AS i(id)
        WHERE NOT EXISTS (SELECT 1 FROM @schema@.collection_state AS cs
                          WHERE cs.soldier_id = i.id));
    INSERT INTO @schema@.feeder_pairs AS f
        (soldier_id, resource, kind, phase, due_at, live_at, seen_at, first_seen_at)
    SELECT cs.soldier_id, p.resource, p.kind, 0, p.due_at,
           CASE p.kind WHEN 1 THEN src.seen_any ELSE src.seen_bf4sw END,
           src.seen_any, so.first_seen_at
    FROM (SELECT DISTINCT i.id FROM unnest(p_ids) AS i(id)) AS i
    JOIN @schema@.collection_state AS cs ON cs.soldier_id = i.id
    LEFT JOIN @schema@.soldiers AS so ON so.soldier_id = cs.soldier_id
    LEFT JOIN LATERAL (
        SELECT max(s.last_seen_at) AS seen_any,
               max(s.last_seen_at) FILTER (WHERE s.source_type = 'bf4sw') AS seen_bf4sw
        FROM @schema@.soldier_sources AS s WHERE s.soldier_id = cs.soldier_id
    ) AS src ON true
    CROSS JOIN LATERAL (VALUES
        ('detailed', cs.detailed_state, cs.detailed_next_due_at),
        ('profile', cs.profile_state, cs.profile_next_due_at),
        ('weapons', cs.weapons_state, cs.weapons_next_due_at),
        ('vehicles', cs.vehicles_state, cs.vehicles_next_due_at)
    ) AS x(resource, state, due_at)
    CROSS JOIN LATERAL (SELECT x.resource,
                               (CASE x.state WHEN 'never_attempted' THEN 1
                                             WHEN 'success' THEN 2 ELSE 0 END)::smallint AS kind,
                               x.due_at) AS p
    ORDER BY cs.soldier_id, p.resource
    ON CONFLICT (soldier_id, resource) DO UPDATE
    SET kind = EXCLUDED.kind, due_at = EXCLUDED.due_at, live_at = EXCLUDED.live_at,
        seen_at = EXCLUDED.seen_at, first_seen_at = EXCLUDED.first_seen_at,
        phase = CASE WHEN f.kind = EXCLUDED.kind
                          AND f.due_at IS NOT DISTINCT FROM EXCLUDED.due_at
                          AND EXCLUDED.live_at IS NOT NULL
                     THEN f.phase ELSE 0 END
    WHERE (f.kind, f.due_at, f.live_at, f.seen_at, f.first_seen_at)
          IS DISTINCT FROM (EXCLUDED.kind, EXCLUDED.due_at, EXCLUDED.live_at,
                            EXCLUDED.seen_at, EXCLUDED.first_seen_at);
END;
$$;
$body$);
