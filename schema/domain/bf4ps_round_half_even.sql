-- x rounded to `scale` decimals, a tie going to the even neighbour (BF4PS
-- quantizes quit_percentage and longest_headshot so; numeric's round()
-- takes ties away from zero). Exact: numeric arithmetic throughout.
-- PL/pgSQL, whose expressions keep their plans: a SQL function with a SET
-- clause is never inlined, and its body was planned anew at every call.
--
-- owner: migrator
-- execute: PUBLIC
CREATE OR REPLACE FUNCTION @schema@.bf4ps_round_half_even(x numeric, scale integer) RETURNS numeric
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE STRICT
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
DECLARE
    f numeric := power(10::numeric, scale);
    y numeric := x * f;
BEGIN
    IF abs(y - trunc(y)) = 0.5 THEN
        RETURN round((trunc(y) + CASE WHEN mod(trunc(y), 2) = 0 THEN 0 ELSE sign(x) END) / f,
                     scale);
    END IF;
    RETURN round(x, scale);
END;
$$;
