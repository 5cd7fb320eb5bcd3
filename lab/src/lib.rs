//! bf4ps-lab: the tools around the product, never deployed: the demo, its
//! private PostgreSQL cluster, the fake Battlelog and the benchmarks.
//!
//! Layering: this crate depends on `bf4ps-ops` through its public library
//! API; the product cannot depend on it (Cargo refuses the cycle), so
//! nothing here can reach an operator's binary. The product's integration
//! tests use [`fake_battlelog`] and [`pgcluster`] as a dev-dependency.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod bench;
pub mod cli;
pub mod demo;
pub mod fake_battlelog;
pub mod pgcluster;
