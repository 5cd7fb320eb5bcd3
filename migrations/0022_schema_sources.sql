-- 0022: the schema source (issue 36). From this release on, every function,
-- trigger function (with its triggers) and view of ours has one home file
-- under schema/, and `migrate` applies the files that changed after the
-- numbered migrations, in the same transaction, under the same lock
-- (src/db/source.rs). Numbered migrations keep only what must happen once
-- and in order: tables, columns, indexes, data moves, drops, signature
-- changes. These two tables record what was applied.
--
-- RELEASED once merged: never edit this file. Add a new migration instead.

-- One row per schema source file, as last applied.
CREATE TABLE bf4ps_schema_sources (
    path text PRIMARY KEY,
    checksum bytea NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    applied_by text NOT NULL,
    CONSTRAINT ck_bf4ps_schema_sources_path CHECK (path ~ '^[a-z_]+/[a-z0-9_]+\.sql$'),
    CONSTRAINT ck_bf4ps_schema_sources_checksum CHECK (octet_length(checksum) = 32)
);

-- Every set of source files ever applied (the SHA-256 of their paths and
-- checksums), so that a binary whose set was applied once and since
-- replaced, an older release, never puts its functions back.
CREATE TABLE bf4ps_schema_source_sets (
    digest bytea PRIMARY KEY,
    first_applied_at timestamptz NOT NULL DEFAULT now(),
    applied_by text NOT NULL,
    CONSTRAINT ck_bf4ps_schema_source_sets_digest CHECK (octet_length(digest) = 32)
);

-- Collectors and `status` check that the database is current (the numbered
-- migrations and the source), as they read _sqlx_migrations; readers read
-- every table of ours but the secrets and the locks.
GRANT SELECT ON bf4ps_schema_sources TO bf4ps_collector, bf4ps_reader;
GRANT SELECT ON bf4ps_schema_source_sets TO bf4ps_reader;
