//! Tollgate proxy: the data plane. In: [`tollgate_api::RouteTable`]s through
//! [`Proxy::apply`]. Out: HTTP traffic forwarded to upstream endpoints, metrics (served by
//! [`serve_admin`]) and access logs.
//!
//! Modules, in the order a request meets them (each folder's own doc says more):
//! `downstream` (listeners, TLS, our HTTP/1 server and hyper's HTTP/2 one, the client's
//! body and how slowly it may come), `lifecycle` (the request's phases: one authority and
//! path, routing, policies, filters, the upstream call, the gateway's own answers), then
//! `upstream` (balancing, connection pools, our HTTP/1 client); beside them the shared
//! state (`state`, `limits`), `upgrade` (101 and CONNECT hand-overs between the two sides),
//! [`metrics`], `access_log`, and [`subscribe`], which feeds tables from the controller.
//! The HTTP/1 codec is the crate `tollgate-h1`.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use tollgate_proxy::{Metrics, Proxy, ProxyOptions, serve_admin};
//!
//! let metrics = Arc::new(Metrics::new());
//! let proxy = Proxy::new(ProxyOptions {
//!     metrics: metrics.clone(),
//!     access_log: true,
//!     ..ProxyOptions::default()
//! });
//! let table: tollgate_api::RouteTable = serde_json::from_str("...")?;
//! proxy.apply(table).await?; // binds the table's ports; call again for every new version
//! let admin = tokio::net::TcpListener::bind("0.0.0.0:9901").await?;
//! let live = proxy.clone();
//! tokio::spawn(serve_admin(admin, metrics, move || live.version() > 0));
//! // ... on SIGTERM:
//! proxy.shutdown().await;
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]

mod access_log;
mod admin;
mod admin_purge;
mod downstream;
mod error;
pub mod explain;
mod lifecycle;
mod limit_args;
mod limits;
pub mod metrics;
pub mod otel;
mod proxy;
mod signal;
mod state;
pub mod subscribe;
mod upgrade;
mod upstream;

pub use downstream::{proxy_protocol, sni, tls};
pub use lifecycle::{filters, normalize, policy, router};

/// A hash map for lookups on the request path: foldhash (seeded per map) instead of SipHash.
/// Keys are built from the route table; requests only look them up.
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

pub use access_log::{
    AccessLogArgs, AccessLogArgsError, Fields as AccessLogFields, Format as AccessLogFormat,
    LogSettings,
};
pub use admin::{AdminTokenError, ExplainAccess, read_admin_token, serve_admin, serve_admin_with};
pub use error::{ProxyError, Result};
pub use lifecycle::cache::{DEFAULT_CACHE_SIZE, HttpCache, Purge, parse_cache_size};
pub use limit_args::ClientLimitArgs;
pub use metrics::Metrics;
pub use proxy::{Proxy, ProxyOptions};
pub use signal::shutdown_signal;
