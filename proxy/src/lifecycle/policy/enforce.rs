//! The policy phase of a request: authentication, authorization, then rate limits.
//!
//! In: a table's [`PolicySet`]s (compiled once per snapshot into [`Enforcer`]s) and, per
//! request, the matched route's enforcer, the request head and [`RequestInfo`] (with the
//! connection's verified client certificate, for X.509). Out: either [`Admitted`] (the
//! headers to add to the eventual response, `X-RateLimit-*`, and the identity authentication
//! found, for the request's context) or the answer that ends the request: the
//! policy's 401/403 (with `WWW-Authenticate`) or 429 with `Retry-After`, or 500 for a rule
//! the table marks [`Closed`] by invalid policies (fail closed: never served open).
//!
//! The proxy-wide [`PolicyRuntime`] outlives snapshots: JWKS and token caches, the rate
//! limiter's counters (in memory or in Redis), so a table swap neither refetches keys nor
//! resets limits.
//!
//! Building an enforcer also resolves the decision counters of each of its rules
//! ([`PolicyDecisions`]), so a request counts its decisions with atomic increments only.
//!
//! Per request the expressions read a snapshot of the request ([`Activation`]) that holds only
//! what the set's expressions use ([`Needs`], computed at build), so a policy that reads no
//! header copies none.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::lifecycle::policy::decisions::Decided as Counter;
use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::request::Parts;
use http::{HeaderValue, Response, StatusCode};
use tollgate_api::PolicySet;
use tollgate_api::policy::{Auth, AuthnMethod, AuthzRule, Closed};

use super::auth::external::{self, CheckInput, ExternalIo, ExternalRule};
use super::auth::{AuthBuildError, AuthOutcome, AuthState, CompiledAuth};
use super::cel::{Activation, Attrs, Expr, Needs};
use super::decisions::{Outcome, PolicyDecisions, WHOLE_POLICY};
use super::ratelimit::{CompiledLimit, Decision, LimitError, Pending, RateLimiter};

/// Why a table's policies could not be compiled (the compiler validates the same things).
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The auth rules of a policy set.
    #[error("policy {key}: {source}")]
    Auth {
        /// The table's policy key.
        key: String,
        /// What failed.
        source: AuthBuildError,
    },
    /// A rate limit.
    #[error("policy {key}: {source}")]
    Limit {
        /// The table's policy key.
        key: String,
        /// What failed.
        source: LimitError,
    },
}

/// State shared by every snapshot of a proxy.
#[derive(Debug, Clone)]
pub struct PolicyRuntime {
    /// JWKS, verified-token and introspection caches, HTTP client.
    pub auth: AuthState,
    /// Counters.
    pub limiter: RateLimiter,
    /// `tollgate_policy_decisions_total`: every compiled rule resolves its counters here.
    pub decisions: PolicyDecisions,
}

/// One route rule's compiled policies.
#[derive(Debug)]
pub struct Enforcer {
    /// Closed by invalid policies: every request answers 500, nothing else runs.
    closed: bool,
    /// The `closed` decision counter of each closing policy.
    closed_by: Vec<Counter>,
    auth: Option<CompiledAuth>,
    /// The auth rules' external authorization checks (after the CEL rules).
    external: Vec<ExternalRule>,
    limits: Vec<CompiledLimit>,
    /// What the expressions of the set read from a request.
    needs: Needs,
}

/// Compiles every policy set of a table, and an enforcer answering 500 for each rule the
/// table marks closed.
pub fn build_all(
    policies: &std::collections::BTreeMap<String, PolicySet>,
    closed: &std::collections::BTreeMap<String, Closed>,
    rt: &PolicyRuntime,
) -> Result<HashMap<String, Arc<Enforcer>>, PolicyError> {
    let mut out = policies
        .iter()
        .map(|(k, set)| Enforcer::build(k, set, rt).map(|e| (k.clone(), Arc::new(e))))
        .collect::<Result<HashMap<_, _>, _>>()?;
    // A key in both (no compiler emits one) stays closed.
    for (k, c) in closed {
        out.insert(k.clone(), Arc::new(Enforcer::closed_by(c, &rt.decisions)));
    }
    Ok(out)
}

/// What the policy phase lets a request go on with.
#[derive(Debug, Default)]
pub struct Admitted<'e> {
    /// The rate-limit decision whose headers go on the response; `None` when no enforced
    /// limit applied.
    pub decision: Option<Decision>,
    /// `auth.identity` (null when anonymous), shared with the authenticator; `None` when the
    /// set has no authentication.
    pub identity: Option<Arc<serde_json::Value>>,
    /// `Set-Cookie` values for the answer (an OIDC session refreshed on the way).
    pub set_cookies: Vec<HeaderValue>,
    /// Headers an external authorization service asked to add to the response.
    pub response_headers: Vec<(http::HeaderName, HeaderValue)>,
    /// The shadow limits that would have refused the request.
    pub shadow_refused: Vec<&'e CompiledLimit>,
    /// Costs to count once the response is known (`cost.response`).
    pub pending: Vec<Pending<'e>>,
}

