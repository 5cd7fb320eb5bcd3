-- Whether `t` is an acceptable free text of a Battlelog document (a weapon's
-- or vehicle's name, a category): NULL, or at most `max_length` characters
-- without control characters or bidirectional overrides.
-- A SQL-standard body: bound at creation and inlined by the planner (three
-- calls per entry of a weapons or vehicles list).
--
-- owner: migrator
-- execute: PUBLIC
CREATE OR REPLACE FUNCTION @schema@.bf4ps_text_ok(t text, max_length integer) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN t IS NULL
    OR (length(t) <= max_length
        AND t !~ '[\x01-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]');
