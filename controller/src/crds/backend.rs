//! BackendPolicy: how the proxies treat a Service's endpoints. Balancing (including a
//! consistent hash with bounded load), a circuit breaker, passive outlier detection, active
//! health checks and connection settings.
//!
//! Attachment: Services in the policy's namespace (`group: ""`, `kind: Service`), or one port
//! of one (`sectionName`: the port's name). A port's policy wins over its Service's; between
//! two of the same reach, the older wins and the other is `Conflicted` there.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::PolicyStatus;

/// Balancing, circuit breaking, outlier detection, health checks and connection settings
/// for the endpoints of Services.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "tollgate.dev",
    version = "v1alpha1",
    kind = "BackendPolicy",
    plural = "backendpolicies",
    shortname = "bp",
    namespaced,
    status = "PolicyStatus",
    printcolumn = r#"{"name":"Accepted","type":"string","jsonPath":".status.conditions[?(@.type==\"Accepted\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = Rule::new("!has(self.spec.loadBalancer) || !has(self.spec.loadBalancer.consistentHash) || self.spec.loadBalancer.type == 'ConsistentHash'").message("spec.loadBalancer.consistentHash is for type ConsistentHash"),
    validation = Rule::new("!has(self.spec.loadBalancer) || self.spec.loadBalancer.type != 'ConsistentHash' || has(self.spec.loadBalancer.consistentHash)").message("type ConsistentHash needs spec.loadBalancer.consistentHash")
)]
#[serde(rename_all = "camelCase")]
pub struct BackendPolicySpec {
    /// The Services (or ports of them, by `sectionName`) the policy applies to (1 to 16).
    #[schemars(length(min = 1, max = 16))]
    pub target_refs: Vec<ServiceRef>,
    /// How a request's endpoint is chosen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancer: Option<LoadBalancerSpec>,
    /// Limits per proxy on what the Service may be asked at once; beyond them, 503 at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit_breaker: Option<CircuitBreakerSpec>,
    /// Leave out, for a while, an endpoint whose answers keep failing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outlier_detection: Option<OutlierDetectionSpec>,
    /// Check each endpoint actively and leave out those that fail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheckSpec>,
    /// Upstream connection settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<ConnectionSpec>,
}

/// A Service, or one port of it, in the policy's namespace.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceRef {
    /// `""` (the core group).
    #[serde(default)]
    pub group: String,
    /// `Service`.
    pub kind: String,
    /// Name of the Service.
    pub name: String,
    /// The name of one of the Service's ports; the whole Service when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
}

/// The balancing algorithm.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerSpec {
    /// `LeastRequest` (power of two choices, the default), `RoundRobin`, `Random` or
    /// `ConsistentHash`.
    #[serde(rename = "type")]
    pub kind: LoadBalancerType,
    /// What a `ConsistentHash` hashes: exactly one of its fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consistent_hash: Option<ConsistentHashSpec>,
    /// A new endpoint's share grows from little to full over this window (`30s`), so a
    /// cold instance is not flooded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slow_start: Option<String>,
}

/// Balancing algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum LoadBalancerType {
    LeastRequest,
    RoundRobin,
    Random,
    ConsistentHash,
}

/// The key of a consistent hash: exactly one field. Keys spread evenly over the endpoints
/// and stay on theirs while it is up and not far above the mean load (bounded load); adding
/// or removing one of N endpoints moves about 1/N of them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConsistentHashSpec {
    /// A request header; a request without it is balanced least-request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// A cookie; a client without it gets one, so that its next requests stay together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie: Option<HashCookie>,
    /// The client address (as a ClientPolicy resolves it behind load balancers).
    #[serde(rename = "sourceIP", default, skip_serializing_if = "Option::is_none")]
    pub source_ip: Option<Empty>,
    /// A CEL expression over the request, with the variables of AuthPolicy and
    /// RateLimitPolicy expressions (`request`, `source`, `auth.identity`):
    /// `auth.identity.sub`, `request.headers['x-tenant'] + request.url_path`. Its string value
    /// is the key (ints, uints, doubles and bools printed); a request whose expression fails
    /// or gives anything else (no identity, a missing field) is balanced least-request. An
    /// expression that does not compile makes the policy `Invalid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expression: Option<String>,
}

