//! bf4ps-ops: PostgreSQL-coordinated stat collection for BF4PS.
//!
//! See `ARCHITECTURE.md` for the codemap and invariants.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
// The API documentation is the engineers' map, built with private items
// (`cargo doc --document-private-items`, warnings denied in scripts/test):
// a public item's doc may link the private constant or helper it explains.
#![allow(rustdoc::private_intra_doc_links)]

pub(crate) mod backoff;
pub mod cli;
pub mod collector;
pub mod config;
pub mod db;
pub mod domain;
pub mod egress;
pub mod feeder;
pub mod freshness;
pub mod gauges;
pub mod import;
pub mod listener;
pub mod metrics;
pub mod monitor;
pub mod output;
pub mod projector;
pub mod queue;
pub mod registry;
pub mod request;
pub mod retention;
pub mod roles;
pub mod serve;
pub mod shutdown;
pub mod status;
pub mod task;
pub mod telemetry;
pub mod tuning;
pub mod upstream;
