//! BackendPolicy: settings into the table backends of the Service ports it targets (a
//! port's policy over its Service's, the older over the younger), exact statuses for each
//! way a policy is refused.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod compile_support;

use compile_support::*;
use tollgate::compile::Output;
use tollgate_api::LoadBalancer;
use tollgate_api::backend::{
    BackendSettings, CircuitBreaker, Connection, HashOn, HealthCheck, OutlierDetection, Probe,
};

fn out() -> Output {
    run(&["backend_policy"], "")
}

fn policy_conds<'a>(
    out: &'a Output,
    name: &str,
) -> &'a [k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition] {
    &out.backend_policies[&tollgate_api::ObjectKey::new("apps", name)].conditions
}

#[track_caller]
fn assert_refused(out: &Output, name: &str, reason: &str, needle: &str) {
    let c = policy_conds(out, name);
    assert_cond(c, "Accepted", "False", reason);
    let msg = &cond(c, "Accepted").message;
    assert!(msg.contains(needle), "{name}: {msg:?} lacks {needle:?}");
}

#[test]
fn every_field_of_the_issue_shape_compiles_into_the_services_backends() {
    let out = out();
    let t = table(&out, "infra", "gw");
    let web = &t.backends["apps/web:80"];
    assert_eq!(web.load_balancer, LoadBalancer::ConsistentHash);
    assert_eq!(
        web.settings,
        BackendSettings {
            hash: Some(HashOn::Cookie {
                name: "sid".into(),
                ttl_secs: Some(3600),
            }),
            circuit_breaker: CircuitBreaker {
                max_connections: Some(1024),
                max_pending_requests: Some(256),
                max_requests: Some(1024),
                max_retries: Some(3),
            },
            outlier: Some(OutlierDetection {
                consecutive_5xx: Some(5),
                consecutive_gateway_errors: Some(3),
                consecutive_local_origin_failures: None,
                interval_ms: 5_000,
                base_ejection_ms: 30_000,
                max_ejection_percent: 50,
            }),
            health_check: Some(HealthCheck {
                probe: Probe::Http {
                    path: "/healthz".into(),
                    host: None,
                    expected_statuses: vec![200],
                },
                interval_ms: 2_000,
                timeout_ms: 1_000,
                unhealthy_threshold: 2,
                healthy_threshold: 1,
            }),
            panic_threshold_percent: 50,
            connection: Connection {
                connect_timeout_ms: Some(2_000),
                idle_timeout_ms: Some(60_000),
                ..Connection::default()
            },
            retry_budget: None,
            session: None,
        }
    );
    assert_cond(policy_conds(&out, "web"), "Accepted", "True", "Accepted");
    let st = &out.backend_policies[&tollgate_api::ObjectKey::new("apps", "web")];
    let ancestors: Vec<String> = st
        .ancestors
        .iter()
        .map(|a| format!("{}/{}", a.ancestor_ref.namespace, a.ancestor_ref.name))
        .collect();
    assert_eq!(ancestors, ["infra/gw"]);
}

#[test]
fn a_ports_policy_wins_there_and_an_untargeted_service_is_as_before() {
    let out = out();
    let t = table(&out, "infra", "gw");
    let admin = &t.backends["apps/web:9000"];
    assert_eq!(admin.load_balancer, LoadBalancer::RoundRobin);
    assert!(admin.settings.is_empty(), "{:?}", admin.settings);
    assert_cond(
        policy_conds(&out, "web-admin"),
        "Accepted",
        "True",
        "Accepted",
    );
    // Every policy on api is invalid: api keeps its annotation's round robin, no settings.
    let api = &t.backends["apps/api:8080"];
    assert_eq!(api.load_balancer, LoadBalancer::RoundRobin);
    assert!(api.settings.is_empty());
}

#[test]
fn the_younger_of_two_on_one_service_is_conflicted() {
    assert_refused(
        &out(),
        "web-late",
        "Conflicted",
        "already has BackendPolicy apps/web",
    );
}

