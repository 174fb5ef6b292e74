//! The route-table contract shared by the Tollgate compiler and proxy.
//!
//! In: nothing. Out: plain serde types describing everything one proxy needs to serve one
//! Gateway: its listeners grouped by port, the virtual hosts and routes attached to each
//! listener (already sorted by Gateway API precedence), and the backends they forward to with
//! their resolved endpoints. No Kubernetes types, no I/O: the controller, `tollgate run` and
//! the proxy all agree on these and nothing else.
//!
//! Ordering is part of the contract: the compiler emits `virtual_hosts` most specific first and
//! `routes` in precedence order, so the proxy takes the first match.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub mod backend;
pub mod backend_tls;
pub mod cache;
pub mod client;
pub mod external;
pub mod policy;

pub use backend::BackendSettings;
pub use backend_tls::BackendTls;
pub use client::ClientSettings;
pub use policy::PolicySet;

/// Version of this contract. Bumped on any incompatible change.
pub const CONTRACT_VERSION: u32 = 1;

/// Everything one proxy serves for one Gateway.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteTable {
    /// Monotonic version set by the publisher (0 straight out of the compiler).
    #[serde(default)]
    pub version: u64,
    /// The Gateway this table belongs to.
    pub gateway: ObjectKey,
    /// One entry per bound (address, port), sorted by port.
    pub ports: Vec<PortConfig>,
    /// Backends by key (see [`BackendKey`]), referenced from routes.
    pub backends: BTreeMap<String, Backend>,
    /// Effective policies by key (`namespace/route/rule-index`, `#grpc` appended for a
    /// GRPCRoute's rule, `@listener` appended when listeners differ), referenced from routes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub policies: BTreeMap<String, PolicySet>,
    /// Route rules closed by invalid policies, by the same keys: a route whose `policy` key is
    /// here (and never in `policies`) answers 500 to every request until the policies are
    /// fixed. Kept out of `policies` so a proxy that predates this field still finds no
    /// policy set under the key and answers 500 too, instead of serving the rule open.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub closed: BTreeMap<String, policy::Closed>,
}

/// A namespaced object name.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ObjectKey {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl ObjectKey {
    /// Builds a key.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Wire protocol of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Protocol {
    /// Plain HTTP/1.1, and HTTP/2 with prior knowledge (h2c).
    #[serde(rename = "HTTP")]
    Http,
    /// TLS-terminated HTTP/1.1 and HTTP/2 (ALPN).
    #[serde(rename = "HTTPS")]
    Https,
    /// TLS streams routed on SNI (Gateway API protocol `TLS`, TLSRoutes): the proxy reads the
    /// ClientHello's SNI, picks the listener and virtual host for it as HTTP ports do for
    /// Host, and copies bytes both ways to a backend of the first route there. A
    /// [`ListenerConfig::passthrough`] listener copies the client's TLS bytes untouched; any
    /// other listener terminates TLS with its certificates and copies the plaintext.
    /// Matchers, filters, timeouts and policies are unused.
    #[serde(rename = "TLS")]
    Tls,
    /// Byte streams (Gateway API protocol `TCP`, TCPRoutes): each connection is copied both
    /// ways to a backend of the first route of the port's one listener. Listener hostnames,
    /// matchers, filters, timeouts and policies are unused.
    #[serde(rename = "TCP")]
    Tcp,
    /// Datagrams (Gateway API protocol `UDP`, UDPRoutes): each client address is a flow,
    /// pinned to a backend of the first route of the port's one listener when its first
    /// datagram arrives, and forgotten after the flow idle timeout. Listener hostnames,
    /// matchers, filters, timeouts and policies are unused.
    #[serde(rename = "UDP")]
    Udp,
}

/// One socket the proxy binds, shared by every listener on that port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortConfig {
    /// IP address to bind (`0.0.0.0` when the Gateway names none).
    pub address: String,
    /// TCP port.
    pub port: u16,
    /// Protocol of every listener on this port.
    pub protocol: Protocol,
    /// Listeners on this port, most specific hostname first; a listener without a hostname last.
    pub listeners: Vec<ListenerConfig>,
    /// HTTPS only: verify client certificates against these CAs (Gateway
    /// `spec.tls.frontend`, which is per port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_validation: Option<ClientValidation>,
    /// What the port does for its clients (ClientPolicy): client address, path options,
    /// limits.
    #[serde(default, skip_serializing_if = "ClientSettings::is_default")]
    pub client: ClientSettings,
}

