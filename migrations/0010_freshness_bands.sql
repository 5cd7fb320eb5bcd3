-- 0010: freshness band totals, so a freshness read costs the same at 10,000
-- pairs as at 4,000,000 (issue 14).
--
-- 0008's readers sum every rollup row: one per occupied slot, up to 2,304
-- five-minute slots per resource for 8 days plus one per day beyond. A small
-- population occupies a few hundred, a large one all of them, so a read cost
-- 3x as much at 4 M pairs as at 10 k (docs/benchmarks.md). Now each
-- compaction also stores the pairs per (resource, band) as of its own
-- instant (src/freshness.rs computes them in the compaction's transaction,
-- with the band bounds of the metric catalog; `band` indexes
-- FRESHNESS_BANDS, youngest first, -1 for never collected). A reader starts
-- from these totals and corrects only the rows whose band changed between
-- `as_of` and its own instant (the slots between each band threshold then
-- and now, found through ix_freshness_rollup_slot) and the deltas not folded
-- yet: a few dozen rows, whatever the population. The answer is the same as
-- summing the whole rollup, which readers still do until the first
-- compaction has run (the table starts empty).
--
-- RELEASED once merged: never edit this file. Add a new migration instead.

CREATE TABLE freshness_bands (
    resource text NOT NULL,
    band smallint NOT NULL,
    pairs bigint NOT NULL,
    as_of timestamptz NOT NULL,

    PRIMARY KEY (resource, band),
    CONSTRAINT freshness_bands_resource_check
        CHECK (resource IN ('detailed', 'profile', 'weapons', 'vehicles'))
);

CREATE INDEX ix_freshness_rollup_slot ON freshness_rollup (slot);

GRANT SELECT ON freshness_bands TO bf4ps_reader;

-- TRUNCATE of collection_state clears the totals with the rollup (0008's
-- function, plus the new table).
CREATE OR REPLACE FUNCTION bf4ps_freshness_truncated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM freshness_deltas;
    DELETE FROM freshness_rollup;
    DELETE FROM freshness_bands;
    RETURN NULL;
END;
$$;
