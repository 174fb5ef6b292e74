//! Tollgate's control side: the pure compiler from Gateway API objects to route tables and
//! statuses, the Kubernetes controller around it, and the commands built on it (`run`,
//! `validate`, `compile`, `controller`).
#![forbid(unsafe_code)]

pub mod cache_cli;
pub mod compile;
pub mod crds;
pub mod demo;
pub mod explain;
/// Thin wrappers for the fuzz targets (`fuzz/`); not a stable API.
#[doc(hidden)]
pub mod fuzzing;
pub mod k8s;
pub mod manifests;
pub mod push;
pub mod run;
pub mod schema;
pub mod validate;
