//! `tollgate explain`: how a route table decides one request, without sending it.
//!
//! In: a [`RouteTable`] and an [`ExplainRequest`] (method, host, path, headers, source
//! address, listener or port). Out: an [`Explanation`]: the listener and virtual host that take
//! the request, the route and rule that match (and the nearest rules that do not, with the
//! predicates they fail), the rule's filters, each policy rule with its outcome for this
//! request, the backends with their endpoints, and the answer the proxy would give. The
//! routing part is [`Router::trace`], the proxy's own router; policies run the proxy's own
//! [`Enforcer`] against a fresh runtime (API keys, basic auth, CEL rules, limits; JWT keys are
//! fetched as the proxy would) and each rule's outcome is what that runtime's
//! `tollgate_policy_decisions_total` counted, so the verdict is the proxy's, not a second
//! implementation. Limits count on fresh counters: one is `limited` only when the request
//! alone exceeds it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode};
use serde::{Deserialize, Serialize};
use tollgate_api::{Filter, RouteTable};

use crate::lifecycle::policy::auth::AuthState;
use crate::lifecycle::policy::decisions::WHOLE_POLICY;
use crate::lifecycle::policy::enforce::{Enforcer, PolicyRuntime, RequestInfo};
use crate::lifecycle::policy::ratelimit::RateLimiter;
use crate::metrics::Metrics;
use crate::router::{Router, RouterError};

/// Rules reported as near misses, at most.
pub const NEAREST: usize = 3;

/// The request to explain.
#[derive(Debug, Clone, Default)]
pub struct ExplainRequest {
    /// The method (`GET` when empty).
    pub method: String,
    /// The Host (a `:port` suffix picks the port when neither `listener` nor `port` does).
    pub host: String,
    /// Path and query, as a client sends them.
    pub path: String,
    /// Request headers (name, value).
    pub headers: Vec<(String, String)>,
    /// The client address policies see (`source.address`); 192.0.2.1 when unset.
    pub source_ip: Option<IpAddr>,
    /// The listener the request arrives on, by name.
    pub listener: Option<String>,
    /// The port it arrives on.
    pub port: Option<u16>,
}

/// Why a request cannot be explained.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// No listener of the table has that name.
    #[error("no listener {0:?} in the route table")]
    NoSuchListener(String),
    /// Several ports and nothing choosing one.
    #[error("the Gateway serves ports {0:?}: name one with --listener or --port")]
    AmbiguousPort(Vec<u16>),
    /// The method, a header name or value is not valid HTTP.
    #[error("invalid request: {0}")]
    Request(String),
    /// The table does not build (the compiler should have refused it).
    #[error(transparent)]
    Router(#[from] RouterError),
}

/// How the table decides the request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Explanation {
    /// The Gateway (`namespace/name`).
    pub gateway: String,
    /// The listener that takes the request; `None` when none of the port's does.
    pub listener: Option<ListenerOut>,
    /// The matching route (`namespace/name`); `None` when nothing matches.
    pub route: Option<String>,
    /// The matching rule.
    pub rule: Option<RuleOut>,
    /// The rules nearest to matching, ahead of the winner (or all when none won).
    pub near_misses: Vec<MissOut>,
    /// The rule's filters, in order (`Kind {settings}`).
    pub filters: Vec<String>,
    /// Each policy that applies, with its outcome.
    pub policies: Vec<PolicyOut>,
    /// The rule's backends with their endpoints.
    pub backends: Vec<BackendOut>,
    /// What the proxy would answer, in a few words.
    pub answer: String,
}

/// A listener.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListenerOut {
    /// Its name.
    pub name: String,
    /// Its port.
    pub port: u16,
    /// The virtual host (hostname) that takes the request; `None` when none does.
    pub virtual_host: Option<String>,
}

/// A rule of a route.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleOut {
    /// Index in the route's `rules`.
    pub index: u32,
    /// `rules[].name`, when it has one.
    pub name: Option<String>,
}

/// A rule that did not match.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MissOut {
    /// The route (`namespace/name`).
    pub route: String,
    /// The rule.
    pub rule: RuleOut,
    /// One per predicate it fails.
    pub reasons: Vec<String>,
}

