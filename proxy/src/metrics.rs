//! Prometheus metrics of the data plane. In: one observation per request, connection and
//! table swap. Out: OpenMetrics text from [`Metrics::encode`], served by
//! [`crate::admin::serve_admin`].
//!
//! Labels stay low-cardinality: the route label is the HTTPRoute `namespace/name` and the
//! backend label the table's backend key (both bounded by the configuration, never by
//! traffic), the status is a class (`2xx`..`5xx`), and upstream errors carry a fixed `kind`.

use std::sync::{Arc, Mutex, OnceLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::FastMap;
use crate::lifecycle::policy::auth::AuthMetrics;
use crate::lifecycle::policy::decisions::PolicyDecisions;
use crate::lifecycle::policy::ratelimit::RateLimitMetrics;

mod backend;
mod cache;
mod compression;
pub(crate) use backend::BackendMetrics;
pub(crate) use cache::CacheMetrics;
pub(crate) use compression::{CompressionCounters, CompressionMetrics};

/// Labels of `tollgate_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: String,
    code_class: &'static str,
}

/// Labels of `tollgate_request_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: String,
}

/// Labels of `tollgate_upstream_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

/// Labels of `tollgate_tls_connections_total` and `tollgate_tcp_connections_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

/// How a connection on a TLS (TLSRoute) or TCP (TCPRoute) port ended: the `outcome` label of
/// `tollgate_tls_connections_total` and `tollgate_tcp_connections_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamOutcome {
    /// Copied to a backend until one side closed.
    Served,
    /// No whole, valid ClientHello in time (or over the size limit).
    BadHello,
    /// No listener or route takes the SNI (TLS), or the port has no route (TCP).
    NoRoute,
    /// The route's backends are unresolved or have no endpoints.
    NoBackend,
    /// Connecting to the endpoint failed.
    ConnectFailed,
    /// TLS termination failed (terminating listeners).
    HandshakeFailed,
    /// The listener stopped (port removed, shutdown).
    Stopped,
    /// Closed after the idle timeout with no traffic.
    Idle,
}

impl StreamOutcome {
    fn as_str(self) -> &'static str {
        match self {
            Self::Served => "served",
            Self::BadHello => "bad_hello",
            Self::NoRoute => "no_route",
            Self::NoBackend => "no_backend",
            Self::ConnectFailed => "connect_failed",
            Self::HandshakeFailed => "handshake_failed",
            Self::Stopped => "stopped",
            Self::Idle => "idle",
        }
    }
}

/// Which way a forwarded UDP datagram went: the `direction` label of
/// `tollgate_udp_datagrams_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UdpDirection {
    /// From a client to its flow's endpoint.
    ToBackend,
    /// From an endpoint back to its client.
    ToClient,
}

/// Labels of `tollgate_udp_datagrams_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabels {
    direction: &'static str,
}

/// Route label used when no route matched.
pub(crate) const NO_ROUTE: &str = "none";

fn duration_histogram() -> Histogram {
    // 1 ms .. ~32 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// The proxy's metrics and the registry that encodes them.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    durations: Family<RouteLabels, Histogram, fn() -> Histogram>,
    upstream_errors: Family<KindLabels, Counter>,
    tls_connections: Family<OutcomeLabels, Counter>,
    tcp_connections: Family<OutcomeLabels, Counter>,
    tcp_active: Gauge,
    udp_datagrams: Family<DirectionLabels, Counter>,
    udp_dropped: Family<ReasonLabels, Counter>,
    udp_flows: Gauge,
    client_timeouts: Family<KindLabels, Counter>,
    proxy_protocol_refused: Family<ReasonLabels, Counter>,
    connections_refused: Family<ReasonLabels, Counter>,
    active_connections: Gauge,
    table_version: Gauge,
    access_log_dropped: Counter,
    trace_spans_dropped: Counter,
    /// Handles per route label, kept across snapshots.
    routes: Mutex<FastMap<String, Arc<RouteMetrics>>>,
    no_route: Arc<RouteMetrics>,
    auth: AuthMetrics,
    rate_limit: RateLimitMetrics,
    policy_decisions: PolicyDecisions,
    backend: BackendMetrics,
    compression: CompressionMetrics,
    cache: CacheMetrics,
}

