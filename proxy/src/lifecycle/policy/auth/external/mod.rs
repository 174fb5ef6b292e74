//! External authorization: an AuthPolicy rule that asks another service. In: a table's
//! [`ExternalAuthz`] (compiled once per table with [`ExternalCheck::build`]) and, per request,
//! the request's attributes ([`CheckInput`]: method, host, path, scheme, headers, client,
//! the buffered body when the rule forwards it) and the snapshot's backends and upstream
//! connections ([`ExternalIo`]). Out: a [`Decision`]: allowed (headers to set on the upstream
//! request and to add to the client's response) or denied (the answer to send).
//!
//! ```text
//! check(io, input)
//!   1. cache (cacheTTL set): key = SHA-256 of the rule id and the forwarded attributes
//!      (method, scheme, host, path, client IP, forwarded headers, body); a live entry
//!      answers
//!   2. pick an endpoint of the rule's backend (the table's balancer: same pools, TLS
//!      through BackendTLSPolicy, h2 for gRPC) and send the check (module `http` or `grpc`)
//!      under the rule's timeout
//!   3. the service's decision, cached when allowed or denied (never an error); an error
//!      (timeout, connection failure, HTTP 5xx, gRPC status other than OK/denied) denies
//!      with 403, or lets the request go on when `failOpen` is set
//! ```
//!
//! The cache key covers every attribute the service was shown but the client's port (in a
//! gRPC CheckRequest's source address: a key per connection would defeat the cache), so a
//! request with another credential (another Authorization header, another body) never gets a
//! decision made for someone else. The cache is per compiled rule and bounded ([`CACHE_CAPACITY`] entries); a
//! table swap starts it empty.

mod cache;
mod grpc;
mod http;
pub mod proto;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ::http::header::CONTENT_TYPE;
use ::http::{HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode};
use bytes::Bytes;
use tollgate_api::external::{ExternalAuthz, ExternalProtocol};

use self::cache::DecisionCache;
use super::metrics::AuthMetrics;
use crate::FastMap;
use crate::lifecycle::policy::decisions::Decided as Counter;
use crate::lifecycle::policy::decisions::{Outcome, PolicyDecisions, policy_label, rule_label};
use crate::upstream::pool::UpstreamError;
use crate::upstream::{Balancer, Upstream};

/// Decisions kept per rule.
pub const CACHE_CAPACITY: usize = 10_000;

/// Largest answer body read from an authorization service.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// Why a check could not be made (never a credential in the message).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ExternalError {
    /// The table names a backend it does not hold (the compiler adds it; not reached).
    #[error("backend {0} is not in the table")]
    NoBackend(String),
    /// The backend has no endpoint to send to.
    #[error("backend {0} has no available endpoint")]
    NoEndpoint(String),
    /// No answer within the rule's timeout.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The exchange failed.
    #[error("request failed: {0}")]
    Upstream(#[from] UpstreamError),
    /// The answer's body could not be read, or was too large.
    #[error("answer body: {0}")]
    Body(String),
    /// The check request could not be built.
    #[error("building the check request: {0}")]
    Build(#[from] ::http::Error),
    /// The HTTP service answered 5xx.
    #[error("the service answered {0}")]
    Status(StatusCode),
    /// The gRPC call failed or its answer was not a CheckResponse.
    #[error("gRPC: {0}")]
    Grpc(String),
}

/// The attributes of one request that a check forwards.
#[derive(Debug, Clone, Copy)]
pub struct CheckInput<'a> {
    /// The method.
    pub method: &'a Method,
    /// Host without port (normalized).
    pub host: &'a str,
    /// Path with query, as received.
    pub target: &'a str,
    /// `http` or `https`.
    pub scheme: &'a str,
    /// The request's headers (the client's identity headers already stripped).
    pub headers: &'a HeaderMap,
    /// The client.
    pub peer: SocketAddr,
    /// The whole body, when a rule forwards bodies (held by the caller).
    pub body: Option<&'a Bytes>,
}

/// What a check reaches the service with: the snapshot's balancers and the proxy's upstream
/// connections.
#[derive(Clone, Copy)]
pub struct ExternalIo<'a> {
    backends: &'a FastMap<String, Arc<Balancer>>,
    upstream: &'a Upstream,
}

impl std::fmt::Debug for ExternalIo<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExternalIo")
            .field("backends", &self.backends.len())
            .finish_non_exhaustive()
    }
}

impl<'a> ExternalIo<'a> {
    pub(crate) fn new(
        backends: &'a FastMap<String, Arc<Balancer>>,
        upstream: &'a Upstream,
    ) -> Self {
        Self { backends, upstream }
    }
}