/// A rule of a policy and what it decides.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyOut {
    /// `AuthPolicy` or `RateLimitPolicy`.
    pub kind: String,
    /// `namespace/name`.
    pub name: String,
    /// The rule, as `tollgate_policy_decisions_total` names it: `authentication.<method>`,
    /// `authorization.<rule>`, `limits.<limit>`, or `-` for the policy as a whole.
    pub rule: String,
    /// The rule's outcome as the proxy counts it (`authenticated`, `unauthenticated`,
    /// `error`, `allowed`, `forbidden`, `denied`, `fail_open`, `skipped`, `limited`,
    /// `shadow_limited`, `closed`), or `not reached` when the request was decided before it
    /// (or another method authenticated it first).
    pub outcome: String,
}

/// A backend of the rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendOut {
    /// The table's backend key (`namespace/service:port`); `None` when the ref is unresolved.
    pub name: Option<String>,
    /// Its weight.
    pub weight: u32,
    /// Its endpoints, `ip:port`.
    pub endpoints: Vec<String>,
}

/// Explains `req` against `table`.
pub async fn explain(
    table: &RouteTable,
    req: &ExplainRequest,
) -> Result<Explanation, ExplainError> {
    let router = Router::build(table)?;
    explain_with(table, &router, req).await
}

/// Explains `req` with an already built `router` of `table` (a running proxy's).
pub async fn explain_with(
    table: &RouteTable,
    router: &Router,
    req: &ExplainRequest,
) -> Result<Explanation, ExplainError> {
    let port = pick_port(table, req)?;
    let method = if req.method.is_empty() {
        Method::GET
    } else {
        Method::from_bytes(req.method.as_bytes())
            .map_err(|e| ExplainError::Request(format!("method {:?}: {e}", req.method)))?
    };
    let headers = header_map(&req.headers)?;
    let path = if req.path.is_empty() { "/" } else { &req.path };
    let trace = router.trace(port, &req.host, &method, path, &headers, NEAREST);
    let mut out = Explanation {
        gateway: table.gateway.to_string(),
        listener: trace.listener.map(|name| ListenerOut {
            name: name.to_owned(),
            port,
            virtual_host: trace.virtual_host.map(str::to_owned),
        }),
        route: None,
        rule: None,
        near_misses: trace
            .misses
            .iter()
            .map(|m| MissOut {
                route: m.route.label.to_string(),
                rule: RuleOut {
                    index: m.route.api.rule_index,
                    name: m.route.api.rule_name.clone(),
                },
                reasons: m.reasons.clone(),
            })
            .collect(),
        filters: Vec::new(),
        policies: Vec::new(),
        backends: Vec::new(),
        answer: String::new(),
    };
    let Some(chosen) = trace.chosen else {
        out.answer = match (trace.listener, trace.virtual_host) {
            (None, _) => format!("404: no listener of port {port} takes host {:?}", req.host),
            (Some(_), None) => format!("404: no virtual host of the listener takes {:?}", req.host),
            (Some(_), Some(_)) => "404: no rule matches".to_owned(),
        };
        return Ok(out);
    };
    let route = &chosen.route.api;
    out.route = Some(chosen.route.label.to_string());
    out.rule = Some(RuleOut {
        index: route.rule_index,
        name: route.rule_name.clone(),
    });
    out.filters = route.filters.iter().map(describe_filter).collect();
    out.backends = route
        .backends
        .iter()
        .map(|b| BackendOut {
            name: b.backend.clone(),
            weight: b.weight,
            endpoints: b
                .backend
                .as_ref()
                .and_then(|k| table.backends.get(k))
                .map(|be| {
                    be.endpoints
                        .iter()
                        .map(|e| match e.ip.parse::<IpAddr>() {
                            Ok(IpAddr::V6(_)) => format!("[{}]:{}", e.ip, e.port),
                            _ => format!("{}:{}", e.ip, e.port),
                        })
                        .collect()
                })
                .unwrap_or_default(),
        })
        .collect();
    let denied = policies(
        table,
        route.policy.as_deref(),
        req,
        &method,
        path,
        &headers,
        &mut out,
    )
    .await;
    out.answer = denied.unwrap_or_else(|| forward_answer(route, &out.backends));
    Ok(out)
}