/// Client-certificate validation of an HTTPS port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientValidation {
    /// PEM bundle of the trusted CA certificates.
    pub ca_pem: String,
    /// What to do with a client that presents no valid certificate.
    pub mode: ClientCertMode,
}

/// Gateway API `FrontendValidationModeType`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientCertMode {
    /// The handshake fails unless the client presents a certificate the CAs verify.
    #[default]
    AllowValidOnly,
    /// A client without a (valid) certificate is served too; only a verified certificate
    /// counts as one (for X.509 authentication).
    AllowInsecureFallback,
}

/// One Gateway listener with the routes attached to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenerConfig {
    /// Listener name (the Gateway's `listeners[].name`).
    pub name: String,
    /// Listener hostname: exact (`foo.example.com`) or wildcard (`*.example.com`); `None` = any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// Certificates for an HTTPS listener or a terminating TLS listener, first one the default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub certificates: Vec<Certificate>,
    /// [`Protocol::Tls`] only: `tls.mode: Passthrough`, the client's TLS is copied to the
    /// backend untouched (no certificates); `false` terminates TLS here.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub passthrough: bool,
    /// Virtual hosts, most specific hostname first (exact, then longer wildcards, then `*`).
    pub virtual_hosts: Vec<VirtualHost>,
}

/// A PEM certificate chain and its private key.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Certificate {
    /// Where it came from (`namespace/name` of the Secret), for logs.
    pub source: String,
    /// PEM certificate chain, leaf first.
    pub cert_pem: String,
    /// PEM private key.
    pub key_pem: String,
}

impl std::fmt::Debug for Certificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.debug_struct("Certificate")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

/// Routes served for one hostname (exact, `*.suffix` wildcard, or `*` for any).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VirtualHost {
    /// Lower-case hostname pattern.
    pub hostname: String,
    /// Routes in Gateway API precedence order: first match wins.
    ///
    /// Shared, not copied: a compiler that rebuilds only the virtual hosts a change touched
    /// hands the others on as they were, and a proxy recognises them by pointer
    /// ([`Arc::ptr_eq`]) and keeps what it built from them. Comparing two tables compares
    /// shared lists by pointer first. On the wire it is a plain list.
    #[serde(serialize_with = "shared_vec", deserialize_with = "to_shared_vec")]
    pub routes: Arc<Vec<Route>>,
}

fn shared_vec<S: Serializer, T: Serialize>(v: &Arc<Vec<T>>, s: S) -> Result<S::Ok, S::Error> {
    v.as_slice().serialize(s)
}

fn to_shared_vec<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Arc<Vec<T>>, D::Error> {
    Vec::deserialize(d).map(Arc::new)
}

/// One HTTPRoute or GRPCRoute match with the rule it belongs to (a GRPCRoute's service and
/// method are compiled into a path match on `/service/method`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Route {
    /// The HTTPRoute or GRPCRoute (a metrics label and log field).
    pub route: ObjectKey,
    /// Index of the rule in the route.
    pub rule_index: u32,
    /// Optional rule name (`rules[].name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule_name: Option<String>,
    /// What a request must carry.
    #[serde(rename = "match")]
    pub matcher: RouteMatch,
    /// Rule filters, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<Filter>,
    /// Weighted backends. Empty with no redirect filter = 500.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backends: Vec<WeightedBackend>,
    /// Rule timeouts.
    #[serde(default, skip_serializing_if = "Timeouts::is_empty")]
    pub timeouts: Timeouts,
    /// Key into [`RouteTable::policies`]; `None` = no policy applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// Request trailers go upstream (filtered); by default they are dropped. The HTTPRoute
    /// or GRPCRoute annotation `tollgate.dev/request-trailers: forward` sets it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub request_trailers: bool,
    /// Most bytes of a request body on this rule (413 beyond), from a ClientPolicy on its
    /// HTTPRoute; `None`: the port's limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_request_body_bytes: Option<u64>,
    /// Responses of this rule are never compressed (a ClientPolicy on its HTTPRoute with
    /// `compression: {disabled: true}`), whatever the port's compression says.
    #[serde(default, skip_serializing_if = "is_false")]
    pub compression_disabled: bool,
    /// When a failed upstream attempt is made again (HTTPRoute `rules[].retry`); `None`:
    /// one attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<Retry>,
    /// Keeps a client on one endpoint (HTTPRoute `rules[].sessionPersistence`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<backend::Session>,
    /// gRPC-Web calls (`application/grpc-web`, `application/grpc-web-text`) are translated
    /// to gRPC for the backend and their answers back: set on every GRPCRoute rule.
    #[serde(default, skip_serializing_if = "is_false")]
    pub grpc_web: bool,
    /// The rule's answers go through the proxy's shared cache (a CachePolicy); `None`:
    /// never cached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<Box<cache::CacheRule>>,
}

