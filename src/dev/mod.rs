//! Development tooling: the private PostgreSQL cluster of `demo`.
//! The runtime never imports this wing.

pub mod pgcluster;
