//! Tollgate proxy: the data plane. In: [`tollgate_api::RouteTable`]s. Out: HTTP traffic
//! forwarded to upstream endpoints, metrics and access logs.
#![forbid(unsafe_code)]

pub mod filters;
pub mod router;
