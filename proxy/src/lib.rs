//! Tollgate proxy: the data plane. In: [`tollgate_api::RouteTable`]s through
//! [`Proxy::apply`]. Out: HTTP traffic forwarded to upstream endpoints, metrics (served by
//! [`serve_admin`]) and access logs.
//!
//! Modules, in request order: `listener` (sockets, TLS, hyper), `service` (the
//! request lifecycle), `call` (the upstream exchange), [`router`], [`filters`], `upstream` (balancing, pooled clients),
//! `forward` (header hygiene), `mirror`, `body`, then [`metrics`] and `access_log`.
#![forbid(unsafe_code)]

mod access_log;
mod admin;
mod body;
mod call;
mod error;
pub mod filters;
mod forward;
mod listener;
pub mod metrics;
mod mirror;
mod proxy;
pub mod router;
mod service;
pub mod tls;
mod upstream;

pub use admin::serve_admin;
pub use error::{ProxyError, Result};
pub use metrics::Metrics;
pub use proxy::{Proxy, ProxyOptions};
