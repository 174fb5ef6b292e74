//! ClientPolicy: attachment, per-port settings, field merge, conflicts, fail closed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod compile_support;

use compile_support::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use tollgate::compile::{Output, compile};
use tollgate_api::ObjectKey;
use tollgate_api::client::{ClientSettings, EscapedSlashes, ForwardedFor, ProxyProtocol};

/// A Gateway with `web` (80), `alt` (80, a hostname) and `secure` (8443) listeners.
const GATEWAY: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: infra, generation: 1}
spec:
  gatewayClassName: tollgate
  listeners:
  - {name: web, protocol: HTTP, port: 80}
  - {name: alt, protocol: HTTP, port: 80, hostname: alt.example.com}
  - {name: secure, protocol: HTTP, port: 8443}
"#;

fn policy(name: &str, created: &str, target: &str, body: &str) -> String {
    format!(
        "---\napiVersion: tollgate.dev/v1alpha1\nkind: ClientPolicy\nmetadata: {{name: {name}, \
         namespace: infra, generation: 3, creationTimestamp: \"{created}\"}}\nspec:\n  \
         targetRefs: [{target}]\n{body}\n"
    )
}

const GW: &str = "{group: gateway.networking.k8s.io, kind: Gateway, name: edge}";

fn listener_ref(section: &str) -> String {
    format!(
        "{{group: gateway.networking.k8s.io, kind: Gateway, name: edge, sectionName: {section}}}"
    )
}

fn compiled(policies: &[String]) -> Output {
    run(&[], &format!("{GATEWAY}{}", policies.concat()))
}

fn conds<'a>(out: &'a Output, name: &str) -> &'a [Condition] {
    &out.client_policies[&ObjectKey::new("infra", name)].conditions
}

fn settings(out: &Output, p: u16) -> &ClientSettings {
    &port(table(out, "infra", "edge"), p).client
}

#[test]
fn a_gateway_policy_sets_every_port_and_reports_enforced() {
    let out = compiled(&[policy(
        "lb",
        "2026-01-01T00:00:00Z",
        GW,
        "  clientIP:\n    xForwardedFor: {numTrustedHops: 2}\n  path: {mergeSlashes: false, escapedSlashes: Reject}",
    )]);
    let c = conds(&out, "lb");
    assert_cond(c, "Accepted", "True", "Accepted");
    assert_cond(c, "Enforced", "True", "Enforced");
    assert_eq!(cond(c, "Accepted").observed_generation, Some(3));
    for p in [80, 8443] {
        let s = settings(&out, p);
        assert_eq!(
            s.forwarded_for,
            Some(ForwardedFor::NumTrustedHops(2)),
            "{p}"
        );
        assert!(!s.path.merge_slashes);
        assert_eq!(s.path.escaped_slashes, EscapedSlashes::Reject);
        assert_eq!(s.proxy_protocol, None);
        assert!(s.closed_by.is_empty());
    }
    let st = &out.client_policies[&ObjectKey::new("infra", "lb")];
    assert_eq!(st.ancestors.len(), 1);
    assert_eq!(st.ancestors[0].ancestor_ref.name, "edge");
    assert_cond(
        gateway_conds(&out, "infra", "edge"),
        "tollgate.dev/ClientPolicyAffected",
        "True",
        "Accepted",
    );
}

#[test]
fn a_listener_policy_completes_the_gateway_policy_field_by_field() {
    let out = compiled(&[
        policy(
            "lb",
            "2026-01-01T00:00:00Z",
            GW,
            "  clientIP:\n    xForwardedFor: {trustedCIDRs: [10.0.0.0/8]}",
        ),
        policy(
            "pp",
            "2026-01-02T00:00:00Z",
            &listener_ref("secure"),
            "  clientIP:\n    proxyProtocol: {}",
        ),
    ]);
    assert_cond(conds(&out, "pp"), "Accepted", "True", "Accepted");
    let secure = settings(&out, 8443);
    assert_eq!(
        secure.proxy_protocol,
        Some(ProxyProtocol {
            required: true,
            trusted_cidrs: vec![]
        })
    );
    assert_eq!(
        secure.forwarded_for,
        Some(ForwardedFor::TrustedCidrs(vec!["10.0.0.0/8".into()])),
        "the Gateway's field stays where the listener's policy has none"
    );
    let web = settings(&out, 80);
    assert_eq!(web.proxy_protocol, None);
    assert!(web.forwarded_for.is_some());
}