/// The port the request arrives on: the named listener's, the one given, the Host's `:port`,
/// or the only one.
fn pick_port(table: &RouteTable, req: &ExplainRequest) -> Result<u16, ExplainError> {
    if let Some(name) = &req.listener {
        return table
            .ports
            .iter()
            .find(|p| p.listeners.iter().any(|l| &l.name == name))
            .map(|p| p.port)
            .ok_or_else(|| ExplainError::NoSuchListener(name.clone()));
    }
    if let Some(p) = req.port {
        return Ok(p);
    }
    let mut ports: Vec<u16> = table.ports.iter().map(|p| p.port).collect();
    ports.sort_unstable();
    ports.dedup();
    let from_host = req
        .host
        .rsplit_once(':')
        .filter(|(h, _)| !h.contains(':') || h.ends_with(']'))
        .and_then(|(_, p)| p.parse::<u16>().ok())
        .filter(|p| ports.contains(p));
    match (from_host, ports.as_slice()) {
        (Some(p), _) => Ok(p),
        (None, [only]) => Ok(*only),
        (None, _) => Err(ExplainError::AmbiguousPort(ports)),
    }
}

fn header_map(headers: &[(String, String)]) -> Result<HeaderMap, ExplainError> {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        let n = HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|e| ExplainError::Request(format!("header name {name:?}: {e}")))?;
        let v = HeaderValue::from_str(value.trim())
            .map_err(|e| ExplainError::Request(format!("header {name} value: {e}")))?;
        map.append(n, v);
    }
    Ok(map)
}

/// `Kind {settings as JSON}` of a filter.
fn describe_filter(f: &Filter) -> String {
    match serde_json::to_value(f) {
        Ok(serde_json::Value::Object(mut m)) => {
            let kind = m
                .remove("type")
                .and_then(|t| t.as_str().map(str::to_owned))
                .unwrap_or_default();
            let kind = kind
                .get(..1)
                .map(|c| format!("{}{}", c.to_ascii_uppercase(), &kind[1..]))
                .unwrap_or(kind);
            format!("{kind} {}", serde_json::Value::Object(m))
        }
        _ => format!("{f:?}"),
    }
}