/// The metric handles of one route label, resolved once so a request records its outcome
/// with atomic operations only (no label allocation, no family lookup).
#[derive(Debug)]
pub(crate) struct RouteMetrics {
    label: String,
    requests: Family<RequestLabels, Counter>,
    /// 1xx..5xx, created on first use so unused classes do not show up as zero series.
    by_class: [OnceLock<Counter>; 5],
    durations: Family<RouteLabels, Histogram, fn() -> Histogram>,
    /// Created on first use too: with 10k routes, a histogram for each before any request
    /// was ~6 MB of a proxy's memory and 10k empty series in every scrape.
    duration: OnceLock<Histogram>,
}

impl RouteMetrics {
    fn new(
        label: &str,
        metrics: &Family<RequestLabels, Counter>,
        durations: &Family<RouteLabels, Histogram, fn() -> Histogram>,
    ) -> Self {
        Self {
            label: label.to_owned(),
            requests: metrics.clone(),
            by_class: Default::default(),
            durations: durations.clone(),
            duration: OnceLock::new(),
        }
    }

    /// Records one answered request.
    pub fn observe(&self, status: u16, seconds: f64) {
        let (i, code_class) = match status {
            100..=199 => (0, "1xx"),
            200..=299 => (1, "2xx"),
            300..=399 => (2, "3xx"),
            400..=499 => (3, "4xx"),
            _ => (4, "5xx"),
        };
        self.by_class[i]
            .get_or_init(|| {
                self.requests
                    .get_or_create(&RequestLabels {
                        route: self.label.clone(),
                        code_class,
                    })
                    .clone()
            })
            .inc();
        self.duration
            .get_or_init(|| {
                self.durations
                    .get_or_create(&RouteLabels {
                        route: self.label.clone(),
                    })
                    .clone()
            })
            .observe(seconds);
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Labels of `tollgate_proxy_protocol_refused_total`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// Why the proxy cut a slow or idle client off: the `kind` label of
/// `tollgate_client_timeouts_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClientTimeoutKind {
    /// A request body the client stopped sending (the idle timeout; on HTTP/2 the stream
    /// idle timeout).
    BodyIdle,
    /// A request body sent below the minimum rate.
    BodyRate,
    /// A request body not finished within the total request-body deadline.
    BodyDeadline,
    /// A connection with no request in flight for the idle timeout (closed gracefully).
    ConnectionIdle,
}

impl ClientTimeoutKind {
    /// The label value (also the access log's `client_timeout`).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::BodyIdle => "body_idle",
            Self::BodyRate => "body_rate",
            Self::BodyDeadline => "body_deadline",
            Self::ConnectionIdle => "connection_idle",
        }
    }
}

/// Kinds of upstream error (the `kind` label of `tollgate_upstream_errors_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UpstreamErrorKind {
    /// Could not connect (refused, unreachable).
    Connect,
    /// The TLS handshake with a backend failed (its certificate not trusted or not for the
    /// name asked, our client certificate refused).
    Tls,
    /// The connection failed after connecting (reset, protocol error).
    Reset,
    /// An attempt or the whole request timed out.
    Timeout,
    /// No endpoints to send to.
    NoEndpoints,
    /// A mirrored request failed or timed out (never affects the client).
    Mirror,
    /// A mirror copy was not sent: as many as the proxy allows were in flight already.
    MirrorOverload,
}

impl UpstreamErrorKind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Tls => "tls",
            Self::Reset => "reset",
            Self::Timeout => "timeout",
            Self::NoEndpoints => "no_endpoints",
            Self::Mirror => "mirror",
            Self::MirrorOverload => "mirror_overload",
        }
    }
}