/// When to send a request upstream again (HTTPRoute `rules[].retry`, GEP-1731). A failed
/// connection is always retried; a reset or a backend timeout only for an idempotent
/// request; an answer whose status is in `codes` for any request. Only a request whose body
/// the proxy could hold (none, or a small declared length) is sent more than once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Retry {
    /// Attempts after the first (at least 1).
    pub attempts: u32,
    /// Least wait before a retry; each further retry waits twice as long as the last.
    pub backoff_ms: u64,
    /// Answer statuses retried (400-599).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub codes: Vec<u16>,
}

pub(crate) fn is_false(b: &bool) -> bool {
    !*b
}

/// Request predicates of one match; all must hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteMatch {
    /// Path predicate.
    pub path: PathMatch,
    /// HTTP method, upper-case.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// Header predicates (names lower-case).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<HeaderMatch>,
    /// Query parameter predicates (names exact, case-sensitive).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub query_params: Vec<HeaderMatch>,
}

/// Path predicate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "value")]
pub enum PathMatch {
    /// Whole path equals.
    Exact(String),
    /// Segment-wise prefix: `/api` matches `/api` and `/api/x`, never `/apix`.
    /// Stored without a trailing slash (except the root `/`).
    PathPrefix(String),
    /// Anchored regular expression over the whole path.
    RegularExpression(String),
}

/// A name/value predicate over a header or query parameter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeaderMatch {
    /// Header name (lower-case) or query parameter name.
    pub name: String,
    /// Value predicate.
    pub value: StringMatch,
}

/// A value predicate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "value")]
pub enum StringMatch {
    /// Equals.
    Exact(String),
    /// Anchored regular expression over the whole value.
    RegularExpression(String),
}

/// Rule timeouts in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Timeouts {
    /// Whole request, client to response headers (including retries). `None` = no timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_ms: Option<u64>,
    /// One upstream attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_request_ms: Option<u64>,
}

impl Timeouts {
    /// True when no timeout is set.
    pub fn is_empty(&self) -> bool {
        self.request_ms.is_none() && self.backend_request_ms.is_none()
    }
}

/// A backendRef with its weight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WeightedBackend {
    /// Key into [`RouteTable::backends`]; `None` when the ref could not be resolved, in which
    /// case the share of traffic it would get is answered with 500.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// Relative weight; 0 receives no traffic.
    pub weight: u32,
    /// Filters applied only when this backend is picked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<Filter>,
}

/// A request or response filter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum Filter {
    /// Edit request headers before forwarding.
    RequestHeaderModifier(HeaderModifier),
    /// Edit response headers before returning.
    ResponseHeaderModifier(HeaderModifier),
    /// Answer with a redirect instead of forwarding.
    RequestRedirect(Redirect),
    /// Rewrite host and/or path before forwarding.
    UrlRewrite(UrlRewrite),
    /// Send a copy of the request to another backend, ignoring its answer.
    RequestMirror(Mirror),
    /// Answer CORS preflights and decorate responses.
    Cors(Cors),
    /// Ask an external authorization service first (GEP-1494; runs after the policies,
    /// before the other filters).
    ExternalAuth(crate::external::ExternalAuthz),
}

/// Header edits: set replaces, add appends, remove deletes. Names lower-case.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeaderModifier {
    /// Replace (or create) these headers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set: Vec<(String, String)>,
    /// Append these headers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub add: Vec<(String, String)>,
    /// Remove these headers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
}

/// How to rewrite a path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "value")]
pub enum PathModifier {
    /// Replace the whole path.
    ReplaceFullPath(String),
    /// Replace the part matched by the route's PathPrefix.
    ReplacePrefixMatch(String),
}