/// What a request carries into the policy phase besides its head.
#[derive(Debug, Clone, Copy)]
pub struct RequestInfo<'a> {
    /// Host without port.
    pub host: &'a str,
    /// Path with query, as received.
    pub target: &'a str,
    /// `http` or `https`.
    pub scheme: &'a str,
    /// The client.
    pub peer: SocketAddr,
    /// The client's IP as `Display` prints it, when the caller formatted it already (once per
    /// connection): expressions reading `source.address` then use it as it is.
    pub peer_address: Option<&'a str>,
    /// DER of the client certificate the TLS layer verified against the port's CAs; `None`
    /// without one (X.509 authentication then fails).
    pub peer_cert: Option<&'a [u8]>,
    /// The request body, held whole when an external rule forwards bodies
    /// ([`Enforcer::external_body_limit`]).
    pub body: Option<&'a Bytes>,
    /// How external authorization rules reach their services; `None` denies them.
    pub external: Option<ExternalIo<'a>>,
}

impl Enforcer {
    /// Compiles one policy set.
    pub fn build(key: &str, set: &PolicySet, rt: &PolicyRuntime) -> Result<Self, PolicyError> {
        let auth = set
            .auth
            .as_ref()
            .map(|a| {
                let mut auth = CompiledAuth::build(a, &rt.auth)?;
                auth.count_with(&rt.decisions);
                Ok::<_, AuthBuildError>(auth)
            })
            .transpose()
            .map_err(|source| PolicyError::Auth {
                key: key.to_owned(),
                source,
            })?;
        let limits = set
            .rate_limits
            .iter()
            .map(|l| {
                let mut limit = CompiledLimit::new(l)?;
                limit.count_with(&rt.decisions);
                Ok::<_, LimitError>(limit)
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| PolicyError::Limit {
                key: key.to_owned(),
                source,
            })?;
        let external = set
            .auth
            .as_ref()
            .map(ExternalRule::build_all)
            .transpose()
            .map_err(|source| PolicyError::Auth {
                key: key.to_owned(),
                source,
            })?
            .unwrap_or_default()
            .into_iter()
            .map(|mut rule| {
                rule.count_with(&rt.decisions);
                rule
            })
            .collect();
        let mut needs: Needs = limits.iter().flat_map(CompiledLimit::expressions).collect();
        if let Some(auth) = &set.auth {
            auth_needs(auth, &mut needs);
        }
        Ok(Self {
            closed: false,
            closed_by: Vec::new(),
            auth,
            external,
            limits,
            needs,
        })
    }

    /// The enforcer of a rule closed by invalid policies: it answers 500 to every request.
    pub fn closed() -> Self {
        Self {
            closed: true,
            closed_by: Vec::new(),
            auth: None,
            external: Vec::new(),
            limits: Vec::new(),
            needs: Needs::default(),
        }
    }

    /// [`Self::closed`], counting each request as a `closed` decision of the policies
    /// of `by` (`rule="-"`).
    pub fn closed_by(by: &Closed, decisions: &PolicyDecisions) -> Self {
        let whole: Arc<str> = WHOLE_POLICY.into();
        let closed_by = by
            .by
            .iter()
            .map(|k| decisions.counter(&k.to_string().into(), &whole, Outcome::Closed))
            .collect();
        Self {
            closed_by,
            ..Self::closed()
        }
    }

    /// The largest body an external authorization rule forwards: the caller holds a body up
    /// to this size whole in [`RequestInfo::body`] (and refuses a larger one, 413).
    pub fn external_body_limit(&self) -> Option<u64> {
        self.external
            .iter()
            .filter_map(|r| r.check.max_body_bytes())
            .max()
    }

    /// Runs authentication, authorization and rate limits for one request, in that order.
    /// `Ok` carries the rate-limit decision and the identity; `Err` is the answer.
    pub async fn enforce(
        &self,
        rt: &PolicyRuntime,
        parts: &mut Parts,
        info: RequestInfo<'_>,
    ) -> Result<Admitted<'_>, Response<Bytes>> {
        if self.closed {
            for c in &self.closed_by {
                c.inc();
            }
            let mut resp = Response::new(Bytes::from_static(b"Internal Server Error\n"));
            *resp.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            resp.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            return Err(resp);
        }
        if let Some(auth) = &self.auth {
            // Expressions must never see the client's own values of the identity headers.
            auth.strip_success_headers(&mut parts.headers);
        }
        let attrs = Attrs {
            method: parts.method.as_str(),
            host: info.host,
            path: info.target,
            scheme: info.scheme,
            headers: &parts.headers,
            source: info.peer,
        };
        let mut act = Activation::with_needs(&attrs, &self.needs);
        if let Some(address) = info.peer_address {
            act.set_source_address(address);
        }
        let mut identity = None;
        let mut set_cookies = Vec::new();
        let mut response_headers = Vec::new();
        if let Some(auth) = &self.auth {
            match auth
                .check(parts, info.peer_cert, info.scheme, &mut act)
                .await
            {
                AuthOutcome::Allowed(who) => {
                    identity = Some(who.identity);
                    set_cookies = who.set_cookies;
                }
                AuthOutcome::Denied(d) => return Err(d.into_response()),
            }
            if !self.external.is_empty() && auth.applies(&act) {
                response_headers = self.external(rt, parts, &info, &act).await?;
            }
        }
        if self.limits.is_empty() {
            return Ok(Admitted {
                identity,
                set_cookies,
                response_headers,
                ..Admitted::default()
            });
        }
        let checked = rt.limiter.check_request(&self.limits, &act).await;
        let decision = match checked.decision {
            Some(d) if !d.allowed => d,
            decision => {
                return Ok(Admitted {
                    decision,
                    identity,
                    set_cookies,
                    response_headers,
                    shadow_refused: checked.shadow_refused,
                    pending: checked.pending,
                });
            }
        };
        let mut resp = Response::new(Bytes::from_static(b"Too Many Requests\n"));
        *resp.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        resp.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        decision.insert_headers(resp.headers_mut());
        Err(resp)
    }
}

