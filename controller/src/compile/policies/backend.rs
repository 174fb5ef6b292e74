//! BackendPolicy into the route tables. In: the BackendPolicies, the Services (by index) and
//! the tables built from the routes. Out: each table backend of a targeted Service port
//! carries the winning policy's settings (and balancer), and each policy's status. A
//! consistent-hash expression is checked as the proxy will compile it (`cel::check`, as
//! AuthPolicy and RateLimitPolicy expressions are).
//!
//! Which policy a backend gets: one naming its port (`sectionName`) over one naming the
//! whole Service; between two of the same reach, the older (then by name) wins and the
//! other is `Conflicted` for that target. An invalid policy is `Accepted=False` (`Invalid`)
//! and applies nowhere: the Service is balanced as without it. BackendPolicy grants and
//! denies nothing, so there is nothing to close when it is wrong.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tollgate_api::backend::{
    BackendSettings, CircuitBreaker, Connection, DEFAULT_PANIC_THRESHOLD_PERCENT, HashOn,
    HealthCheck, OutlierDetection, Probe,
};
use tollgate_api::{BackendProtocol, LoadBalancer, ObjectKey, RouteTable};
use tollgate_proxy::policy::cel;

use super::services;
use crate::compile::Objects;
use crate::compile::index::{Index, key_of};
use crate::compile::rules::parse_duration_ms;
use crate::crds::backend::{
    ActiveHealthCheck, BackendPolicy, BackendPolicySpec, ConsistentHashSpec, HealthCheckType,
    LoadBalancerType, OutlierDetectionSpec,
};
use crate::crds::common::PolicyStatus;

/// Outlier detection defaults (Envoy's).
const DEFAULT_CONSECUTIVE_5XX: u32 = 5;
const DEFAULT_INTERVAL_MS: u64 = 10_000;
const DEFAULT_BASE_EJECTION_MS: u64 = 30_000;
const DEFAULT_MAX_EJECTION_PERCENT: u32 = 10;
/// Health check defaults.
const DEFAULT_HC_INTERVAL_MS: u64 = 5_000;
const DEFAULT_HC_TIMEOUT_MS: u64 = 1_000;
const DEFAULT_UNHEALTHY_THRESHOLD: u32 = 3;
const DEFAULT_HEALTHY_THRESHOLD: u32 = 1;
/// Shortest health-check interval: each check is a request to every endpoint from every
/// proxy replica.
const MIN_HC_INTERVAL_MS: u64 = 100;

/// What a valid policy compiles to.
#[derive(Debug, Clone, PartialEq)]
pub struct Compiled {
    /// The balancer it sets, if it sets one.
    pub load_balancer: Option<LoadBalancer>,
    pub settings: BackendSettings,
}