/// A RequestRedirect filter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Redirect {
    /// `http` or `https`; `None` keeps the request's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    /// New host; `None` keeps the request's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// New port; `None` derives it as the Gateway API spec says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Path rewrite.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathModifier>,
    /// 301, 302, 303, 307 or 308.
    pub status_code: u16,
}

/// A URLRewrite filter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UrlRewrite {
    /// New Host header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// Path rewrite.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathModifier>,
}

/// A RequestMirror filter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mirror {
    /// Key into [`RouteTable::backends`]; `None` = unresolved, mirror skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// Share of requests mirrored, in millionths (1_000_000 = all).
    pub per_million: u32,
    /// Which requests are mirrored (runtime state of the proxy, not part of the table).
    #[serde(skip)]
    pub sampler: MirrorSampler,
}

/// Picks the requests a [`Mirror`] copies so that the share is exact over any run of
/// requests, not just on average: the n-th request through the filter is mirrored when
/// `floor(n * per_million / 1e6)` rises (20% mirrors every 5th request). Random sampling
/// would make the mirrored share of a short run vary by several points. Runtime state only:
/// not serialised, equal to any other sampler, and a clone starts from zero.
#[derive(Debug, Default)]
pub struct MirrorSampler(std::sync::atomic::AtomicU64);

impl MirrorSampler {
    /// Whether the next request is mirrored, for a share of `per_million` millionths.
    pub fn next(&self, per_million: u32) -> bool {
        if per_million >= 1_000_000 {
            return true;
        }
        if per_million == 0 {
            return false;
        }
        let n = u128::from(self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let p = u128::from(per_million);
        (n + 1) * p / 1_000_000 > n * p / 1_000_000
    }
}

impl Clone for MirrorSampler {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl PartialEq for MirrorSampler {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for MirrorSampler {}

/// A CORS filter.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cors {
    /// Allowed origins: `*`, exact `scheme://host[:port]`, or with a `*.` wildcard host.
    #[serde(default)]
    pub allow_origins: Vec<String>,
    /// Send `Access-Control-Allow-Credentials: true`.
    #[serde(default)]
    pub allow_credentials: bool,
    /// Allowed methods (`*` allowed).
    #[serde(default)]
    pub allow_methods: Vec<String>,
    /// Allowed request headers (`*` allowed).
    #[serde(default)]
    pub allow_headers: Vec<String>,
    /// Response headers exposed to scripts.
    #[serde(default)]
    pub expose_headers: Vec<String>,
    /// Preflight cache lifetime in seconds.
    #[serde(default)]
    pub max_age: u32,
}

/// Application protocol spoken to a backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum BackendProtocol {
    /// HTTP/1.1 (WebSocket upgrades pass through).
    #[default]
    #[serde(rename = "http1")]
    Http1,
    /// HTTP/2 with prior knowledge (`appProtocol: kubernetes.io/h2c`).
    #[serde(rename = "h2c")]
    H2c,
    /// Opaque bytes (TLSRoute and TCPRoute backends): only referenced from [`Protocol::Tls`]
    /// and [`Protocol::Tcp`] ports, never from HTTP routes.
    #[serde(rename = "tcp")]
    Tcp,
    /// Datagrams (UDPRoute backends): only referenced from [`Protocol::Udp`] ports.
    #[serde(rename = "udp")]
    Udp,
}

/// Load-balancing algorithm.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum LoadBalancer {
    /// Power of two random choices, fewer in-flight requests wins.
    #[default]
    #[serde(rename = "least-request")]
    LeastRequest,
    /// Round robin.
    #[serde(rename = "round-robin")]
    RoundRobin,
    /// Uniformly random.
    #[serde(rename = "random")]
    Random,
    /// A hash of what [`BackendSettings::hash`] names picks the endpoint (a ring, with
    /// bounded load); a request without it is balanced least-request.
    #[serde(rename = "consistent-hash")]
    ConsistentHash,
}

