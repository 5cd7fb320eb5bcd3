//! Prometheus metrics: the catalog of exported families (names, types,
//! labels) and, in the runtime modules, their registration.

pub mod catalog;
