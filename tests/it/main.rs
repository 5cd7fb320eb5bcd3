//! The single integration-test binary (one link, many modules). Every test
//! gets a fresh PostgreSQL database from `#[sqlx::test]`, created under the
//! master database named by DATABASE_URL (scripts/test sets it up).

mod fixtures;
mod support;

mod adopt;
mod attacks;
mod boundary;
mod cli;
mod collector;
mod docs;
mod drills;
mod egress;
mod failover;
mod feeder;
mod freshness;
mod import;
mod job_cycle;
mod layering;
mod limits;
mod listener;
mod observability;
mod pgbouncer;
mod plans;
mod projector;
mod prometheus_e2e;
mod queue;
mod registry;
mod request;
mod retention;
mod schema;
mod security;
mod serve;
mod source;
mod sql_ops;
mod status;
mod upstream;
