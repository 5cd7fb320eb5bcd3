//! The single integration-test binary (one link, many modules). Every test
//! gets a fresh PostgreSQL database from `#[sqlx::test]`, created under the
//! master database named by DATABASE_URL (scripts/test sets it up).

mod support;

mod cli;
mod projector;
mod retention;
mod schema;
mod serve;