/// The policies of the rule and their outcomes (into `out.policies`); the answer when they
/// end the request.
async fn policies(
    table: &RouteTable,
    key: Option<&str>,
    req: &ExplainRequest,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    out: &mut Explanation,
) -> Option<String> {
    let key = key?;
    if let Some(closed) = table.closed.get(key) {
        for by in &closed.by {
            out.policies.push(PolicyOut {
                kind: "AuthPolicy".into(),
                name: by.to_string(),
                rule: WHOLE_POLICY.into(),
                outcome: "closed".into(),
            });
        }
        return Some("500: closed by invalid policies".into());
    }
    let set = table.policies.get(key)?;
    let metrics = Metrics::default();
    // A registry of its own: explaining a request counts nothing the proxy reports.
    let rt = PolicyRuntime {
        auth: AuthState::new(metrics.auth().clone()),
        limiter: RateLimiter::in_memory(metrics.rate_limit().clone()),
        decisions: metrics.policy_decisions().clone(),
    };
    let verdict = match Enforcer::build(key, set, &rt) {
        Err(e) => Err(format!("500: {e}")),
        Ok(enforcer) => {
            let mut builder = Request::builder().method(method.clone()).uri(path);
            if let Some(h) = builder.headers_mut() {
                h.clone_from(headers);
            }
            match builder.body(()) {
                Err(e) => Err(format!("400: {e}")),
                Ok(request) => {
                    let (mut parts, ()) = request.into_parts();
                    let host = crate::router::host_without_port(&req.host).to_owned();
                    let ip = req
                        .source_ip
                        .unwrap_or(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)));
                    let info = RequestInfo {
                        host: &host,
                        target: path,
                        scheme: "http",
                        peer: SocketAddr::new(ip, 40000),
                        peer_address: None,
                        peer_cert: None,
                        body: None,
                        external: None,
                    };
                    match enforcer.enforce(&rt, &mut parts, info).await {
                        Ok(_) => Ok(()),
                        Err(resp) => Err(answer_of(resp.status())),
                    }
                }
            }
        }
    };
    let decided = decisions(&metrics.encode());
    // External authorization services are not called to explain a request (that would be a
    // real check, with its side effects): the enforcer refuses without one, which is no
    // verdict of the service's.
    let external: Vec<String> = set
        .auth
        .iter()
        .flat_map(|a| &a.authorization)
        .filter(|r| r.external.is_some())
        .map(|r| format!("authorization.{}", r.name))
        .collect();
    let refused_by_rule = decided
        .iter()
        .any(|(_, r, o)| r.starts_with("authorization.") && (o == "forbidden" || o == "denied"));
    let verdict = match verdict {
        Err(s) if s.starts_with("403") && !external.is_empty() && !refused_by_rule => {
            Err("depends on the external authorization service (not called to explain)".to_owned())
        }
        v => v,
    };
    let mut rules: Vec<(&str, String, String)> = Vec::new();
    if let Some(auth) = &set.auth {
        for m in &auth.authentication {
            rules.push((
                "AuthPolicy",
                m.policy.to_string(),
                format!("authentication.{}", m.name),
            ));
        }
        for r in &auth.authorization {
            rules.push((
                "AuthPolicy",
                r.policy.to_string(),
                format!("authorization.{}", r.name),
            ));
        }
        for p in &auth.sources {
            rules.push(("AuthPolicy", p.to_string(), WHOLE_POLICY.to_owned()));
        }
    }
    for limit in &set.rate_limits {
        let (policy, name) = limit.id.rsplit_once('/').unwrap_or((&limit.id, ""));
        rules.push((
            "RateLimitPolicy",
            policy.to_owned(),
            format!("limits.{name}"),
        ));
    }
    for (kind, name, rule) in rules {
        let outcomes: Vec<&str> = decided
            .iter()
            .filter(|(p, r, _)| *p == name && *r == rule)
            .map(|(_, _, o)| o.as_str())
            .collect();
        // The policy as a whole appears only when it decided (skipped, closed, ...).
        if rule == WHOLE_POLICY && outcomes.is_empty() {
            continue;
        }
        let outcome = match outcomes.is_empty() {
            true if external.contains(&rule) => "not evaluated (external service)".to_owned(),
            true => "not reached".to_owned(),
            false => outcomes.join(", "),
        };
        if !out
            .policies
            .iter()
            .any(|p| p.name == name && p.rule == rule)
        {
            out.policies.push(PolicyOut {
                kind: kind.into(),
                name,
                rule,
                outcome,
            });
        }
    }
    verdict.err()
}

/// The (policy, rule, outcome) series above zero in an OpenMetrics text: what the fresh
/// runtime counted for the one request explained.
fn decisions(metrics: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("tollgate_policy_decisions_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        if value.trim().parse::<f64>().map_or(true, |v| v <= 0.0) {
            continue;
        }
        let label = |key: &str| {
            labels
                .split("\",")
                .find_map(|kv| kv.strip_prefix(&format!("{key}=\"")))
                .map(|v| v.trim_end_matches('"').to_owned())
        };
        if let (Some(p), Some(r), Some(o)) = (label("policy"), label("rule"), label("outcome")) {
            out.push((p, r, o));
        }
    }
    out
}

fn answer_of(status: StatusCode) -> String {
    match status.as_u16() {
        401 => "401: not authenticated".into(),
        403 => "403: not authorized".into(),
        429 => "429: rate limited".into(),
        s => format!("{s}: refused by policy"),
    }
}

/// What a rule the policies let through answers.
fn forward_answer(route: &tollgate_api::Route, backends: &[BackendOut]) -> String {
    if let Some(Filter::RequestRedirect(_)) = route
        .filters
        .iter()
        .find(|f| matches!(f, Filter::RequestRedirect(_)))
    {
        return "redirect".into();
    }
    let live: Vec<&BackendOut> = backends.iter().filter(|b| b.weight > 0).collect();
    if live.is_empty() {
        return "500: no backend".into();
    }
    if live.iter().all(|b| b.name.is_none()) {
        return "500: backend unresolved".into();
    }
    if live.iter().all(|b| b.endpoints.is_empty()) {
        return "503: no endpoints".into();
    }
    let names: Vec<&str> = live.iter().filter_map(|b| b.name.as_deref()).collect();
    format!("forwarded to {}", names.join(", "))
}
