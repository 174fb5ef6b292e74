//! The [`Proxy`] handle: owns the live snapshot and the listening sockets. In: whole
//! [`RouteTable`]s through [`Proxy::apply`]. Out: a new immutable [`Snapshot`] (router, TLS
//! configs with their client-certificate validation, balancers) swapped in with one pointer
//! store, sockets bound or closed so the set of listening (address, port)s matches the
//! table, and health-check tasks started or stopped to match its backends.
//!
//! Requests load the snapshot once and keep that `Arc` until they finish, so a swap never
//! changes a request mid-flight. A failed apply (bad regex, bad certificate, port in use)
//! leaves the old snapshot and sockets exactly as they were.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tollgate_api::{Backend, Protocol, RouteTable};

use crate::FastMap;
use crate::access_log::{AccessLog, LogSettings};
use crate::downstream::listener::{self, ListenerHandle};
use crate::error::{ProxyError, Result};
use crate::lifecycle::policy::PolicyRuntime;
use crate::lifecycle::policy::auth::AuthState;
use crate::lifecycle::policy::ratelimit::{RateLimitError, RateLimiter, Storage, SystemClock};
use crate::lifecycle::router::Router;
use crate::limits::Limits;
use crate::metrics::Metrics;
use crate::state::{PortState, Shared, Snapshot};
use crate::upstream::health::HealthChecker;
use crate::upstream::{Upstream, build_balancers};

/// How long [`Proxy::shutdown`] waits for open connections to finish.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Settings of a proxy.
#[derive(Debug, Clone)]
pub struct ProxyOptions {
    /// Where metrics are recorded (share it with [`crate::serve_admin`]).
    pub metrics: Arc<Metrics>,
    /// Write an access log line per request (as `access_log_settings` say).
    pub access_log: bool,
    /// Format, fields, filter and destination of the access log. Default: JSON, every
    /// field, every request, stdout.
    pub access_log_settings: LogSettings,
    /// OpenTelemetry tracing (module `otel`); `None`: off, no span work per request.
    pub tracing: Option<crate::otel::TraceSettings>,
    /// Largest request header block; more is answered 431. Default 64 KiB.
    pub max_header_bytes: usize,
    /// Largest request body; more is answered 413. Default 10 MiB.
    pub max_body_bytes: u64,
    /// Where rate-limit counters live (built with [`Metrics::rate_limit`]'s handles by
    /// [`ProxyOptions::rate_limiter`]); `None` = in memory.
    pub rate_limiter: Option<RateLimiter>,
    /// A stream on a TLS (TLSRoute) or TCP (TCPRoute) port with no byte in either direction
    /// for this long is closed. Default 1 hour.
    pub stream_idle_timeout: Duration,
    /// A UDP (UDPRoute) flow, one client address on a port, with no datagram in either
    /// direction for this long is forgotten (its upstream socket closed). Default 60 s.
    pub udp_flow_idle_timeout: Duration,
    /// Most UDP flows one port keeps at once; a datagram that would open another is dropped
    /// (`tollgate_udp_dropped_total{reason="flow_limit"}`). Each flow holds one socket.
    /// Default 4096.
    pub udp_max_flows: usize,
    /// An HTTP/1.x request body the client stops sending for this long (more being due)
    /// ends the request: 408 when no answer has started, and the upstream request is
    /// abandoned, so a client trickling a body cannot hold an upstream connection for ever.
    /// Not for HTTP/2 requests, whose bodies (gRPC streams) may rightly stay quiet while the
    /// answer streams (see `http2_stream_idle_timeout`). Default 60 s (nginx's
    /// `client_body_timeout`).
    pub request_body_idle_timeout: Duration,
    /// A request body must be whole this long after it starts to be forwarded, else it is cut
    /// as the idle timeout cuts it (408 when no answer has started, the upstream request
    /// reset). On HTTP/2 only until the answer starts, so a gRPC stream the upstream
    /// answers may go on. Default 300 s (Envoy's edge `request_timeout`).
    pub request_body_timeout: Duration,
    /// Least pace of an HTTP/1.x request body, in bytes per second, kept up over
    /// `request_body_rate_window`: a client may fall behind this pace by at most one window's
    /// worth of bytes (time the proxy is not reading, because the upstream is not, does not
    /// count). Slower is cut as the idle timeout cuts. 0 turns it off. Default 256 B/s
    /// (Kestrel asks 240 B/s, Apache's mod_reqtimeout 500 B/s).
    pub request_body_min_rate: u64,
    /// The window of `request_body_min_rate`; also how long a body may pause entirely.
    /// Default 60 s, the idle timeout's.
    pub request_body_rate_window: Duration,
    /// An HTTP/2 request body (a stream) the client sends nothing of for this long, more
    /// being due, is cut (408 when no answer has started, the upstream stream reset).
    /// Default 300 s (Envoy's edge `stream_idle_timeout`).
    pub http2_stream_idle_timeout: Duration,
    /// A connection served by hyper (HTTP/2; HTTP/1 over TLS, whose header read timeout
    /// closes it sooner anyway) with no request in flight for this long is closed gracefully
    /// (HTTP/2: GOAWAY). Default 75 s (nginx's `keepalive_timeout`).
    pub http2_idle_timeout: Duration,
    /// Most streams one HTTP/2 connection may have open (SETTINGS_MAX_CONCURRENT_STREAMS);
    /// more are refused (REFUSED_STREAM, which clients retry). Default 100 (Envoy's edge
    /// guide, HAProxy).
    pub http2_max_concurrent_streams: u32,
    /// Most requests of one HTTP/2 connection forwarded at once, so most upstream
    /// connections one client connection can hold; the others wait (streams stay open)
    /// until one finishes. An HTTP/1 connection has one request at a time anyway. Default
    /// 100, the stream cap: by default no admitted stream waits (a gRPC channel with many
    /// long-lived streams is not held back); lower it to bound one connection's upstreams.
    pub max_upstream_requests_per_connection: usize,
    /// Most mirror copies (RequestMirror) in flight at once; a copy past it is not sent
    /// (counted as `tollgate_upstream_errors_total{kind="mirror_overload"}`), so a slow or
    /// unreachable mirror backend cannot pile up tasks, sockets and buffered bodies. Default
    /// 1024.
    pub max_mirrors_in_flight: usize,
    /// The shared HTTP cache CachePolicy rules use (one memory bound, shareable by several
    /// proxies); `None`: no answer is cached and such rules are served as without one.
    pub cache: Option<Arc<crate::HttpCache>>,
}