/// What the service decided.
#[derive(Debug, Clone)]
pub enum Decision {
    /// Go on, with these header edits.
    Allow(Arc<Grant>),
    /// Answer with this.
    Deny(Arc<Refusal>),
}

/// How a [`Decision`] was reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The service (or its cached answer) allowed the request.
    Allowed,
    /// The service (or its cached answer) refused it.
    Denied,
    /// The service could not be asked: refused (fail closed).
    Error,
    /// The service could not be asked and the rule fails open: allowed.
    FailOpen,
}

impl Verdict {
    fn of(d: &Decision) -> Self {
        match d {
            Decision::Allow(_) => Self::Allowed,
            Decision::Deny(_) => Self::Denied,
        }
    }
}

/// Header edits of an allowing answer; built with [`Grant::new`], which keeps out what the
/// service may not edit.
#[derive(Debug, Default)]
pub struct Grant {
    /// Set on the upstream request (replacing the client's values).
    pub upstream: Vec<(HeaderName, HeaderValue)>,
    /// Appended on the upstream request.
    pub upstream_append: Vec<(HeaderName, HeaderValue)>,
    /// Removed from the upstream request.
    pub remove: Vec<HeaderName>,
    /// Added to the client's response.
    pub client: Vec<(HeaderName, HeaderValue)>,
}

impl Grant {
    /// The edits of an allowing answer, less Host, hop-by-hop and framing headers upstream
    /// ([`may_edit_upstream`]) and hop-by-hop and framing headers for the client.
    fn new(
        upstream: Vec<(HeaderName, HeaderValue)>,
        upstream_append: Vec<(HeaderName, HeaderValue)>,
        remove: Vec<HeaderName>,
        client: Vec<(HeaderName, HeaderValue)>,
    ) -> Self {
        let up = |v: Vec<(HeaderName, HeaderValue)>| -> Vec<_> {
            v.into_iter()
                .filter(|(n, _)| may_edit_upstream(n))
                .collect()
        };
        Self {
            upstream: up(upstream),
            upstream_append: up(upstream_append),
            remove: remove.into_iter().filter(may_edit_upstream).collect(),
            client: client
                .into_iter()
                .filter(|(n, _)| !is_hop_or_framing(n))
                .collect(),
        }
    }

    /// Applies the upstream edits to `headers`.
    pub fn apply(&self, headers: &mut HeaderMap) {
        for n in &self.remove {
            headers.remove(n);
        }
        for (n, v) in &self.upstream {
            headers.insert(n.clone(), v.clone());
        }
        for (n, v) in &self.upstream_append {
            headers.append(n.clone(), v.clone());
        }
    }
}

/// A denial, as the service worded it (or the gateway's 403 when the service failed).
#[derive(Debug)]
pub struct Refusal {
    /// Status.
    pub status: StatusCode,
    /// Headers for the client.
    pub headers: HeaderMap,
    /// Body for the client.
    pub body: Bytes,
}

impl Refusal {
    /// A denial with the service's status, headers (less hop-by-hop and framing ones: the
    /// gateway frames its own answer) and body.
    fn new(
        status: StatusCode,
        headers: impl IntoIterator<Item = (HeaderName, HeaderValue)>,
        body: Bytes,
    ) -> Self {
        let mut map = HeaderMap::new();
        for (n, v) in headers {
            if !is_hop_or_framing(&n) {
                map.append(n, v);
            }
        }
        Self {
            status,
            headers: map,
            body,
        }
    }

    /// As an HTTP response.
    pub fn to_response(&self) -> Response<Bytes> {
        let mut r = Response::new(self.body.clone());
        *r.status_mut() = self.status;
        *r.headers_mut() = self.headers.clone();
        r
    }

    /// The gateway's own 403, for a check that could not be made.
    fn failed() -> Self {
        let mut headers = HeaderMap::new();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        Self {
            status: StatusCode::FORBIDDEN,
            headers,
            body: Bytes::from_static(b"Forbidden\n"),
        }
    }
}

/// One external rule, compiled for one table.
#[derive(Debug)]
pub struct ExternalCheck {
    id: Arc<str>,
    backend: String,
    protocol: Protocol,
    /// Forwarded header names; for gRPC, empty = all.
    forward_headers: Vec<HeaderName>,
    max_body_bytes: Option<u64>,
    timeout: Duration,
    fail_open: bool,
    cache: Option<DecisionCache>,
}

#[derive(Debug)]
enum Protocol {
    Http(http::HttpSettings),
    Grpc,
}

impl Protocol {
    fn label(&self) -> &'static str {
        match self {
            Self::Http(_) => "http",
            Self::Grpc => "grpc",
        }
    }
}