/// Applies the policies to `tables`; the status of each policy.
pub fn apply(
    policies: &Objects<BackendPolicy>,
    idx: &Index<'_>,
    tables: &mut BTreeMap<ObjectKey, RouteTable>,
    now: &Time,
) -> BTreeMap<ObjectKey, PolicyStatus> {
    let order = services::oldest_first(policies, |p| &p.metadata);
    let compiled: Vec<Result<Compiled, String>> =
        order.iter().map(|p| compile_spec(&p.spec)).collect();
    let claims: Vec<services::Claim<'_>> = order
        .iter()
        .zip(&compiled)
        .map(|(p, c)| services::Claim {
            key: key_of(&p.metadata),
            valid: c.is_ok(),
            targets: p
                .spec
                .target_refs
                .iter()
                .map(|t| services::Target {
                    group: &t.group,
                    kind: &t.kind,
                    name: &t.name,
                    section: t.section_name.as_deref(),
                })
                .collect(),
        })
        .collect();
    let res = services::resolve("BackendPolicy", &claims, idx);
    let mut partial = vec![false; order.len()];
    let reached = res.apply(idx, tables, |i, backend| {
        let Ok(c) = &compiled[i] else {
            return false;
        };
        if backend.protocol == BackendProtocol::Udp {
            // A UDPRoute's backend carries datagrams: only its balancing (not by a request's
            // key) applies; no connection, no probe this proxy can make of it.
            partial[i] = true;
            if let Some(lb) = c
                .load_balancer
                .filter(|lb| *lb != LoadBalancer::ConsistentHash)
            {
                backend.load_balancer = lb;
            }
            backend.settings = BackendSettings::default();
            return true;
        }
        if backend.protocol == BackendProtocol::Tcp {
            // A TLSRoute's or TCPRoute's backend carries bytes, not requests: only its balancing (not by a
            // request's key) and TCP health checks apply.
            partial[i] = true;
            if let Some(lb) = c
                .load_balancer
                .filter(|lb| *lb != LoadBalancer::ConsistentHash)
            {
                backend.load_balancer = lb;
            }
            backend.settings = BackendSettings {
                health_check: c
                    .settings
                    .health_check
                    .clone()
                    .filter(|h| h.probe == Probe::Tcp),
                panic_threshold_percent: c.settings.panic_threshold_percent,
                connection: Connection {
                    slow_start_ms: c.settings.connection.slow_start_ms,
                    ..Connection::default()
                },
                ..BackendSettings::default()
            };
            return true;
        }
        if let Some(lb) = c.load_balancer {
            backend.load_balancer = lb;
        }
        // What another kind set on the backend (XBackendTrafficPolicy) stays.
        let (budget, session) = (
            backend.settings.retry_budget.take(),
            backend.settings.session.take(),
        );
        backend.settings = c.settings.clone();
        backend.settings.retry_budget = budget;
        backend.settings.session = session;
        true
    });
    services::statuses(
        &order,
        |p| &p.metadata,
        &res,
        |i| compiled[i].as_ref().err().cloned(),
        &reached,
        now,
        |i| {
            let mut notes = Vec::new();
            if partial[i] {
                notes.push(
                    "on TLSRoute and TCPRoute backends only loadBalancer (not ConsistentHash) and TCP health checks apply, on UDPRoute backends only loadBalancer",
                );
            }
            notes
        },
    )
}

/// A duration field in milliseconds; `what` names it in the error.
fn ms(v: Option<&String>, what: &str, default: u64) -> Result<u64, String> {
    match v {
        None => Ok(default),
        Some(s) => parse_duration_ms(s)
            .map(|d| d.unwrap_or(0))
            .map_err(|e| format!("{what}: {s:?}: {e}")),
    }
}

/// Checks and compiles a policy's spec.
pub fn compile_spec(spec: &BackendPolicySpec) -> Result<Compiled, String> {
    for (i, t) in spec.target_refs.iter().enumerate() {
        if !t.group.is_empty() || t.kind != "Service" {
            return Err(format!(
                "spec.targetRefs[{i}]: only Services (group \"\", kind Service) can be targeted, not {}/{}",
                t.group, t.kind
            ));
        }
    }
    let mut settings = BackendSettings::default();
    let mut load_balancer = None;
    if let Some(lb) = &spec.load_balancer {
        load_balancer = Some(match lb.kind {
            LoadBalancerType::LeastRequest => LoadBalancer::LeastRequest,
            LoadBalancerType::RoundRobin => LoadBalancer::RoundRobin,
            LoadBalancerType::Random => LoadBalancer::Random,
            LoadBalancerType::ConsistentHash => LoadBalancer::ConsistentHash,
        });
        match (lb.kind, &lb.consistent_hash) {
            (LoadBalancerType::ConsistentHash, Some(h)) => settings.hash = Some(hash_on(h)?),
            (LoadBalancerType::ConsistentHash, None) => {
                return Err("spec.loadBalancer: type ConsistentHash needs consistentHash".into());
            }
            (_, Some(_)) => {
                return Err(
                    "spec.loadBalancer.consistentHash is only for type ConsistentHash".into(),
                );
            }
            (_, None) => {}
        }
        if lb.slow_start.is_some() && lb.kind != LoadBalancerType::LeastRequest {
            return Err(
                "spec.loadBalancer.slowStart: only LeastRequest weighs endpoints by load".into(),
            );
        }
        if let Some(s) = &lb.slow_start {
            settings.connection.slow_start_ms =
                Some(ms(Some(s), "spec.loadBalancer.slowStart", 0)?).filter(|w| *w > 0);
        }
    }
    if let Some(cb) = &spec.circuit_breaker {
        settings.circuit_breaker = CircuitBreaker {
            max_connections: cb.max_connections,
            max_pending_requests: cb.max_pending_requests,
            max_requests: cb.max_requests,
            max_retries: cb.max_retries,
        };
        for (name, v) in [
            ("maxConnections", cb.max_connections),
            ("maxRequests", cb.max_requests),
        ] {
            if v == Some(0) {
                return Err(format!(
                    "spec.circuitBreaker.{name}: 0 would refuse every request"
                ));
            }
        }
    }
    if let Some(od) = &spec.outlier_detection {
        let (outlier, panic) = outlier(od)?;
        settings.outlier = Some(outlier);
        settings.panic_threshold_percent = panic;
    }
    if let Some(active) = spec.health_check.as_ref().and_then(|h| h.active.as_ref()) {
        settings.health_check = Some(health_check(active)?);
    }
    if let Some(c) = &spec.connection {
        let f = "spec.connection";
        settings.connection = Connection {
            connect_timeout_ms: opt_ms(c.connect_timeout.as_ref(), &format!("{f}.connectTimeout"))?,
            idle_timeout_ms: opt_ms(c.idle_timeout.as_ref(), &format!("{f}.idleTimeout"))?,
            max_requests_per_connection: c.max_requests_per_connection,
            tcp_keepalive_idle_ms: opt_ms(c.tcp_keepalive.as_ref(), &format!("{f}.tcpKeepalive"))?,
            slow_start_ms: settings.connection.slow_start_ms,
        };
        if settings
            .connection
            .tcp_keepalive_idle_ms
            .is_some_and(|t| t < 1_000)
        {
            return Err(format!("{f}.tcpKeepalive: at least 1s"));
        }
    }
    Ok(Compiled {
        load_balancer,
        settings,
    })
}