impl ProxyOptions {
    /// A rate limiter on `storage` recording into this proxy's metrics. Fails only on a
    /// malformed Redis address.
    pub fn rate_limiter(
        &self,
        storage: Storage,
    ) -> std::result::Result<RateLimiter, RateLimitError> {
        RateLimiter::with_metrics(
            storage,
            Arc::new(SystemClock),
            self.metrics.rate_limit().clone(),
        )
    }
}

impl Default for ProxyOptions {
    fn default() -> Self {
        Self {
            metrics: Arc::new(Metrics::new()),
            access_log: false,
            access_log_settings: LogSettings::default(),
            tracing: None,
            max_header_bytes: 64 * 1024,
            max_body_bytes: 10 * 1024 * 1024,
            rate_limiter: None,
            stream_idle_timeout: Duration::from_secs(3600),
            udp_flow_idle_timeout: Duration::from_secs(60),
            udp_max_flows: 4096,
            max_mirrors_in_flight: 1024,
            cache: None,
            request_body_idle_timeout: Duration::from_secs(60),
            request_body_timeout: Duration::from_secs(300),
            request_body_min_rate: 256,
            request_body_rate_window: Duration::from_secs(60),
            http2_stream_idle_timeout: Duration::from_secs(300),
            http2_idle_timeout: Duration::from_secs(75),
            http2_max_concurrent_streams: 100,
            max_upstream_requests_per_connection: 100,
        }
    }
}

/// A socket's transport: a port whose protocol changes between TCP and UDP gets a new socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Transport {
    Tcp,
    Udp,
}

