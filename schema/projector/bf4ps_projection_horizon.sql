-- The projection horizon (0003): the snapshot's oldest in-progress
-- transaction of this database, or its xmax when none is left (see 0003 for
-- why transactions of other databases are ignored). Transactions of roles
-- that cannot write an event are ignored too: a reader's open transaction
-- (one with an xid: `SELECT pg_current_xact_id()`) holds nothing back. A
-- role can write events when it may INSERT into collection_events or is a
-- collector or website (their functions write them).
--
-- owner: migrator
-- execute: PUBLIC
CREATE OR REPLACE FUNCTION @schema@.bf4ps_projection_horizon() RETURNS xid8
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
