//! Tollgate proxy: the data plane. In: [`tollgate_api::RouteTable`]s through
//! [`Proxy::apply`]. Out: HTTP traffic forwarded to upstream endpoints, metrics (served by
//! [`serve_admin`]) and access logs.
//!
//! Modules, in request order: `listener` (sockets, TLS, hyper's server; `inflight`, its
//! connections' requests in flight), `h1serve` (our own server for bodiless HTTP/1.1
//! requests on plain ports), `intake` and [`normalize`] (one authority and one path per
//! request), `service` (the request lifecycle), `call` (the upstream exchange), [`router`],
//! [`filters`], `upstream` (balancing, clients), `pool` (HTTP/1.1 connections per endpoint),
//! `forward` (header hygiene), `grpc` (the gateway's own answers to gRPC clients), `mirror`,
//! `body` (and `pace`, how slowly a client may send one), then
//! [`metrics`] and `access_log`; [`subscribe`] feeds tables from the controller.
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
mod body;
mod call;
mod error;
pub mod filters;
mod forward;
mod framing;
mod gate;
mod grpc;
mod h1;
mod h1serve;
mod inflight;
mod intake;
mod limit_args;
mod listener;
pub mod metrics;
mod mirror;
pub mod normalize;
mod pace;
pub mod policy;
mod pool;
mod proxy;
pub mod router;
mod service;
mod signal;
pub mod sni;
mod stream;
pub mod subscribe;
mod timer;
pub mod tls;
#[allow(dead_code)] // taken up by the HTTP/1 drivers (server and upstream sides)
mod upgrade;
mod upstream;

/// A hash map for lookups on the request path: foldhash (seeded per map) instead of SipHash.
/// Keys are built from the route table; requests only look them up.
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

pub use admin::serve_admin;
pub use error::{ProxyError, Result};
pub use limit_args::ClientLimitArgs;
pub use metrics::Metrics;
pub use proxy::{Proxy, ProxyOptions};
pub use signal::shutdown_signal;
