//! The lab's tests (one binary): its commands as a user runs them
//! (`bf4ps-lab demo`, `bench`, `fake-battlelog`) and the private cluster.
//! The product's tests, which use the lab's fake Battlelog as a library,
//! are `tests/it/` at the repository's root.

mod support;

mod bench;
mod demo;
mod fake_battlelog;
mod pgcluster;