/// What a bound socket is keyed by.
type ListenerKey = (IpAddr, u16, Transport);

/// A socket bound for a new port, before its loop starts.
enum Socket {
    Tcp(TcpListener),
    Udp(tokio::net::UdpSocket),
}

#[derive(Debug)]
struct Inner {
    shared: Arc<Shared>,
    /// Sockets by (address, table port, transport); the lock also serializes `apply`.
    listeners: tokio::sync::Mutex<HashMap<ListenerKey, ListenerHandle>>,
    /// Bound addresses by table port, for [`Proxy::local_addr`].
    bound: Mutex<HashMap<u16, SocketAddr>>,
    shut_down: std::sync::atomic::AtomicBool,
}

/// The data plane: cheap to clone, all clones share one snapshot and one set of sockets.
#[derive(Debug, Clone)]
pub struct Proxy {
    inner: Arc<Inner>,
}

impl Proxy {
    /// Creates a proxy with no table: no sockets until the first [`Proxy::apply`].
    pub fn new(opts: ProxyOptions) -> Self {
        let limits = Limits {
            max_header_bytes: opts.max_header_bytes,
            max_header_count: tollgate_h1::MAX_HEADERS,
            max_body_bytes: opts.max_body_bytes,
            header_read_timeout: crate::limits::HEADER_READ_TIMEOUT,
            idle_timeout: crate::limits::HEADER_READ_TIMEOUT,
            max_connections_per_client: None,
            request_timeout: None,
            stream_idle_timeout: opts.stream_idle_timeout,
            udp_flow_idle_timeout: opts.udp_flow_idle_timeout,
            udp_max_flows: opts.udp_max_flows,
            request_body_idle_timeout: opts.request_body_idle_timeout,
            request_body_timeout: opts.request_body_timeout,
            request_body_min_rate: opts.request_body_min_rate,
            request_body_rate_window: opts.request_body_rate_window,
            http2_stream_idle_timeout: opts.http2_stream_idle_timeout,
            http2_idle_timeout: opts.http2_idle_timeout,
            http2_max_concurrent_streams: opts.http2_max_concurrent_streams,
            max_upstream_requests_per_connection: opts.max_upstream_requests_per_connection,
        };
        let limiter = match opts.rate_limiter.clone() {
            Some(l) => l,
            None => RateLimiter::in_memory(opts.metrics.rate_limit().clone()),
        };
        let policy = PolicyRuntime {
            auth: AuthState::new(opts.metrics.auth().clone()),
            limiter,
            decisions: opts.metrics.policy_decisions().clone(),
        };
        let health = HealthChecker::new(opts.metrics.clone());
        let tracer = opts
            .tracing
            .as_ref()
            .and_then(|t| crate::otel::Tracer::start(t, opts.metrics.trace_spans_dropped()));
        let shared = Shared {
            tracer,
            health,
            policy,
            snapshot: ArcSwapOption::empty(),
            limits,
            access_log: AccessLog::new(
                opts.access_log,
                &opts.access_log_settings,
                opts.metrics.clone(),
            ),
            metrics: opts.metrics,
            upstream: Upstream::new(),
            server: listener::server_builder(&limits),
            connections: AtomicUsize::new(0),
            idle: Notify::new(),
            per_client: Arc::default(),
            mirror_slots: Arc::new(tokio::sync::Semaphore::new(opts.max_mirrors_in_flight)),
            cache: opts.cache,
        };
        Self {
            inner: Arc::new(Inner {
                shared: Arc::new(shared),
                listeners: tokio::sync::Mutex::new(HashMap::new()),
                bound: Mutex::new(HashMap::new()),
                shut_down: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }

    /// Builds a new immutable snapshot (router, TLS configs, upstream balancers) and swaps it
    /// in atomically; binds sockets for new (address, port)s and closes sockets for ports no
    /// longer in the table. In-flight requests finish on the snapshot they started with. On
    /// error the old snapshot and sockets stay.
    ///
    /// Port 0 in the table binds an ephemeral port; see [`Proxy::local_addr`].
    pub async fn apply(&self, table: RouteTable) -> Result<()> {
        let shared = &self.inner.shared;
        let mut listeners = self.inner.listeners.lock().await;
        if self
            .inner
            .shut_down
            .load(std::sync::atomic::Ordering::Acquire)
        {
            return Err(ProxyError::Shutdown);
        }
        shared.access_log.start();

        // Build everything before touching anything live. Virtual hosts the table shares
        // with the live one (the same route lists) keep what was built for them.
        let prev = shared.snapshot.load_full();
        let router =
            Router::build_reusing(&table, prev.as_deref().map(|s| &s.router), &shared.metrics)?;
        let policies = crate::lifecycle::policy::enforce::build_all(
            &table.policies,
            &table.closed,
            &shared.policy,
        )?
        .into_iter()
        .collect();
        let mut ports = FastMap::with_capacity_and_hasher(table.ports.len(), Default::default());
        let mut wanted = Vec::with_capacity(table.ports.len());
        let mut clients = FastMap::default();
        for p in &table.ports {
            if let Some(c) = crate::lifecycle::client::PortClient::build(p.port, &p.client)? {
                clients.insert(p.port, Arc::new(c));
            }
            let ip: IpAddr = p.address.parse().map_err(|_| ProxyError::Address {
                address: p.address.clone(),
                port: p.port,
            })?;
            let state = match p.protocol {
                Protocol::Http => PortState::Http,
                Protocol::Https => PortState::Https(Arc::new(crate::downstream::tls::port_tls(p)?)),
                Protocol::Tls => {
                    PortState::Tls(Arc::new(crate::downstream::tls::TlsPort::build(p)?))
                }
                Protocol::Tcp => PortState::Tcp,
                Protocol::Udp => PortState::Udp,
            };
            let transport = match p.protocol {
                Protocol::Udp => Transport::Udp,
                _ => Transport::Tcp,
            };
            ports.insert(p.port, state);
            wanted.push((ip, p.port, transport));
        }
        let backends = build_balancers(
            &table.backends,
            prev.as_deref().map(|s| &s.backends),
            &shared.upstream,
        )?;

        // Bind new sockets; on failure the new ones are dropped (closed) and nothing changed.
        let mut fresh = Vec::new();
        for &key @ (ip, port, transport) in &wanted {
            if listeners.contains_key(&key) {
                continue;
            }
            let addr = SocketAddr::new(ip, port);
            let socket = match transport {
                Transport::Tcp => TcpListener::bind(addr).await.map(Socket::Tcp),
                Transport::Udp => tokio::net::UdpSocket::bind(addr).await.map(Socket::Udp),
            }
            .map_err(|source| ProxyError::Bind { addr, source })?;
            fresh.push((key, socket));
        }

        let version = table.version;
        // Endpoints come and go all day: only a change to what an answer may depend on keeps
        // the answers in flight out of the cache.
        let answers_changed = prev
            .as_deref()
            .is_none_or(|p| more_than_endpoints(&p.table, &table));
        let snapshot = Arc::new(Snapshot {
            version,
            router,
            backends,
            ports,
            policies,
            clients,
            table: Arc::new(table),
        });
        shared.snapshot.store(Some(snapshot.clone()));
        if let Some(cache) = shared.cache.as_ref().filter(|_| answers_changed) {
            cache.table_changed();
        }
        // After the store, not beside `build_balancers`: an apply that fails before it keeps
        // the old snapshot, whose endpoints must stay checked.
        shared.health.sync(&snapshot.backends);
        shared.metrics.set_table_version(version);

        for (key, socket) in fresh {
            let spawned = match socket {
                Socket::Tcp(s) => listener::spawn(shared.clone(), s, key.1),
                Socket::Udp(s) => crate::downstream::udp::spawn(shared.clone(), s, key.1),
            };
            match spawned {
                Ok(handle) => {
                    listeners.insert(key, handle);
                }
                Err(e) => tracing::error!(error = %e, port = key.1, "listener failed to start"),
            }
        }
        let gone: Vec<ListenerKey> = listeners
            .keys()
            .filter(|k| !wanted.contains(k))
            .copied()
            .collect();
        for key in gone {
            if let Some(handle) = listeners.remove(&key) {
                handle.stop().await;
            }
        }
        self.record_bound(&listeners);
        tracing::info!(version, ports = listeners.len(), "route table applied");
        Ok(())
    }

    fn record_bound(&self, listeners: &HashMap<ListenerKey, ListenerHandle>) {
        if let Ok(mut bound) = self.inner.bound.lock() {
            *bound = listeners
                .iter()
                .map(|((_, port, _), h)| (*port, h.local_addr))
                .collect();
        }
    }

    /// The table being served, `None` before the first.
    pub fn table(&self) -> Option<Arc<RouteTable>> {
        self.inner
            .shared
            .snapshot
            .load_full()
            .map(|s| s.table.clone())
    }

    /// How the live table decides `req` (`tollgate explain`, `/debug/explain`); `None` before
    /// the first table. Policies run as [`crate::explain`] says: on fresh counters, never on
    /// the live ones (explaining a request must not count it).
    pub async fn explain(
        &self,
        req: &crate::explain::ExplainRequest,
    ) -> Option<std::result::Result<crate::explain::Explanation, crate::explain::ExplainError>>
    {
        let snapshot = self.inner.shared.snapshot.load_full()?;
        Some(crate::explain::explain_with(&snapshot.table, &snapshot.router, req).await)
    }

    /// Version of the live table (0 before the first apply).
    pub fn version(&self) -> u64 {
        self.inner
            .shared
            .snapshot
            .load()
            .as_ref()
            .map_or(0, |s| s.version)
    }

    /// The address actually bound for a table port (differs from the table for port 0).
    pub fn local_addr(&self, port: u16) -> Option<SocketAddr> {
        self.inner.bound.lock().ok()?.get(&port).copied()
    }

    /// Closes every socket, lets open connections finish their requests (up to 10 s), and
    /// refuses further applies.
    pub async fn shutdown(&self) {
        let mut listeners = self.inner.listeners.lock().await;
        self.inner
            .shut_down
            .store(true, std::sync::atomic::Ordering::Release);
        // Nothing will be routed any more: stop probing the backends.
        self.inner.shared.health.stop();
        for (_, handle) in listeners.drain() {
            handle.stop().await;
        }
        self.record_bound(&listeners);
        let shared = &self.inner.shared;
        let drained = async {
            loop {
                let idle = shared.idle.notified();
                if shared
                    .connections
                    .load(std::sync::atomic::Ordering::Acquire)
                    == 0
                {
                    return;
                }
                idle.await;
            }
        };
        let _ = tokio::time::timeout(DRAIN_TIMEOUT, drained).await;
        // The last requests' lines, which the writer thread would take within its interval.
        shared.access_log.flush();
    }
}

/// True when `new` differs from `old` in more than its version and its backends' endpoints
/// (every field named, so a field added to the table is compared until said otherwise).
fn more_than_endpoints(old: &RouteTable, new: &RouteTable) -> bool {
    let RouteTable {
        version: _,
        gateway,
        ports,
        backends,
        policies,
        closed,
    } = new;
    *gateway != old.gateway
        || *ports != old.ports
        || *policies != old.policies
        || *closed != old.closed
        || backends.len() != old.backends.len()
        || backends
            .iter()
            .zip(&old.backends)
            .any(|((name, b), (old_name, old_b))| name != old_name || !same_but_endpoints(b, old_b))
}

fn same_but_endpoints(a: &Backend, b: &Backend) -> bool {
    let Backend {
        protocol,
        load_balancer,
        endpoints: _,
        settings,
        tls,
    } = a;
    *protocol == b.protocol
        && *load_balancer == b.load_balancer
        && *settings == b.settings
        && *tls == b.tls
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_needs_no_runtime_and_serves_nothing_yet() {
        let p = Proxy::new(ProxyOptions::default());
        assert_eq!(p.version(), 0);
        assert!(p.local_addr(80).is_none());
        let o = ProxyOptions::default();
        assert_eq!((o.max_header_bytes, o.max_body_bytes), (65_536, 10_485_760));
        assert!(!o.access_log);
    }
}