impl Enforcer {
    /// The external rules whose `when` holds, in order: the first denial answers; each
    /// allowing answer's upstream headers are applied to `parts`, its client headers returned.
    async fn external(
        &self,
        rt: &PolicyRuntime,
        parts: &mut Parts,
        info: &RequestInfo<'_>,
        act: &Activation<'_>,
    ) -> Result<Vec<(http::HeaderName, HeaderValue)>, Response<Bytes>> {
        let mut client = Vec::new();
        let metrics = rt.auth.metrics();
        for rule in &self.external {
            if !rule.applies(act) {
                continue;
            }
            let Some(io) = &info.external else {
                // Not reached from the proxy's own lifecycle: never let a request through.
                let mut resp = Response::new(Bytes::from_static(b"Forbidden\n"));
                *resp.status_mut() = StatusCode::FORBIDDEN;
                return Err(resp);
            };
            let input = CheckInput {
                method: &parts.method,
                host: info.host,
                target: info.target,
                scheme: info.scheme,
                headers: &parts.headers,
                peer: info.peer,
                body: info.body,
            };
            let (decision, verdict) = rule.check.decide(io, &input, metrics).await;
            rule.count(verdict);
            match decision {
                external::Decision::Allow(grant) => {
                    grant.apply(&mut parts.headers);
                    client.extend(grant.client.iter().cloned());
                }
                external::Decision::Deny(refusal) => {
                    tracing::debug!(rule = %rule.check.id(), status = %refusal.status, "auth: external authorization denied");
                    return Err(refusal.to_response());
                }
            }
        }
        Ok(client)
    }
}

/// Adds what the expressions of `auth` read (compiled again here: [`CompiledAuth`] keeps its
/// own). Every field is named, so a new field with expressions cannot be forgotten.
fn auth_needs(auth: &Auth, needs: &mut Needs) {
    let Auth {
        sources: _,
        when,
        authentication,
        authorization,
        success_headers,
        unauthenticated: _,
        unauthorized: _,
    } = auth;
    let methods = authentication.iter().flat_map(|m| {
        let AuthnMethod {
            name: _,
            policy: _,
            credentials: _,
            method: _,
            when,
        } = m;
        when
    });
    let rules = authorization.iter().flat_map(|r| {
        let AuthzRule {
            name: _,
            policy: _,
            predicate,
            external: _,
            when,
        } = r;
        // An external rule has no predicate.
        when.iter()
            .chain(std::iter::once(predicate).filter(|p| !p.is_empty()))
    });
    let headers = success_headers.iter().map(|(_, e)| e);
    for src in when.iter().chain(methods).chain(rules).chain(headers) {
        match Expr::compile(src) {
            Ok(e) => needs.add(&e),
            // Not reached: `CompiledAuth::build` refused the set already.
            Err(_) => *needs = Needs::everything(),
        }
    }
}