/// A field whose presence is the setting.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Empty {}

/// The consistent-hash cookie.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HashCookie {
    /// Cookie name.
    pub name: String,
    /// `Max-Age` of the cookie the gateway sets (`1h`); a session cookie when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
}

/// Circuit breaker limits, per proxy replica and Service port.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CircuitBreakerSpec {
    /// Requests being exchanged with the endpoints at once (each HTTP/1.1 exchange holds a
    /// connection).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub max_connections: Option<u32>,
    /// Requests that may wait when `maxConnections` are busy (none by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1_000_000))]
    pub max_pending_requests: Option<u32>,
    /// Requests at once, waiting or in flight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub max_requests: Option<u32>,
    /// Retries (HTTPRoute `retry`) in flight at once; beyond, a failure is answered as is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1_000_000))]
    pub max_retries: Option<u32>,
}

/// Passive outlier detection.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OutlierDetectionSpec {
    /// 5xx answers (or connection failures, timeouts) in a row that eject an endpoint
    /// (5 when none of the three thresholds is given).
    #[serde(
        rename = "consecutive5xx",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1, max = 1000))]
    pub consecutive_5xx: Option<u32>,
    /// 502, 503, 504 answers (or connection failures, timeouts) in a row that eject one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub consecutive_gateway_errors: Option<u32>,
    /// Connection failures and timeouts in a row that eject one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub consecutive_local_origin_failures: Option<u32>,
    /// For each interval an endpoint stays in, its ejection count decays by one (`10s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
    /// How long a first ejection lasts; the n-th lasts n times as long, at most 300s or
    /// this (`30s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_ejection_time: Option<String>,
    /// Most of the Service's endpoints out at once, in percent (10); one may always go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub max_ejection_percent: Option<u32>,
    /// Below this percentage of endpoints available (neither ejected nor failing health
    /// checks), every endpoint is used again (50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub panic_threshold: Option<u32>,
}

/// Health checks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HealthCheckSpec {
    /// Checks the proxies make themselves, to every endpoint they route to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active: Option<ActiveHealthCheck>,
}

/// An active health check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActiveHealthCheck {
    /// `HTTP`, `GRPC` (grpc.health.v1) or `TCP` (a connect).
    #[serde(rename = "type")]
    pub kind: HealthCheckType,
    /// The HTTP check (for `HTTP`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpHealthCheck>,
    /// The gRPC check (for `GRPC`; optional).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc: Option<GrpcHealthCheck>,
    /// Between two checks of an endpoint, plus up to a tenth of jitter (`5s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
    /// A check taking longer fails (`1s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Failed checks in a row that take an endpoint out (3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub unhealthy_threshold: Option<u32>,
    /// Passed checks in a row that bring it back (1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub healthy_threshold: Option<u32>,
}

/// Health check types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum HealthCheckType {
    Http,
    Grpc,
    Tcp,
}

/// An HTTP health check: a GET whose answer must have one of the expected statuses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpHealthCheck {
    /// Path (and query) to GET.
    pub path: String,
    /// `Host` of the check; the endpoint's address when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Statuses that pass (`[200]` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 32))]
    pub expected_statuses: Option<Vec<u16>>,
}

/// A gRPC health check (`grpc.health.v1.Health/Check`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GrpcHealthCheck {
    /// The service asked about; the server as a whole when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
}

/// Upstream connection settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConnectionSpec {
    /// TCP connect, and then a TLS handshake, each (`5s` by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_timeout: Option<String>,
    /// An idle pooled connection is closed after this long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<String>,
    /// A connection is closed after this many requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub max_requests_per_connection: Option<u32>,
    /// TCP keepalive probes start after this long idle (`30s` by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_keepalive: Option<String>,
}