#[test]
fn a_listener_policy_that_would_split_a_shared_port_is_conflicted() {
    let out = compiled(&[policy(
        "web-only",
        "2026-01-01T00:00:00Z",
        &listener_ref("web"),
        "  clientIP:\n    proxyProtocol: {required: true}",
    )]);
    let c = conds(&out, "web-only");
    assert_cond(c, "Accepted", "False", "Conflicted");
    let m = &cond(c, "Accepted").message;
    assert!(m.contains("port 80") && m.contains("web, alt"), "{m}");
    assert!(settings(&out, 80).is_default(), "port 80 keeps one meaning");
}

#[test]
fn the_same_settings_on_every_listener_of_a_port_are_accepted() {
    let body = "  clientIP:\n    proxyProtocol: {required: false}";
    let out = compiled(&[
        policy("a", "2026-01-01T00:00:00Z", &listener_ref("web"), body),
        policy("b", "2026-01-02T00:00:00Z", &listener_ref("alt"), body),
    ]);
    assert_cond(conds(&out, "a"), "Accepted", "True", "Accepted");
    assert_cond(conds(&out, "b"), "Accepted", "True", "Accepted");
    assert_eq!(
        settings(&out, 80).proxy_protocol,
        Some(ProxyProtocol {
            required: false,
            trusted_cidrs: vec![]
        })
    );
    assert!(settings(&out, 8443).is_default());
}

#[test]
fn the_older_of_two_policies_on_one_target_holds_it() {
    let out = compiled(&[
        policy(
            "newer",
            "2026-02-01T00:00:00Z",
            GW,
            "  clientIP:\n    xForwardedFor: {numTrustedHops: 3}",
        ),
        policy(
            "older",
            "2026-01-01T00:00:00Z",
            GW,
            "  clientIP:\n    xForwardedFor: {numTrustedHops: 1}",
        ),
    ]);
    assert_cond(conds(&out, "older"), "Accepted", "True", "Accepted");
    assert_cond(conds(&out, "newer"), "Accepted", "False", "Conflicted");
    assert_eq!(
        settings(&out, 80).forwarded_for,
        Some(ForwardedFor::NumTrustedHops(1))
    );
}

#[test]
fn targets_that_are_missing_or_not_gateways_are_reported() {
    let out = compiled(&[
        policy(
            "nowhere",
            "2026-01-01T00:00:00Z",
            "{group: gateway.networking.k8s.io, kind: Gateway, name: nope}",
            "  path: {mergeSlashes: false}",
        ),
        policy(
            "no-listener",
            "2026-01-01T00:00:00Z",
            &listener_ref("nope"),
            "  path: {mergeSlashes: false}",
        ),
    ]);
    assert_cond(
        conds(&out, "nowhere"),
        "Accepted",
        "False",
        "TargetNotFound",
    );
    assert_cond(
        conds(&out, "no-listener"),
        "Accepted",
        "False",
        "TargetNotFound",
    );
    assert!(settings(&out, 80).is_default());
}

#[test]
fn a_policy_never_valid_closes_the_ports_it_targets() {
    for (name, body) in [
        (
            "both",
            "  clientIP:\n    xForwardedFor: {numTrustedHops: 1, trustedCIDRs: [10.0.0.0/8]}",
        ),
        ("neither", "  clientIP:\n    xForwardedFor: {}"),
        (
            "bad-cidr",
            "  clientIP:\n    xForwardedFor: {trustedCIDRs: [10.0.0.0/33]}",
        ),
        (
            "zero-hops",
            "  clientIP:\n    xForwardedFor: {numTrustedHops: 0}",
        ),
    ] {
        let out = compiled(&[policy(name, "2026-01-01T00:00:00Z", GW, body)]);
        let c = conds(&out, name);
        assert_cond(c, "Accepted", "False", "Invalid");
        assert_cond(c, "Stalled", "True", "Invalid");
        let m = &cond(c, "Accepted").message;
        assert!(
            m.contains("the listeners it targets answer 500 until it is fixed"),
            "{name}: {m}"
        );
        for p in [80, 8443] {
            assert_eq!(
                settings(&out, p).closed_by,
                vec![ObjectKey::new("infra", name)],
                "{name}: port {p}"
            );
        }
    }
}

