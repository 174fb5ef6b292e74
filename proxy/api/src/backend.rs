//! What a BackendPolicy (tollgate.dev/v1alpha1) sets on a backend: the key of a consistent
//! hash, the circuit breaker's limits, passive outlier detection, active health checks and
//! connection settings. Every field is optional; an empty [`BackendSettings`] is a backend
//! as it was before BackendPolicy existed, and is left out of the serialized table.

use serde::{Deserialize, Serialize};

/// A backend's BackendPolicy settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendSettings {
    /// What a `ConsistentHash` balancer hashes; `None` for the other balancers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<HashOn>,
    /// Limits per proxy on what the backend may be asked at once.
    #[serde(default, skip_serializing_if = "CircuitBreaker::is_empty")]
    pub circuit_breaker: CircuitBreaker,
    /// Passive ejection of endpoints that keep failing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outlier: Option<OutlierDetection>,
    /// Active checks of each endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheck>,
    /// Below this percentage of endpoints available (neither ejected nor failing their
    /// health checks), every endpoint is used again: a gateway that trusts its checks down to
    /// zero endpoints turns a checking mistake into an outage.
    #[serde(default = "default_panic", skip_serializing_if = "is_default_panic")]
    pub panic_threshold_percent: u32,
    /// Upstream connection settings.
    #[serde(default, skip_serializing_if = "Connection::is_empty")]
    pub connection: Connection,
    /// The share of requests that may be retries (XBackendTrafficPolicy `retryConstraint`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_budget: Option<RetryBudget>,
    /// Session persistence for every route to the backend (XBackendTrafficPolicy
    /// `sessionPersistence`); a route rule's own wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<Session>,
}

/// A retry budget (GEP-3388): retries within the last `interval_ms` may be at most `percent`
/// of the requests in it, or `min_retries` per `min_interval_ms`, whichever is more.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetryBudget {
    pub percent: u32,
    pub interval_ms: u64,
    pub min_retries: u32,
    pub min_interval_ms: u64,
}

/// The panic threshold when a policy gives none (Envoy's default too).
pub const DEFAULT_PANIC_THRESHOLD_PERCENT: u32 = 50;

fn default_panic() -> u32 {
    DEFAULT_PANIC_THRESHOLD_PERCENT
}

fn is_default_panic(p: &u32) -> bool {
    *p == DEFAULT_PANIC_THRESHOLD_PERCENT
}

impl Default for BackendSettings {
    fn default() -> Self {
        Self {
            hash: None,
            circuit_breaker: CircuitBreaker::default(),
            outlier: None,
            health_check: None,
            panic_threshold_percent: DEFAULT_PANIC_THRESHOLD_PERCENT,
            connection: Connection::default(),
            retry_budget: None,
            session: None,
        }
    }
}

impl BackendSettings {
    /// True when no policy sets anything.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// What a consistent hash is computed over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum HashOn {
    /// A request header (name lower-case); a request without it is balanced least-request.
    Header(String),
    /// A cookie; a request without it gets one (`Set-Cookie`, the value random) so that its
    /// next requests stay.
    Cookie {
        name: String,
        /// `Max-Age` of the cookie set; `None`: a session cookie.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ttl_secs: Option<u64>,
    },
    /// The client address (as a ClientPolicy resolves it).
    SourceIp,
    /// A CEL expression over the request (as policies see it), its string value.
    Expression(String),
}

/// Per proxy and backend: beyond a limit the proxy answers 503 at once, counted in
/// `tollgate_circuit_breaker_rejections_total{limit}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CircuitBreaker {
    /// Upstream exchanges at once (each HTTP/1.1 exchange holds one connection).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
    /// Requests waiting for one of `max_connections`; beyond, 503. `None`: none wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pending_requests: Option<u32>,
    /// Requests at once, waiting or in flight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_requests: Option<u32>,
    /// Retries at once; beyond, a failed attempt is answered as it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_retries: Option<u32>,
}

impl CircuitBreaker {
    /// True when no limit is set.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// Passive outlier detection: an endpoint whose answers fail this many times in a row is
/// left out for `base_ejection_ms` times the number of its ejections.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutlierDetection {
    /// Consecutive 5xx answers (and local failures: connect, reset, timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_5xx: Option<u32>,
    /// Consecutive 502, 503, 504 answers and local failures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_gateway_errors: Option<u32>,
    /// Consecutive local failures only (connect, reset, timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_local_origin_failures: Option<u32>,
    /// How often an endpoint's ejection count decays by one while it stays in.
    pub interval_ms: u64,
    /// Ejection time for a first ejection.
    pub base_ejection_ms: u64,
    /// Most of the backend's endpoints ejected at once (at least one may always be).
    pub max_ejection_percent: u32,
}

/// Active health checks of every endpoint of the backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthCheck {
    /// What a check is.
    pub probe: Probe,
    /// Between two checks of an endpoint (plus up to a tenth of jitter).
    pub interval_ms: u64,
    /// A check that takes longer fails.
    pub timeout_ms: u64,
    /// Failed checks in a row that take a healthy endpoint out.
    pub unhealthy_threshold: u32,
    /// Passed checks in a row that bring an unhealthy endpoint back.
    pub healthy_threshold: u32,
}

/// One health check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Probe {
    /// An HTTP/1.1 GET (h2c for h2c backends); passes on one of `expected_statuses`.
    Http {
        path: String,
        /// `Host`; `None`: the endpoint's address.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        host: Option<String>,
        expected_statuses: Vec<u16>,
    },
    /// gRPC health checking protocol v1 (`grpc.health.v1.Health/Check`); passes on SERVING.
    Grpc {
        /// The service asked about; empty: the server as a whole.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        service: String,
    },
    /// A TCP connect.
    Tcp,
}

/// Upstream connection settings; `None` keeps the proxy's default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Connection {
    /// TCP connect, and then a TLS handshake, each (5 s by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_timeout_ms: Option<u64>,
    /// An idle pooled connection is closed after this long (about 30-60 s by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_ms: Option<u64>,
    /// A connection is closed after this many requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_requests_per_connection: Option<u32>,
    /// TCP keepalive: probes after this long idle (30 s by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_keepalive_idle_ms: Option<u64>,
    /// A new endpoint's share of requests grows from little to full over this window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slow_start_ms: Option<u64>,
}

impl Connection {
    /// True when nothing is set.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// Session persistence (GEP-1619): the gateway names the endpoint that served a client's
/// first request in a cookie or header, and sends the client's next requests there while
/// that endpoint is available and the session has not timed out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Session {
    /// The cookie or header name.
    pub name: String,
    /// Where the session travels.
    pub carrier: SessionCarrier,
    /// A session ends this long after it began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub absolute_secs: Option<u64>,
    /// A session ends this long after its last request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_secs: Option<u64>,
    /// The cookie outlives the browser session (`Max-Age` from `absolute_secs`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub permanent: bool,
}

/// How a session travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SessionCarrier {
    Cookie,
    Header,
}