#[test]
fn targets_that_do_not_exist_are_named() {
    assert_refused(
        &out(),
        "nowhere",
        "TargetNotFound",
        "Service apps/ghost, Service apps/web port nope",
    );
}

#[test]
fn invalid_specs_are_refused_with_the_field() {
    let out = out();
    assert_refused(&out, "bad-hash", "Invalid", "exactly one of header, cookie");
    assert_refused(
        &out,
        "bad-check",
        "Invalid",
        "spec.healthCheck.active.timeout",
    );
    assert_refused(&out, "bad-kind", "Invalid", "only Services");
}

const BY_IDENTITY: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: sticky, namespace: apps}
spec:
  parentRefs: [{name: gw, namespace: infra}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /sticky}}]
    backendRefs: [{name: rolling, port: 80}]
---
apiVersion: tollgate.dev/v1alpha1
kind: BackendPolicy
metadata: {name: by-identity, namespace: apps}
spec:
  targetRefs: [{group: "", kind: Service, name: rolling}]
  loadBalancer: {type: ConsistentHash, consistentHash: {expression: auth.identity.sub}}
"#;

#[test]
fn an_expression_key_compiles_into_the_services_backend() {
    let out = run(&["backend_policy"], BY_IDENTITY);
    let rolling = &table(&out, "infra", "gw").backends["apps/rolling:80"];
    assert_eq!(rolling.load_balancer, LoadBalancer::ConsistentHash);
    assert_eq!(
        rolling.settings,
        BackendSettings {
            hash: Some(HashOn::Expression("auth.identity.sub".into())),
            ..BackendSettings::default()
        }
    );
    assert_cond(
        policy_conds(&out, "by-identity"),
        "Accepted",
        "True",
        "Accepted",
    );
}

#[test]
fn an_expression_that_does_not_compile_is_invalid_with_the_field_and_applies_nowhere() {
    let out = out();
    let f = "spec.loadBalancer.consistentHash.expression";
    assert_refused(
        &out,
        "bad-expression",
        "Invalid",
        &format!("{f}: invalid CEL expression `auth.identity.sub ==`"),
    );
    assert_refused(
        &out,
        "bad-variable",
        "Invalid",
        &format!("{f}: CEL expression `identity.sub` uses unknown variable `identity`"),
    );
    // api keeps its annotation's round robin and hashes on nothing.
    let api = &table(&out, "infra", "gw").backends["apps/api:8080"];
    assert_eq!(api.load_balancer, LoadBalancer::RoundRobin);
    assert_eq!(api.settings.hash, None);
}

#[test]
fn the_table_without_policies_serializes_as_before() {
    let out = run(&["backends"], "");
    let t = table(&out, "infra", "gw");
    let json = serde_json::to_string(&t.backends).unwrap();
    assert!(!json.contains("settings"), "{json}");
}

const TRAFFIC: &str = r#"
apiVersion: gateway.networking.x-k8s.io/v1alpha1
kind: XBackendTrafficPolicy
metadata: {name: budget, namespace: apps, creationTimestamp: "2026-01-01T00:00:00Z"}
spec:
  targetRefs: [{group: "", kind: Service, name: web}]
  retryConstraint:
    budget: {percent: 25, interval: 20s}
    minRetryRate: {count: 5, interval: 2s}
  sessionPersistence: {sessionName: shop, type: Cookie, absoluteTimeout: 30m}
---
apiVersion: gateway.networking.x-k8s.io/v1alpha1
kind: XBackendTrafficPolicy
metadata: {name: defaults, namespace: apps, creationTimestamp: "2026-01-01T00:00:00Z"}
spec:
  targetRefs: [{group: "", kind: Service, name: api}]
  retryConstraint: {}