#[test]
fn on_an_httproute_only_the_body_limit_applies() {
    let out = compiled(&[policy(
        "route",
        "2026-01-01T00:00:00Z",
        "{group: gateway.networking.k8s.io, kind: HTTPRoute, name: r}",
        "  path: {mergeSlashes: false}",
    )]);
    let c = conds(&out, "route");
    assert_cond(c, "Accepted", "False", "Invalid");
    assert!(
        cond(c, "Accepted")
            .message
            .contains("on an HTTPRoute only limits.maxRequestBodyBytes and compression"),
        "{}",
        cond(c, "Accepted").message
    );
    let other = compiled(&[policy(
        "grpc",
        "2026-01-01T00:00:00Z",
        "{group: gateway.networking.k8s.io, kind: GRPCRoute, name: r}",
        "  limits: {maxRequestBodyBytes: 5}",
    )]);
    assert_cond(conds(&other, "grpc"), "Accepted", "False", "Invalid");
}

/// An HTTPRoute `r` on `edge` with a rule `upload` (/upload) and an unnamed one (/).
const ROUTE: &str = r#"
---
apiVersion: v1
kind: Service
metadata: {name: echo, namespace: infra}
spec: {ports: [{port: 80}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: infra}
spec:
  parentRefs: [{name: edge}]
  rules:
  - name: upload
    matches: [{path: {type: PathPrefix, value: /upload}}]
    backendRefs: [{name: echo, port: 80}]
  - backendRefs: [{name: echo, port: 80}]
"#;

fn body_limits(out: &Output) -> Vec<(String, Option<u64>)> {
    let mut v: Vec<(String, Option<u64>)> = table(out, "infra", "edge")
        .ports
        .iter()
        .flat_map(|p| &p.listeners)
        .flat_map(|l| &l.virtual_hosts)
        .flat_map(|h| h.routes.iter())
        .map(|r| {
            (
                format!("{}#{}", r.route.name, r.rule_index),
                r.max_request_body_bytes,
            )
        })
        .collect();
    v.sort();
    v.dedup();
    v
}

#[test]
fn a_body_limit_on_an_httproute_or_one_rule_reaches_its_routes() {
    let route = "{group: gateway.networking.k8s.io, kind: HTTPRoute, name: r}";
    let rule = "{group: gateway.networking.k8s.io, kind: HTTPRoute, name: r, sectionName: upload}";
    let out = run(
        &[],
        &format!(
            "{GATEWAY}{ROUTE}{}{}",
            policy(
                "whole",
                "2026-01-01T00:00:00Z",
                route,
                "  limits: {maxRequestBodyBytes: 1000}"
            ),
            policy(
                "uploads",
                "2026-01-02T00:00:00Z",
                rule,
                "  limits: {maxRequestBodyBytes: 50000000}"
            ),
        ),
    );
    assert_cond(conds(&out, "whole"), "Accepted", "True", "Accepted");
    assert_cond(conds(&out, "whole"), "Enforced", "True", "Enforced");
    assert_cond(conds(&out, "uploads"), "Accepted", "True", "Accepted");
    assert_eq!(
        body_limits(&out),
        vec![("r#0".into(), Some(50_000_000)), ("r#1".into(), Some(1000))],
        "the rule's limit wins over the route's"
    );
    let st = &out.client_policies[&ObjectKey::new("infra", "uploads")];
    assert_eq!(st.ancestors[0].ancestor_ref.name, "edge");
    assert!(settings(&out, 80).is_default(), "ports are untouched");
    assert_cond(
        &out.http_routes[&ObjectKey::new("infra", "r")].parents[0].conditions,
        "tollgate.dev/ClientPolicyAffected",
        "True",
        "Accepted",
    );
}

#[test]
fn a_route_policy_never_valid_sets_nothing_and_closes_nothing() {
    let route = "{group: gateway.networking.k8s.io, kind: HTTPRoute, name: r}";
    let out = run(
        &[],
        &format!(
            "{GATEWAY}{ROUTE}{}",
            policy(
                "broken",
                "2026-01-01T00:00:00Z",
                route,
                "  limits: {maxRequestBodyBytes: 1000, idleTimeout: 5s}"
            ),
        ),
    );
    let c = conds(&out, "broken");
    assert_cond(c, "Accepted", "False", "Invalid");
    assert!(cond(c, "Accepted").message.contains("enforces nothing"));
    assert_eq!(
        body_limits(&out),
        vec![("r#0".into(), None), ("r#1".into(), None)]
    );
    assert!(settings(&out, 80).closed_by.is_empty());
}

#[test]
fn an_invalid_policy_keeps_its_last_valid_version() {
    let valid = policy(
        "lb",
        "2026-01-01T00:00:00Z",
        GW,
        "  clientIP:\n    xForwardedFor: {numTrustedHops: 1}",
    );
    let first = compiled(&[valid]);
    assert_eq!(first.last_valid.client_policies.len(), 1);
    let broken = policy(
        "lb",
        "2026-01-01T00:00:00Z",
        GW,
        "  clientIP:\n    xForwardedFor: {numTrustedHops: 1, trustedCIDRs: [10.0.0.0/8]}",
    );
    let mut inputs = inputs(&[], &format!("{GATEWAY}{broken}"));
    inputs.last_valid = first.last_valid.clone();
    let out = compile(&inputs);
    let c = conds(&out, "lb");
    assert_cond(c, "Accepted", "False", "Invalid");
    assert!(cond(c, "Accepted").message.contains("last valid version"));
    assert_cond(c, "Enforced", "True", "Enforced");
    let s = settings(&out, 80);
    assert_eq!(s.forwarded_for, Some(ForwardedFor::NumTrustedHops(1)));
    assert!(s.closed_by.is_empty());
}

#[test]
fn a_policy_on_another_controllers_gateway_gets_no_status() {
    let other = r#"
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: theirs, namespace: infra}
spec:
  gatewayClassName: someone-else
  listeners: [{name: web, protocol: HTTP, port: 80}]
"#;
    let p = policy(
        "foreign",
        "2026-01-01T00:00:00Z",
        "{group: gateway.networking.k8s.io, kind: Gateway, name: theirs}",
        "  path: {mergeSlashes: false}",
    );
    let out = run(&[], &format!("{GATEWAY}{other}{p}"));
    assert!(
        !out.client_policies
            .contains_key(&ObjectKey::new("infra", "foreign"))
    );
}

