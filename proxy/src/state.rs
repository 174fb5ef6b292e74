//! What the handle, the listeners and every request share. In: built by [`crate::Proxy`]
//! from its options and each route table. Out: [`Shared`] (the live [`Snapshot`] behind one
//! pointer, the limits, metrics, upstream pools, policy runtime) read by every module on a
//! request's way.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use arc_swap::ArcSwapOption;
use hyper_util::rt::TokioExecutor;
use hyper_util::server::conn::auto;
use tokio::sync::Notify;

use crate::FastMap;
use crate::access_log::AccessLog;
use crate::downstream::tls::PortTls;
use crate::lifecycle::policy::{Enforcer, PolicyRuntime};
use crate::lifecycle::router::Router;
use crate::limits::Limits;
use crate::metrics::Metrics;
use crate::upstream::health::HealthChecker;
use crate::upstream::{Balancer, Upstream};

/// Per-port runtime state of a snapshot.
#[derive(Debug, Clone)]
pub(crate) enum PortState {
    /// Plain HTTP.
    Http,
    /// HTTPS: TLS config and client-certificate rule.
    Https(Arc<PortTls>),
    /// TLS streams routed on SNI (TLSRoutes).
    Tls(Arc<crate::downstream::tls::TlsPort>),
    /// Byte streams (TCPRoutes).
    Tcp,
    /// Datagrams (UDPRoutes).
    Udp,
}

/// Everything a request needs, immutable once built.
#[derive(Debug)]
pub(crate) struct Snapshot {
    /// Table version.
    pub version: u64,
    /// The routes.
    pub router: Router,
    /// Balancers by backend key.
    pub backends: FastMap<String, Arc<Balancer>>,
    /// Ports by table port number.
    pub ports: FastMap<u16, PortState>,
    /// Compiled policies by the table's policy key.
    pub policies: FastMap<String, Arc<Enforcer>>,
    /// Client settings (ClientPolicy) by table port, for ports that have any.
    pub clients: FastMap<u16, Arc<crate::lifecycle::client::PortClient>>,
    /// The table this was built from, for `/debug/explain` (its route lists are the ones
    /// the router's virtual hosts keep anyway).
    pub table: Arc<tollgate_api::RouteTable>,
}

impl Snapshot {
    /// The client settings of `port`, if it has any (no hashing when no port has).
    pub fn client(&self, port: u16) -> Option<&crate::lifecycle::client::PortClient> {
        if self.clients.is_empty() {
            return None;
        }
        self.clients.get(&port).map(|c| &**c)
    }
}

/// State shared by the handle, the listeners and every request.
#[derive(Debug)]
pub(crate) struct Shared {
    pub snapshot: ArcSwapOption<Snapshot>,
    pub limits: Limits,
    pub metrics: Arc<Metrics>,
    pub upstream: Upstream,
    pub access_log: AccessLog,
    pub server: auto::Builder<TokioExecutor>,
    /// Open client connections (for draining on shutdown).
    pub connections: AtomicUsize,
    /// Notified when `connections` drops to zero.
    pub idle: Notify,
    /// Auth caches and rate-limit counters, shared by every snapshot.
    pub policy: PolicyRuntime,
    /// Open connections per client address, for ports that limit them.
    pub per_client: Arc<crate::downstream::per_client::PerClient>,
    /// One permit per mirror copy in flight ([`crate::ProxyOptions::max_mirrors_in_flight`]).
    pub mirror_slots: Arc<tokio::sync::Semaphore>,
    /// The active health-check tasks of the live snapshot's endpoints.
    pub health: HealthChecker,
    /// OpenTelemetry tracing; `None`: off.
    pub tracer: Option<Arc<crate::otel::Tracer>>,
    /// The shared HTTP cache of CachePolicy rules, if the proxy has one.
    pub cache: Option<Arc<crate::HttpCache>>,
}
