//! Tollgate's control side: the pure compiler from Gateway API objects to route tables and
//! statuses, and the commands built on it (`run`, `validate`).
#![forbid(unsafe_code)]

pub mod compile;
pub mod demo;
pub mod manifests;
pub mod run;
pub mod validate;
