-- x rounded to `scale` decimals, a tie going to the even neighbour (BF4PS
-- quantizes quit_percentage and longest_headshot so; numeric's round()
-- takes ties away from zero). Exact: numeric arithmetic throughout.
--
-- owner: migrator
-- execute: PUBLIC
CREATE OR REPLACE FUNCTION @schema@.bf4ps_round_half_even(x numeric, scale integer) RETURNS numeric
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
