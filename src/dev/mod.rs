//! Development tooling: the demo, its private PostgreSQL cluster, the fake
//! Battlelog and the benchmarks.
//!
//! Layering: the runtime (everything outside `dev/`) never imports this wing
//! (`tests/it/layering.rs` checks it); only the CLI dispatches to it.

pub mod bench;
pub mod demo;
pub mod fake_battlelog;
pub mod pgcluster;
