WITH s AS (SELECT current_schema() AS name, (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = current_schema()) AS oid),
ext AS (SELECT objid FROM pg_catalog.pg_depend WHERE deptype = 'e')
SELECT regexp_replace(line, '\m' || (SELECT quote_ident(name) FROM s) || '\.', '', 'g') AS line FROM (
    SELECT 'extension ' || e.extname AS line
    FROM pg_catalog.pg_extension e WHERE e.extname <> 'plpgsql'
    UNION ALL
    SELECT format('relation %s %s', c.relname, c.relkind)
    FROM pg_catalog.pg_class c, s
    WHERE c.relnamespace = s.oid AND c.relkind IN ('r', 'p', 'v', 'm', 'f') AND c.oid NOT IN (SELECT objid FROM ext)
    UNION ALL
    SELECT format('column %s %s %s %s%s%s%s', c.relname,
                  lpad((row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum))::text, 3, '0'),
                  a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod),
                  CASE WHEN a.attnotnull THEN ' not null' ELSE '' END,
                  coalesce(' default ' || pg_catalog.pg_get_expr(d.adbin, d.adrelid), ''),
                  CASE a.attidentity WHEN 'a' THEN ' identity always' WHEN 'd' THEN ' identity by default'
                                     ELSE '' END
                  || CASE a.attgenerated WHEN 's' THEN ' generated' ELSE '' END)
    FROM pg_catalog.pg_class c
    JOIN s ON c.relnamespace = s.oid
    JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
    LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
    WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f') AND c.oid NOT IN (SELECT objid FROM ext)
    UNION ALL
    SELECT format('constraint %s %s %s', c.relname, con.conname, pg_catalog.pg_get_constraintdef(con.oid))
    FROM pg_catalog.pg_constraint con
    JOIN pg_catalog.pg_class c ON c.oid = con.conrelid
    JOIN s ON c.relnamespace = s.oid
    UNION ALL
    SELECT format('index %s', pg_catalog.pg_get_indexdef(i.indexrelid))
    FROM pg_catalog.pg_index i
    JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid
    JOIN s ON c.relnamespace = s.oid
    UNION ALL
    SELECT format('sequence %s %s %s %s %s %s', c.relname, pg_catalog.format_type(q.seqtypid, NULL),
                  q.seqstart, q.seqincrement, q.seqmax, q.seqcache)
    FROM pg_catalog.pg_sequence q
    JOIN pg_catalog.pg_class c ON c.oid = q.seqrelid
    JOIN s ON c.relnamespace = s.oid
    UNION ALL
    SELECT format('function %s', p.oid::regprocedure)
    FROM pg_catalog.pg_proc p, s
    WHERE p.pronamespace = s.oid AND p.oid NOT IN (SELECT objid FROM ext)
    UNION ALL
    SELECT format('trigger %s %s', c.relname, pg_catalog.pg_get_triggerdef(t.oid))
    FROM pg_catalog.pg_trigger t
    JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
    JOIN s ON c.relnamespace = s.oid
    WHERE NOT t.tgisinternal
    UNION ALL
    SELECT format('type %s', t.typname)
    FROM pg_catalog.pg_type t, s
    WHERE t.typnamespace = s.oid AND t.typtype IN ('c', 'd', 'e', 'r')
      AND t.typrelid = 0 AND t.oid NOT IN (SELECT objid FROM ext)
) AS x
ORDER BY 1