#[test]
fn without_a_policy_ports_carry_no_client_settings() {
    let out = compiled(&[]);
    assert!(settings(&out, 80).is_default());
    assert!(out.client_policies.is_empty());
}

#[test]
fn limits_merge_field_by_field_listener_over_gateway() {
    let out = compiled(&[
        policy(
            "gw",
            "2026-01-01T00:00:00Z",
            GW,
            "  limits: {maxRequestHeadersBytes: 8192, idleTimeout: 20s, maxConnectionsPerClient: 50}",
        ),
        policy(
            "secure",
            "2026-01-02T00:00:00Z",
            &listener_ref("secure"),
            "  limits: {maxRequestHeaders: 40, idleTimeout: 1m, requestHeaderTimeout: 5s, requestBodyTimeout: 90s, maxRequestBodyBytes: 1024}",
        ),
    ]);
    assert_cond(conds(&out, "secure"), "Accepted", "True", "Accepted");
    let l = settings(&out, 8443).limits;
    assert_eq!(l.max_request_headers_bytes, Some(8192), "from the Gateway");
    assert_eq!(l.max_connections_per_client, Some(50), "from the Gateway");
    assert_eq!(l.max_request_headers, Some(40));
    assert_eq!(l.idle_timeout_ms, Some(60_000), "the listener's wins");
    assert_eq!(l.request_header_timeout_ms, Some(5_000));
    assert_eq!(l.request_body_timeout_ms, Some(90_000));
    assert_eq!(l.max_request_body_bytes, Some(1024));
    let web = settings(&out, 80).limits;
    assert_eq!(web.idle_timeout_ms, Some(20_000));
    assert_eq!(web.max_request_headers, None);
}

