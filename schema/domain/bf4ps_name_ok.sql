-- Whether `t` is an acceptable operator-facing name: 1-`max_length`
-- characters after trimming, no control characters (C0, DEL, C1) and no
-- bidirectional overrides, which could forge what a terminal shows.
-- A SQL-standard body: bound at creation (so no caller's search_path
-- reaches it) and inlined by the planner into the calling statement.
--
-- owner: migrator
-- execute: PUBLIC
CREATE OR REPLACE FUNCTION @schema@.bf4ps_name_ok(t text, max_length integer) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN t IS NOT NULL
   AND length(btrim(t)) BETWEEN 1 AND max_length
   AND @schema@.bf4ps_text_ok(t, max_length);