/// Why a rule could not be compiled (the compiler checks the same).
#[derive(Debug, thiserror::Error)]
#[error("external `{id}`: invalid header name `{name}`")]
pub struct ExternalBuildError {
    /// The rule's id.
    pub id: String,
    /// The name.
    pub name: String,
}

impl ExternalCheck {
    /// Compiles `e`.
    pub fn build(e: &ExternalAuthz) -> Result<Self, ExternalBuildError> {
        let names = |list: &[String]| {
            list.iter()
                .map(|n| {
                    HeaderName::from_bytes(n.to_ascii_lowercase().as_bytes()).map_err(|_| {
                        ExternalBuildError {
                            id: e.id.clone(),
                            name: n.clone(),
                        }
                    })
                })
                .collect::<Result<Vec<_>, _>>()
        };
        let protocol = match &e.protocol {
            ExternalProtocol::Http(h) => Protocol::Http(http::HttpSettings {
                path_prefix: h.path_prefix.trim_end_matches('/').to_owned(),
                to_upstream: names(&h.headers_to_upstream)?,
                to_client: names(&h.headers_to_client)?,
                all_to_upstream: h.all_headers_to_upstream,
                allow: h.allow,
            }),
            ExternalProtocol::Grpc => Protocol::Grpc,
        };
        Ok(Self {
            id: e.id.as_str().into(),
            backend: e.backend.clone(),
            protocol,
            forward_headers: names(&e.forward_headers)?,
            max_body_bytes: e.max_body_bytes,
            timeout: Duration::from_millis(e.timeout_ms.max(1)),
            fail_open: e.fail_open,
            cache: e
                .cache_ttl_ms
                .filter(|ms| *ms > 0)
                .map(|ms| DecisionCache::new(CACHE_CAPACITY, Duration::from_millis(ms))),
        })
    }

    /// The largest body this rule forwards, when it forwards bodies.
    pub fn max_body_bytes(&self) -> Option<u64> {
        self.max_body_bytes
    }

    /// The rule's id (`namespace/policy/rule`).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Asks the service (or the cache). `Deny` is the answer to send; a check that could not
    /// be made denies (403) unless the rule fails open.
    pub async fn check(
        &self,
        io: &ExternalIo<'_>,
        input: &CheckInput<'_>,
        metrics: &AuthMetrics,
    ) -> Decision {
        self.decide(io, input, metrics).await.0
    }

    /// [`Self::check`], and how the decision was reached.
    pub async fn decide(
        &self,
        io: &ExternalIo<'_>,
        input: &CheckInput<'_>,
        metrics: &AuthMetrics,
    ) -> (Decision, Verdict) {
        let label = self.protocol.label();
        let key = self
            .cache
            .as_ref()
            .map(|_| cache::key(&self.id, input, &self.forward_headers));
        if let (Some(cache), Some(key)) = (&self.cache, &key)
            && let Some(d) = cache.get(key)
        {
            metrics.external(label, "cache_hit");
            let verdict = Verdict::of(&d);
            return (d, verdict);
        }
        match tokio::time::timeout(self.timeout, self.ask(io, input)).await {
            Ok(Ok(d)) => {
                metrics.external(
                    label,
                    match d {
                        Decision::Allow(_) => "allowed",
                        Decision::Deny(_) => "denied",
                    },
                );
                if let (Some(cache), Some(key)) = (&self.cache, key) {
                    cache.insert(key, d.clone());
                }
                let verdict = Verdict::of(&d);
                (d, verdict)
            }
            failed => {
                let e = match failed {
                    Ok(Err(e)) => e,
                    _ => ExternalError::Timeout(self.timeout),
                };
                if self.fail_open {
                    tracing::debug!(rule = %self.id, error = %e, "auth: external check failed; failOpen lets the request go on");
                    metrics.external(label, "fail_open");
                    (
                        Decision::Allow(Arc::new(Grant::default())),
                        Verdict::FailOpen,
                    )
                } else {
                    tracing::debug!(rule = %self.id, error = %e, "auth: external check failed; denying");
                    metrics.external(label, "error");
                    (Decision::Deny(Arc::new(Refusal::failed())), Verdict::Error)
                }
            }
        }
    }

    async fn ask(
        &self,
        io: &ExternalIo<'_>,
        input: &CheckInput<'_>,
    ) -> Result<Decision, ExternalError> {
        let balancer = io
            .backends
            .get(&self.backend)
            .ok_or_else(|| ExternalError::NoBackend(self.backend.clone()))?;
        let guard = balancer
            .pick()
            .ok_or_else(|| ExternalError::NoEndpoint(self.backend.clone()))?;
        let endpoint = guard.endpoint();
        match &self.protocol {
            Protocol::Http(s) => {
                let req = http::request(
                    s,
                    &self.forward_headers,
                    balancer.protocol,
                    &endpoint.authority,
                    input,
                )?;
                let resp = io
                    .upstream
                    .send(balancer.protocol, endpoint, req, &Default::default())
                    .await?;
                http::decision(s, resp).await
            }
            Protocol::Grpc => {
                let req = grpc::request(&self.forward_headers, &endpoint.authority, input)?;
                let resp = io
                    .upstream
                    .send(balancer.protocol, endpoint, req, &Default::default())
                    .await?;
                grpc::decision(resp).await
            }
        }
    }
}