#[test]
fn limits_out_of_range_or_unparsable_are_invalid() {
    for (name, body, says) in [
        (
            "small-head",
            "  limits: {maxRequestHeadersBytes: 100}",
            "maxRequestHeadersBytes must be 1024 to 1048576",
        ),
        (
            "many-fields",
            "  limits: {maxRequestHeaders: 101}",
            "maxRequestHeaders must be 1 to 100",
        ),
        (
            "no-conns",
            "  limits: {maxConnectionsPerClient: 0}",
            "maxConnectionsPerClient must be 1",
        ),
        (
            "zero-idle",
            "  limits: {idleTimeout: 0s}",
            "idleTimeout must be more than 0s",
        ),
        (
            "bad-duration",
            "  limits: {requestHeaderTimeout: soon}",
            "requestHeaderTimeout: \"soon\"",
        ),
    ] {
        let out = compiled(&[policy(name, "2026-01-01T00:00:00Z", GW, body)]);
        let c = conds(&out, name);
        assert_cond(c, "Accepted", "False", "Invalid");
        let m = &cond(c, "Accepted").message;
        assert!(m.contains(says), "{name}: {m}");
    }
}

#[test]
fn a_never_valid_listener_policy_closes_its_port_even_when_another_splits_it() {
    // `web` and `alt` share port 80: a valid policy on `alt` splits the port (Conflicted)
    // while one on `web` was never valid. The port must not fall back to serving open.
    let out = compiled(&[
        policy(
            "broken",
            "2026-01-01T00:00:00Z",
            &listener_ref("web"),
            "  clientIP:\n    xForwardedFor: {trustedCIDRs: [10.0.0.0/33]}",
        ),
        policy(
            "alt-only",
            "2026-01-02T00:00:00Z",
            &listener_ref("alt"),
            "  clientIP:\n    xForwardedFor: {numTrustedHops: 1}",
        ),
    ]);
    assert_cond(conds(&out, "alt-only"), "Accepted", "False", "Conflicted");
    assert_eq!(
        settings(&out, 80).closed_by,
        vec![ObjectKey::new("infra", "broken")]
    );
}

#[test]
fn trusting_every_address_is_refused() {
    for (name, body) in [
        (
            "xff-all",
            "  clientIP:\n    xForwardedFor: {trustedCIDRs: [10.0.0.0/8, 0.0.0.0/0]}",
        ),
        (
            "xff-all6",
            "  clientIP:\n    xForwardedFor: {trustedCIDRs: [\"::/0\"]}",
        ),
        (
            "pp-all",
            "  clientIP:\n    proxyProtocol: {trustedCIDRs: [0.0.0.0/0]}",
        ),
    ] {
        let out = compiled(&[policy(name, "2026-01-01T00:00:00Z", GW, body)]);
        let c = conds(&out, name);
        assert_cond(c, "Accepted", "False", "Invalid");
        assert!(
            cond(c, "Accepted").message.contains("trusts every address"),
            "{name}"
        );
    }
    let out = compiled(&[policy(
        "pp",
        "2026-01-01T00:00:00Z",
        GW,
        "  clientIP:\n    proxyProtocol: {trustedCIDRs: [10.0.0.0/8]}",
    )]);
    assert_eq!(
        settings(&out, 80).proxy_protocol,
        Some(ProxyProtocol {
            required: true,
            trusted_cidrs: vec!["10.0.0.0/8".into()]
        })
    );
}