/// A Service port and the endpoints behind it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Backend {
    /// Protocol to speak upstream.
    #[serde(default)]
    pub protocol: BackendProtocol,
    /// Balancing algorithm.
    #[serde(default)]
    pub load_balancer: LoadBalancer,
    /// Endpoints to use, already filtered (ready ones, or serving+terminating ones when none is
    /// ready), sorted. Empty = 503.
    pub endpoints: Vec<Endpoint>,
    /// What a BackendPolicy on the Service sets.
    #[serde(default, skip_serializing_if = "BackendSettings::is_empty")]
    pub settings: BackendSettings,
    /// TLS to the endpoints (BackendTLSPolicy); `None`: plaintext.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<BackendTls>,
}

/// An IP and port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Endpoint {
    /// IP address (v4 or v6, no brackets).
    pub ip: String,
    /// Port.
    pub port: u16,
}

/// Builds the key of a backend.
///
/// - `namespace/service:port`: a Service port referenced by an HTTPRoute, spoken to with the
///   protocol its `appProtocol` names.
/// - `namespace/service:port#h2c`: the same Service port referenced by a GRPCRoute, always
///   spoken to over HTTP/2 with prior knowledge. The suffix keeps the two apart when an
///   HTTPRoute and a GRPCRoute share a Service port (each needs its own protocol).
/// - `namespace/service:port#tcp`: referenced by a TLSRoute; connections are copied as bytes.
///
/// The proxy treats keys as opaque: it only looks them up in [`RouteTable::backends`].
pub struct BackendKey;

impl BackendKey {
    /// `namespace/service:port`.
    pub fn of(namespace: &str, service: &str, port: u16) -> String {
        format!("{namespace}/{service}:{port}")
    }

    /// `namespace/service:port#h2c`: a Service port referenced by a GRPCRoute.
    pub fn h2c(namespace: &str, service: &str, port: u16) -> String {
        format!("{namespace}/{service}:{port}#h2c")
    }

    /// `namespace/service:port#tcp`: a Service port referenced by a TLSRoute or TCPRoute
    /// (bytes copied).
    pub fn tcp(namespace: &str, service: &str, port: u16) -> String {
        format!("{namespace}/{service}:{port}#tcp")
    }

    /// `namespace/service:port#udp`: a Service port referenced by a UDPRoute (datagrams
    /// forwarded).
    pub fn udp(namespace: &str, service: &str, port: u16) -> String {
        format!("{namespace}/{service}:{port}#udp")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificate_debug_hides_key() {
        let c = Certificate {
            source: "ns/s".into(),
            cert_pem: "CERT".into(),
            key_pem: "SECRET-KEY".into(),
        };
        let s = format!("{c:?}");
        assert!(s.contains("ns/s"));
        assert!(!s.contains("SECRET-KEY"));
    }

    #[test]
    fn route_round_trips_through_json() {
        let r = Route {
            route: ObjectKey::new("default", "shop"),
            rule_index: 0,
            rule_name: None,
            matcher: RouteMatch {
                path: PathMatch::PathPrefix("/api".into()),
                method: Some("GET".into()),
                headers: vec![HeaderMatch {
                    name: "x-env".into(),
                    value: StringMatch::Exact("canary".into()),
                }],
                query_params: vec![],
            },
            filters: vec![Filter::RequestRedirect(Redirect {
                scheme: Some("https".into()),
                hostname: None,
                port: None,
                path: None,
                status_code: 301,
            })],
            backends: vec![],
            timeouts: Timeouts::default(),
            policy: None,
            request_trailers: false,
            max_request_body_bytes: None,
            compression_disabled: false,
            grpc_web: false,
            cache: None,
            retry: Some(Retry {
                attempts: 2,
                backoff_ms: 25,
                codes: vec![503],
            }),
            session: None,
        };
        let json = serde_json::to_string(&r).unwrap();
        let back: Route = serde_json::from_str(&json).unwrap();
        assert_eq!(back, r);
        // The default is left out, so older proxies read newer tables and the other way.
        assert!(!json.contains("requestTrailers"), "{json}");
        let forwarding = Route {
            request_trailers: true,
            max_request_body_bytes: None,
            ..r.clone()
        };
        let json = serde_json::to_string(&forwarding).unwrap();
        assert!(json.contains(r#""requestTrailers":true"#), "{json}");
        assert_eq!(serde_json::from_str::<Route>(&json).unwrap(), forwarding);
        assert!(
            json.contains(r#""path":{"type":"PathPrefix","value":"/api"}"#),
            "{json}"
        );
    }
}