/// A positive duration, or none.
fn opt_ms(v: Option<&String>, what: &str) -> Result<Option<u64>, String> {
    match v {
        None => Ok(None),
        Some(_) => match ms(v, what, 0)? {
            0 => Err(format!("{what}: must be more than 0")),
            d => Ok(Some(d)),
        },
    }
}

fn hash_on(h: &ConsistentHashSpec) -> Result<HashOn, String> {
    let f = "spec.loadBalancer.consistentHash";
    let given = [
        h.header.is_some(),
        h.cookie.is_some(),
        h.source_ip.is_some(),
        h.expression.is_some(),
    ]
    .iter()
    .filter(|b| **b)
    .count();
    if given != 1 {
        return Err(format!(
            "{f}: exactly one of header, cookie, sourceIP and expression"
        ));
    }
    if let Some(name) = &h.header {
        let lower = name.to_ascii_lowercase();
        http::HeaderName::from_bytes(lower.as_bytes())
            .map_err(|_| format!("{f}.header: {name:?} is not a header name"))?;
        return Ok(HashOn::Header(lower));
    }
    if let Some(c) = &h.cookie {
        let token = !c.name.is_empty()
            && c.name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !token {
            return Err(format!(
                "{f}.cookie.name: {:?} is not a cookie name",
                c.name
            ));
        }
        let ttl_secs = match &c.ttl {
            None => None,
            Some(t) => Some(ms(Some(t), &format!("{f}.cookie.ttl"), 0)? / 1000).filter(|s| *s > 0),
        };
        return Ok(HashOn::Cookie {
            name: c.name.clone(),
            ttl_secs,
        });
    }
    if h.source_ip.is_some() {
        return Ok(HashOn::SourceIp);
    }
    let Some(expr) = &h.expression else {
        return Err(format!(
            "{f}: exactly one of header, cookie, sourceIP and expression"
        ));
    };
    // What the proxy compiles when it builds the backend's balancer.
    cel::check(expr).map_err(|e| format!("{f}.expression: {e}"))?;
    Ok(HashOn::Expression(expr.clone()))
}

