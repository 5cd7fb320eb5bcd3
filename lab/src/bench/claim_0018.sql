-- The collector's claim as migration 0014 defined it until 0019 (no egress
-- grant in it: collectors passed bf4ps_collector_egress_pass first), made in
-- a bench's scratch database as the reference of `bench claim`; its core,
-- bench_claim_job_0018, is 0014's bf4ps_claim_job (bench/queue.rs).
CREATE FUNCTION bench_claim_0018(p_uuid uuid, p_secret uuid, p_start boolean)
RETURNS SETOF record
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, public, pg_temp
AS $$
BEGIN
    PERFORM public.bf4ps_collector_check_secret(p_uuid, p_secret);
    PERFORM set_config('synchronous_commit', 'off', true);
    RETURN QUERY SELECT * FROM public.bench_claim_job_0018(p_uuid, p_start, now());
END;
$$;
