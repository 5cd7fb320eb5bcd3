//! bf4ps-ops: PostgreSQL-coordinated stat collection for BF4PS.
//!
//! See `ARCHITECTURE.md` for the codemap and invariants.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod bench;
pub mod cli;
pub mod config;
pub mod db;
pub mod domain;
pub mod gauges;
pub mod metrics;
pub mod projector;
pub mod retention;
pub mod serve;
pub mod telemetry;