---
apiVersion: gateway.networking.x-k8s.io/v1alpha1
kind: XBackendTrafficPolicy
metadata: {name: late, namespace: apps, creationTimestamp: "2026-01-02T00:00:00Z"}
spec:
  targetRefs: [{group: "", kind: Service, name: web}]
  retryConstraint: {budget: {percent: 50}}
---
apiVersion: gateway.networking.x-k8s.io/v1alpha1
kind: XBackendTrafficPolicy
metadata: {name: too-much, namespace: apps}
spec:
  targetRefs: [{group: "", kind: Service, name: web}]
  retryConstraint: {budget: {percent: 101}}
"#;

#[test]
fn a_backend_traffic_policy_sets_the_budget_and_session_beside_a_backend_policy() {
    use tollgate_api::backend::{RetryBudget, Session, SessionCarrier};
    let out = run(&["backend_policy"], TRAFFIC);
    let t = table(&out, "infra", "gw");
    let web = &t.backends["apps/web:80"];
    assert_eq!(
        web.settings.retry_budget,
        Some(RetryBudget {
            percent: 25,
            interval_ms: 20_000,
            min_retries: 5,
            min_interval_ms: 2_000,
        })
    );
    assert_eq!(
        web.settings.session,
        Some(Session {
            name: "shop".into(),
            carrier: SessionCarrier::Cookie,
            absolute_secs: Some(1800),
            idle_secs: None,
            permanent: false,
        })
    );
    // The BackendPolicy's own settings are still there.
    assert_eq!(web.load_balancer, LoadBalancer::ConsistentHash);
    assert!(web.settings.outlier.is_some());
    assert_eq!(
        t.backends["apps/api:8080"].settings.retry_budget,
        Some(RetryBudget {
            percent: 20,
            interval_ms: 10_000,
            min_retries: 10,
            min_interval_ms: 1_000,
        }),
        "GEP-3388's defaults"
    );
    let st = |n: &str| &out.backend_traffic_policies[&tollgate_api::ObjectKey::new("apps", n)];
    assert_cond(&st("budget").conditions, "Accepted", "True", "Accepted");
    assert_eq!(st("budget").ancestors.len(), 1);
    assert_cond(
        &st("budget").ancestors[0].conditions,
        "Accepted",
        "True",
        "Accepted",
    );
    assert_cond(&st("late").conditions, "Accepted", "False", "Conflicted");
    assert_cond(&st("too-much").conditions, "Accepted", "False", "Invalid");
    assert!(
        cond(&st("too-much").conditions, "Accepted")
            .message
            .contains("budget.percent: 101")
    );
}

/// On a TLSRoute's backend (bytes, not requests) only the balancing and TCP health checks
/// apply; the status says so.
#[test]
fn a_tlsroute_backend_takes_only_what_applies_to_a_byte_stream() {
    let extra = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: tls, namespace: infra}
spec:
  gatewayClassName: tollgate
  listeners:
  - {name: pass, port: 443, protocol: TLS, tls: {mode: Passthrough}, allowedRoutes: {namespaces: {from: All}}}
---
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TLSRoute
metadata: {name: pass, namespace: apps}
spec:
  parentRefs: [{name: tls, namespace: infra}]
  hostnames: [pass.test]
  rules: [{backendRefs: [{name: web, port: 80}]}]
"#;
    let out = run(&["backend_policy"], extra);
    let t = table(&out, "infra", "tls");
    let (key, b) = t.backends.iter().next().unwrap();
    assert!(key.ends_with("#tcp"), "{key}");
    // web's policy hashes by cookie and checks over HTTP: neither applies to bytes.
    assert_eq!(b.load_balancer, LoadBalancer::LeastRequest);
    assert!(b.settings.is_empty(), "{:?}", b.settings);
    let c = policy_conds(&out, "web");
    assert_cond(c, "Accepted", "True", "Accepted");
    assert!(
        cond(c, "Accepted")
            .message
            .contains("on TLSRoute and TCPRoute backends only")
    );
}