fn outlier(od: &OutlierDetectionSpec) -> Result<(OutlierDetection, u32), String> {
    let f = "spec.outlierDetection";
    let none_given = od.consecutive_5xx.is_none()
        && od.consecutive_gateway_errors.is_none()
        && od.consecutive_local_origin_failures.is_none();
    let interval_ms = ms(
        od.interval.as_ref(),
        &format!("{f}.interval"),
        DEFAULT_INTERVAL_MS,
    )?;
    let base_ejection_ms = ms(
        od.base_ejection_time.as_ref(),
        &format!("{f}.baseEjectionTime"),
        DEFAULT_BASE_EJECTION_MS,
    )?;
    if base_ejection_ms == 0 {
        return Err(format!("{f}.baseEjectionTime: must be more than 0"));
    }
    let percent = |v: Option<u32>, name: &str, default: u32| match v {
        Some(p) if p > 100 => Err(format!("{f}.{name}: {p} is over 100")),
        v => Ok(v.unwrap_or(default)),
    };
    for (name, v) in [
        ("consecutive5xx", od.consecutive_5xx),
        ("consecutiveGatewayErrors", od.consecutive_gateway_errors),
        (
            "consecutiveLocalOriginFailures",
            od.consecutive_local_origin_failures,
        ),
    ] {
        if v == Some(0) {
            return Err(format!("{f}.{name}: must be at least 1"));
        }
    }
    Ok((
        OutlierDetection {
            consecutive_5xx: if none_given {
                Some(DEFAULT_CONSECUTIVE_5XX)
            } else {
                od.consecutive_5xx
            },
            consecutive_gateway_errors: od.consecutive_gateway_errors,
            consecutive_local_origin_failures: od.consecutive_local_origin_failures,
            interval_ms,
            base_ejection_ms,
            max_ejection_percent: percent(
                od.max_ejection_percent,
                "maxEjectionPercent",
                DEFAULT_MAX_EJECTION_PERCENT,
            )?,
        },
        percent(
            od.panic_threshold,
            "panicThreshold",
            DEFAULT_PANIC_THRESHOLD_PERCENT,
        )?,
    ))
}

fn health_check(a: &ActiveHealthCheck) -> Result<HealthCheck, String> {
    let f = "spec.healthCheck.active";
    let probe = match a.kind {
        HealthCheckType::Http => {
            let h = a
                .http
                .as_ref()
                .ok_or_else(|| format!("{f}: type HTTP needs http"))?;
            if !h.path.starts_with('/')
                || http::uri::PathAndQuery::try_from(h.path.as_str()).is_err()
            {
                return Err(format!("{f}.http.path: {:?} is not a path", h.path));
            }
            if let Some(host) = &h.host
                && http::uri::Authority::try_from(host.as_str()).is_err()
            {
                return Err(format!("{f}.http.host: {host:?} is not a host"));
            }
            let expected = h.expected_statuses.clone().unwrap_or_else(|| vec![200]);
            if expected.is_empty() {
                return Err(format!("{f}.http.expectedStatuses: at least one status"));
            }
            if let Some(bad) = expected.iter().find(|s| !(100..=599).contains(*s)) {
                return Err(format!("{f}.http.expectedStatuses: {bad} is not a status"));
            }
            Probe::Http {
                path: h.path.clone(),
                host: h.host.clone(),
                expected_statuses: expected,
            }
        }
        HealthCheckType::Grpc => Probe::Grpc {
            service: a
                .grpc
                .as_ref()
                .and_then(|g| g.service.clone())
                .unwrap_or_default(),
        },
        HealthCheckType::Tcp => Probe::Tcp,
    };
    if a.http.is_some() && a.kind != HealthCheckType::Http
        || a.grpc.is_some() && a.kind != HealthCheckType::Grpc
    {
        return Err(format!("{f}: http and grpc go with their own type only"));
    }
    let interval_ms = ms(
        a.interval.as_ref(),
        &format!("{f}.interval"),
        DEFAULT_HC_INTERVAL_MS,
    )?;
    if interval_ms < MIN_HC_INTERVAL_MS {
        return Err(format!("{f}.interval: at least {MIN_HC_INTERVAL_MS}ms"));
    }
    let timeout_ms = ms(
        a.timeout.as_ref(),
        &format!("{f}.timeout"),
        DEFAULT_HC_TIMEOUT_MS,
    )?;
    if timeout_ms == 0 || timeout_ms > interval_ms {
        return Err(format!(
            "{f}.timeout: must be more than 0 and at most the interval"
        ));
    }
    Ok(HealthCheck {
        probe,
        interval_ms,
        timeout_ms,
        unhealthy_threshold: a
            .unhealthy_threshold
            .unwrap_or(DEFAULT_UNHEALTHY_THRESHOLD)
            .max(1),
        healthy_threshold: a
            .healthy_threshold
            .unwrap_or(DEFAULT_HEALTHY_THRESHOLD)
            .max(1),
    })
}