/// Reads a whole answer body, at most [`MAX_ANSWER_BYTES`], with its trailers.
async fn read_body<B>(body: B) -> Result<(Bytes, Option<HeaderMap>), ExternalError>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    use http_body_util::BodyExt;
    let collected = http_body_util::Limited::new(body, MAX_ANSWER_BYTES)
        .collect()
        .await
        .map_err(|e| ExternalError::Body(e.to_string()))?;
    let trailers = collected.trailers().cloned();
    Ok((collected.to_bytes(), trailers))
}

/// A header of an answer, when both halves are valid.
fn header(name: &str, value: &[u8]) -> Option<(HeaderName, HeaderValue)> {
    Some((
        HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes()).ok()?,
        HeaderValue::from_bytes(value).ok()?,
    ))
}

/// Hop-by-hop and framing headers (RFC 9110 §7.6.1, RFC 9112 §6): they describe one
/// connection or one message's body, so the gateway sets them for each message itself. A
/// service's answer never sets or removes them on the upstream request or the client's
/// response, and a check request never carries the client's.
pub(crate) fn is_hop_or_framing(n: &HeaderName) -> bool {
    use ::http::header::{CONNECTION, CONTENT_LENGTH, TE, TRAILER, TRANSFER_ENCODING, UPGRADE};
    n == CONNECTION
        || n == CONTENT_LENGTH
        || n == TRANSFER_ENCODING
        || n == TE
        || n == TRAILER
        || n == UPGRADE
        || matches!(n.as_str(), "keep-alive" | "proxy-connection")
}

/// Whether an allowing answer may set, append or remove `n` on the upstream request: not
/// Host (the request was routed and judged by its host, which the backend must receive:
/// GEP-1494 copies every header "except Authority or Host", Envoy refuses to modify it) and
/// not a hop-by-hop or framing header.
fn may_edit_upstream(n: &HeaderName) -> bool {
    n != ::http::header::HOST && !is_hop_or_framing(n)
}

/// An external rule with its `when` predicates, as the enforcer runs it.
#[derive(Debug)]
pub struct ExternalRule {
    /// The check.
    pub check: ExternalCheck,
    /// The rule applies only when all hold.
    when: Vec<crate::lifecycle::policy::cel::Expr>,
    /// `namespace/name` of the AuthPolicy that defined it.
    policy: Arc<str>,
    /// `authorization.<name>`.
    rule: Arc<str>,
    /// Its decision counters, by [`Verdict`]: allowed, denied, error, fail_open.
    counted: [Counter; 4],
}

impl ExternalRule {
    /// The external rules of `auth`, in name order.
    pub fn build_all(
        auth: &tollgate_api::policy::Auth,
    ) -> Result<Vec<Self>, super::AuthBuildError> {
        let sources = super::sources_label(auth);
        auth.authorization
            .iter()
            .filter_map(|r| r.external.as_ref().map(|e| (r, e)))
            .map(|(r, e)| {
                Ok(Self {
                    check: ExternalCheck::build(e)?,
                    when: super::compile_all(&r.when, &format!("authorization.{}.when", r.name))?,
                    policy: policy_label(&r.policy, &sources),
                    rule: rule_label("authorization", &r.name),
                    counted: Default::default(),
                })
            })
            .collect()
    }

    /// Resolves the rule's decision counters in `decisions` (at table build).
    pub fn count_with(&mut self, decisions: &PolicyDecisions) {
        self.counted = decisions.counters(
            &self.policy,
            &self.rule,
            [
                Outcome::Allowed,
                Outcome::Denied,
                Outcome::Error,
                Outcome::FailOpen,
            ],
        );
    }

    /// Counts one decision of the rule.
    pub fn count(&self, verdict: Verdict) {
        let [allowed, denied, error, fail_open] = &self.counted;
        match verdict {
            Verdict::Allowed => allowed,
            Verdict::Denied => denied,
            Verdict::Error => error,
            Verdict::FailOpen => fail_open,
        }
        .inc();
    }

    /// Whether every `when` predicate holds.
    pub fn applies(&self, act: &crate::lifecycle::policy::cel::Activation<'_>) -> bool {
        self.when.iter().all(|w| w.eval_bool(act))
    }
}