impl Metrics {
    /// Creates and registers every metric under the `tollgate_` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("tollgate");
        let requests = Family::<RequestLabels, Counter>::default();
        let durations = Family::<RouteLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            duration_histogram as fn() -> Histogram,
        );
        let upstream_errors = Family::<KindLabels, Counter>::default();
        let active_connections = Gauge::default();
        let tls_connections = Family::<OutcomeLabels, Counter>::default();
        let tcp_connections = Family::<OutcomeLabels, Counter>::default();
        let tcp_active = Gauge::default();
        let udp_datagrams = Family::<DirectionLabels, Counter>::default();
        let udp_dropped = Family::<ReasonLabels, Counter>::default();
        let udp_flows = Gauge::default();
        let client_timeouts = Family::<KindLabels, Counter>::default();
        let proxy_protocol_refused = Family::<ReasonLabels, Counter>::default();
        let connections_refused = Family::<ReasonLabels, Counter>::default();
        let table_version = Gauge::default();
        let access_log_dropped = Counter::default();
        let trace_spans_dropped = Counter::default();
        registry.register(
            "requests",
            "Requests answered, by route and status class",
            requests.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time from request received until the response body was sent, by route",
            durations.clone(),
        );
        registry.register(
            "upstream_errors",
            "Upstream failures, by kind",
            upstream_errors.clone(),
        );
        registry.register(
            "tls_connections",
            "Connections on TLS (TLSRoute) ports, by outcome",
            tls_connections.clone(),
        );
        registry.register(
            "tcp_connections",
            "Connections on TCP (TCPRoute) ports, by outcome",
            tcp_connections.clone(),
        );
        registry.register(
            "tcp_connections_active",
            "Connections on TCP (TCPRoute) ports open now",
            tcp_active.clone(),
        );
        registry.register(
            "udp_datagrams",
            "UDP (UDPRoute) datagrams forwarded, by direction (to_backend, to_client)",
            udp_datagrams.clone(),
        );
        registry.register(
            "udp_dropped",
            "UDP (UDPRoute) datagrams dropped, by reason",
            udp_dropped.clone(),
        );
        registry.register(
            "udp_flows_active",
            "UDP (UDPRoute) flows (client addresses) open now",
            udp_flows.clone(),
        );
        registry.register(
            "client_timeouts",
            "Slow or idle clients cut off, by kind (body_idle, body_rate, body_deadline, connection_idle)",
            client_timeouts.clone(),
        );
        registry.register(
            "proxy_protocol_refused",
            "Connections closed for a missing, malformed or slow PROXY protocol header, by reason",
            proxy_protocol_refused.clone(),
        );
        registry.register(
            "connections_refused",
            "Client connections closed unanswered at accept, by reason (per_client_limit)",
            connections_refused.clone(),
        );
        registry.register(
            "active_connections",
            "Client connections currently open",
            active_connections.clone(),
        );
        registry.register(
            "route_table_version",
            "Version of the live route table",
            table_version.clone(),
        );
        registry.register(
            "access_log_dropped",
            "Access log lines dropped because the writer fell behind",
            access_log_dropped.clone(),
        );
        registry.register(
            "trace_spans_dropped",
            "Trace spans dropped because the export queue was full (the collector fell behind)",
            trace_spans_dropped.clone(),
        );
        let auth = AuthMetrics::new();
        auth.register(&mut registry);
        let rate_limit = RateLimitMetrics::new();
        rate_limit.register(&mut registry);
        let policy_decisions = PolicyDecisions::new();
        policy_decisions.register(&mut registry);
        let backend = BackendMetrics::new();
        backend.register(&mut registry);
        let compression = CompressionMetrics::new();
        compression.register(&mut registry);
        let cache = CacheMetrics::new();
        cache.register(&mut registry);
        let no_route = Arc::new(RouteMetrics::new(NO_ROUTE, &requests, &durations));
        Self {
            auth,
            rate_limit,
            policy_decisions,
            backend,
            compression,
            cache,
            registry,
            no_route,
            routes: Mutex::new(FastMap::default()),
            requests,
            durations,
            upstream_errors,
            tls_connections,
            tcp_connections,
            tcp_active,
            udp_datagrams,
            udp_dropped,
            udp_flows,
            proxy_protocol_refused,
            connections_refused,
            client_timeouts,
            active_connections,
            table_version,
            access_log_dropped,
            trace_spans_dropped,
        }
    }

    /// Authentication metrics (shared handles, registered here).
    pub fn auth(&self) -> &AuthMetrics {
        &self.auth
    }

    /// Backend metrics: retries, the circuit breaker, outlier detection, health checks.
    pub(crate) fn backend(&self) -> &BackendMetrics {
        &self.backend
    }

    /// The shared cache's handles.
    pub(crate) fn cache(&self) -> &CacheMetrics {
        &self.cache
    }

    /// The compression counters of one algorithm.
    pub(crate) fn compression(&self, e: tollgate_api::client::Encoding) -> CompressionCounters {
        self.compression.of(e)
    }

    /// Rate-limit metrics (shared handles, registered here).
    pub fn rate_limit(&self) -> &RateLimitMetrics {
        &self.rate_limit
    }

    /// Per-policy decision counters (shared handles, registered here).
    pub fn policy_decisions(&self) -> &PolicyDecisions {
        &self.policy_decisions
    }

    /// Encodes every metric as OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// The handles of a route label (created once, then shared by every snapshot).
    pub(crate) fn route(&self, label: &str) -> Arc<RouteMetrics> {
        let Ok(mut routes) = self.routes.lock() else {
            return Arc::new(RouteMetrics::new(label, &self.requests, &self.durations));
        };
        self.handles(&mut routes, label)
    }

    fn handles(
        &self,
        routes: &mut FastMap<String, Arc<RouteMetrics>>,
        label: &str,
    ) -> Arc<RouteMetrics> {
        // A label seen before (most of a new table's) is found without copying it.
        if let Some(handles) = routes.get(label) {
            return handles.clone();
        }
        let handles = Arc::new(RouteMetrics::new(label, &self.requests, &self.durations));
        routes.insert(label.to_owned(), handles.clone());
        handles
    }

    /// The handles for requests no route matched.
    pub(crate) fn no_route(&self) -> &Arc<RouteMetrics> {
        &self.no_route
    }

    /// Counts an upstream error.
    pub(crate) fn upstream_error(&self, kind: UpstreamErrorKind) {
        self.upstream_errors
            .get_or_create(&KindLabels {
                kind: kind.as_str(),
            })
            .inc();
    }

    /// Counts a slow or idle client cut off.
    pub(crate) fn client_timeout(&self, kind: ClientTimeoutKind) {
        self.client_timeouts
            .get_or_create(&KindLabels {
                kind: kind.as_str(),
            })
            .inc();
    }

    /// Counts a connection closed for its PROXY protocol header (`reason`: a fixed label of
    /// `ProxyProtocolError::reason`).
    pub(crate) fn proxy_protocol_refused(&self, reason: &'static str) {
        self.proxy_protocol_refused
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Counts a connection closed unanswered at accept (`reason`: a fixed label).
    pub(crate) fn connection_refused(&self, reason: &'static str) {
        self.connections_refused
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Counts a finished connection of a TLS port.
    pub(crate) fn tls_connection(&self, outcome: StreamOutcome) {
        self.tls_connections
            .get_or_create(&OutcomeLabels {
                outcome: outcome.as_str(),
            })
            .inc();
    }

    /// Counts a finished connection of a TCP port.
    pub(crate) fn tcp_connection(&self, outcome: StreamOutcome) {
        self.tcp_connections
            .get_or_create(&OutcomeLabels {
                outcome: outcome.as_str(),
            })
            .inc();
    }

    /// A connection of a TCP port opened; the guard counts it closed when dropped.
    pub(crate) fn tcp_opened(&self) -> ConnectionGuard {
        self.tcp_active.inc();
        ConnectionGuard(self.tcp_active.clone())
    }

    /// Counts a forwarded UDP datagram.
    pub(crate) fn udp_datagram(&self, direction: UdpDirection) {
        let direction = match direction {
            UdpDirection::ToBackend => "to_backend",
            UdpDirection::ToClient => "to_client",
        };
        self.udp_datagrams
            .get_or_create(&DirectionLabels { direction })
            .inc();
    }

    /// Counts a dropped UDP datagram.
    pub(crate) fn udp_dropped(&self, reason: &'static str) {
        self.udp_dropped
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// A UDP flow opened; the guard counts it closed when dropped.
    pub(crate) fn udp_flow_opened(&self) -> ConnectionGuard {
        self.udp_flows.inc();
        ConnectionGuard(self.udp_flows.clone())
    }

    /// A client connection opened; the guard closes it when dropped.
    pub(crate) fn connection_opened(&self) -> ConnectionGuard {
        self.active_connections.inc();
        ConnectionGuard(self.active_connections.clone())
    }

    /// Records the live table version.
    pub(crate) fn set_table_version(&self, version: u64) {
        self.table_version
            .set(i64::try_from(version).unwrap_or(i64::MAX));
    }

    /// Counts an access log line dropped under back-pressure.
    /// `tollgate_trace_spans_dropped_total`, for the tracer to count on.
    pub(crate) fn trace_spans_dropped(&self) -> Counter {
        self.trace_spans_dropped.clone()
    }

    pub(crate) fn access_log_dropped(&self) {
        self.access_log_dropped.inc();
    }
}

/// Decrements `tollgate_active_connections` when dropped.
#[derive(Debug)]
pub(crate) struct ConnectionGuard(Gauge);

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_request_counters_with_classes() {
        let m = Metrics::new();
        let shop = m.route("default/shop");
        shop.observe(204, 0.01);
        m.route("default/shop").observe(503, 0.01);
        assert!(Arc::ptr_eq(&shop, &m.route("default/shop")));
        m.upstream_error(UpstreamErrorKind::Connect);
        m.set_table_version(7);
        m.client_timeout(ClientTimeoutKind::BodyRate);
        let text = m.encode();
        assert!(
            text.contains(r#"tollgate_requests_total{route="default/shop",code_class="2xx"} 1"#),
            "{text}"
        );
        assert!(text.contains(r#"code_class="5xx""#), "{text}");
        assert!(
            !text.contains(r#"code_class="3xx""#),
            "unused classes stay absent: {text}"
        );
        assert!(text.contains(r#"tollgate_upstream_errors_total{kind="connect"} 1"#));
        assert!(text.contains("tollgate_route_table_version 7"));
        assert!(
            text.contains(r#"tollgate_client_timeouts_total{kind="body_rate"} 1"#),
            "{text}"
        );
        assert!(text.contains("tollgate_request_duration_seconds_bucket"));
    }

    #[test]
    fn a_route_has_no_duration_series_before_its_first_request() {
        let m = Metrics::new();
        let idle = m.route("default/idle");
        let text = m.encode();
        assert!(
            !text.contains(r#"route="default/idle""#),
            "a route no request took shows no series: {text}"
        );
        idle.observe(200, 0.02);
        let text = m.encode();
        assert!(
            text.contains(r#"tollgate_request_duration_seconds_count{route="default/idle"} 1"#),
            "{text}"
        );
    }

    #[test]
    fn encodes_health_check_counters_and_the_healthy_endpoints_gauge() {
        let m = Metrics::new();
        m.backend().health_check(true);
        m.backend().health_check(true);
        m.backend().health_check(false);
        m.backend().health_transition(false);
        m.backend().set_healthy_endpoints("default/web:80", 2);
        let text = m.encode();
        for line in [
            r#"tollgate_health_checks_total{result="pass"} 2"#,
            r#"tollgate_health_checks_total{result="fail"} 1"#,
            r#"tollgate_health_check_transitions_total{to="unhealthy"} 1"#,
            r#"tollgate_backend_healthy_endpoints{backend="default/web:80"} 2"#,
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        m.backend().remove_healthy_endpoints("default/web:80");
        assert!(!m.encode().contains("default/web:80"));
    }

    #[test]
    fn connection_guard_tracks_open_connections() {
        let m = Metrics::new();
        let g = m.connection_opened();
        assert!(m.encode().contains("tollgate_active_connections 1"));
        drop(g);
        assert!(m.encode().contains("tollgate_active_connections 0"));
    }
}
