//! TLSRoute on TLS listeners, Passthrough, Terminate and both on one port: listener acceptance
//! and supportedKinds, certificates of terminating listeners, attachment (sectionName, kinds,
//! hostname intersection), backends (Service, ReferenceGrant, unknown kind, missing Service),
//! status parents, and the TLS ports in the table. The cases
//! follow the GATEWAY-TLS conformance tests.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod compile_support;

use compile_support::*;
use tollgate::compile::{CONTROLLER_NAME, Output};
use tollgate_api::{BackendKey, BackendProtocol, ObjectKey, Protocol, RouteTable, WeightedBackend};

fn out() -> Output {
    run(&["tlsroute"], "")
}

fn gw(out: &Output) -> &RouteTable {
    table(out, "infra", "tls")
}

#[track_caller]
fn assert_ok(out: &Output, name: &str) {
    let c = tls_parent_conds(out, "apps", name, 0);
    assert_cond(c, "Accepted", "True", "Accepted");
    assert_cond(c, "ResolvedRefs", "True", "ResolvedRefs");
}

fn kinds(out: &Output, name: &str) -> Vec<String> {
    listener(out, "infra", "tls", name)
        .supported_kinds
        .iter()
        .flatten()
        .map(|k| format!("{}/{}", k.group.as_deref().unwrap_or_default(), k.kind))
        .collect()
}

#[test]
fn passthrough_listener_is_accepted_and_serves_tlsroutes_only() {
    let out = out();
    for name in ["passthrough", "any"] {
        let l = listener(&out, "infra", "tls", name);
        assert_cond(&l.conditions, "Accepted", "True", "Accepted");
        assert_cond(&l.conditions, "Programmed", "True", "Programmed");
        assert_cond(&l.conditions, "ResolvedRefs", "True", "ResolvedRefs");
        assert_eq!(kinds(&out, name), ["gateway.networking.k8s.io/TLSRoute"]);
    }
    // simple + wide on `passthrough`; missing-backend, unknown-kind, not-granted and
    // catch-all on `any` (attachment does not depend on backends).
    assert_eq!(
        listener(&out, "infra", "tls", "passthrough").attached_routes,
        2
    );
    assert_eq!(listener(&out, "infra", "tls", "any").attached_routes, 4);
}

#[test]
fn passthrough_supported_kinds_drop_what_a_tls_listener_cannot_serve() {
    // TLSRouteListenerPassthroughSupportedKinds.
    let out = out();
    let l = listener(&out, "infra", "tls", "kinds");
    assert_eq!(kinds(&out, "kinds"), ["gateway.networking.k8s.io/TLSRoute"]);
    assert_cond(&l.conditions, "ResolvedRefs", "False", "InvalidRouteKinds");
    assert_cond(&l.conditions, "Accepted", "True", "Accepted");
    assert_eq!(l.attached_routes, 0);
}

#[test]
fn terminate_listener_needs_certificates_like_https() {
    // TLSRouteListenerTerminateSupportedKinds; an absent mode means Terminate.
    let out = out();
    let l = listener(&out, "infra", "tls", "terminate");
    assert_cond(&l.conditions, "Accepted", "True", "Accepted");
    assert_cond(&l.conditions, "Programmed", "True", "Programmed");
    assert_eq!(
        kinds(&out, "terminate"),
        ["gateway.networking.k8s.io/TLSRoute"]
    );
    let l = listener(&out, "infra", "tls", "no-mode");
    assert_cond(&l.conditions, "Accepted", "True", "Accepted");
    assert_cond(
        &l.conditions,
        "ResolvedRefs",
        "False",
        "InvalidCertificateRef",
    );
    assert_cond(&l.conditions, "Programmed", "False", "Invalid");
    assert!(
        cond(&l.conditions, "ResolvedRefs")
            .message
            .contains("TLS listener needs tls.certificateRefs")
    );
    // The Gateway is accepted: every listener is valid.
    assert_cond(
        gateway_conds(&out, "infra", "tls"),
        "Accepted",
        "True",
        "Accepted",
    );
}

#[test]
fn terminate_and_passthrough_listeners_share_a_port() {
    // TLSRouteMixedTerminationSameNamespace.
    let out = out();
    for (listener_name, route) in [
        ("terminate", "terminated"),
        ("mixed-passthrough", "mixed-passed"),
    ] {
        let l = listener(&out, "infra", "tls", listener_name);
        assert_cond(&l.conditions, "Accepted", "True", "Accepted");
        assert_cond(&l.conditions, "Conflicted", "False", "NoConflicts");
        assert_eq!(l.attached_routes, 1, "{listener_name}");
        let c = tls_parent_conds(&out, "infra", route, 0);
        assert_cond(c, "Accepted", "True", "Accepted");
        assert_cond(c, "ResolvedRefs", "True", "ResolvedRefs");
    }
    let t = gw(&out);
    let p = port(t, 9444);
    assert_eq!(p.protocol, Protocol::Tls);
    let names: Vec<(&str, bool, usize)> = p
        .listeners
        .iter()
        .map(|l| (l.name.as_str(), l.passthrough, l.certificates.len()))
        .collect();
    assert_eq!(
        names,
        [("mixed-passthrough", true, 0), ("terminate", false, 1)]
    );
    let terminated = &vhost(table_listener(t, "terminate"), "tls.test").routes[0];
    let plain = BackendKey::tcp("infra", "plain-backend", 3000);
    assert_eq!(
        terminated.backends[0].backend.as_deref(),
        Some(plain.as_str())
    );
    assert_eq!(t.backends[&plain].endpoints[0].port, 3000);
}

#[test]
fn http_listener_does_not_serve_tlsroutes() {
    let out = out();
    assert_eq!(
        kinds(&out, "http"),
        [
            "gateway.networking.k8s.io/HTTPRoute",
            "gateway.networking.k8s.io/GRPCRoute"
        ]
    );
    let c = tls_parent_conds(&out, "apps", "on-http", 0);
    assert_cond(c, "Accepted", "False", "NotAllowedByListeners");
    let c = parent_conds(&out, "apps", "http-on-tls", 0);
    assert_cond(c, "Accepted", "False", "NotAllowedByListeners");
}

#[test]
fn unknown_section_name_is_no_matching_parent() {
    let out = out();
    let c = tls_parent_conds(&out, "apps", "no-section", 0);
    assert_cond(c, "Accepted", "False", "NoMatchingParent");
}

#[test]
fn hostname_outside_the_listener_is_no_matching_listener_hostname() {
    let out = out();
    let c = tls_parent_conds(&out, "apps", "elsewhere", 0);
    assert_cond(c, "Accepted", "False", "NoMatchingListenerHostname");
}

#[test]
fn status_entry_copies_the_parent_ref_and_generation() {
    let out = out();
    assert_ok(&out, "simple");
    assert_ok(&out, "wide");
    assert_ok(&out, "catch-all");
    let st = &out.tls_routes[&ObjectKey::new("apps", "simple")];
    assert_eq!(st.parents.len(), 1);
    let p = &st.parents[0];
    assert_eq!(p.controller_name, CONTROLLER_NAME);
    assert_eq!(p.parent_ref.name, "tls");
    assert_eq!(p.parent_ref.namespace.as_deref(), Some("infra"));
    assert_eq!(p.parent_ref.section_name.as_deref(), Some("passthrough"));
    assert!(
        p.conditions
            .iter()
            .all(|c| c.observed_generation == Some(3))
    );
    assert!(
        !out.http_routes
            .contains_key(&ObjectKey::new("apps", "simple"))
    );
}

#[test]
fn unresolved_backends_have_the_standard_reasons() {
    let out = out();
    for (name, reason) in [
        ("missing-backend", "BackendNotFound"),
        ("unknown-kind", "InvalidKind"),
        ("not-granted", "RefNotPermitted"),
    ] {
        let c = tls_parent_conds(&out, "apps", name, 0);
        assert_cond(c, "Accepted", "True", "Accepted");
        assert_cond(c, "ResolvedRefs", "False", reason);
    }
}

#[test]
fn passthrough_port_maps_sni_patterns_to_weighted_backends() {
    let out = out();
    let t = gw(&out);
    let p = port(t, 443);
    assert_eq!(p.protocol, Protocol::Tls);
    let l = table_listener(t, "passthrough");
    assert!(l.passthrough);
    assert!(l.certificates.is_empty());
    // Exact before wildcard: abc.example.com goes to `simple`, the rest of *.example.com to
    // `wide` (its `*.com` narrowed to the listener's hostname).
    assert_eq!(hosts(l), ["abc.example.com", "*.example.com"]);
    assert_eq!(order(vhost(l, "abc.example.com")), ["simple#0"]);
    let wide = &vhost(l, "*.example.com").routes[0];
    assert_eq!(wide.route.name, "wide");
    let tcp2 = BackendKey::tcp("apps", "tls-backend-2", 443);
    let tcp1 = BackendKey::tcp("apps", "tls-backend", 443);
    assert_eq!(
        wide.backends,
        [
            WeightedBackend {
                backend: Some(tcp2.clone()),
                weight: 3,
                filters: Vec::new()
            },
            WeightedBackend {
                backend: Some(tcp1.clone()),
                weight: 1,
                filters: Vec::new()
            },
        ]
    );
    // TLS backends are copied as bytes whatever their appProtocol (https here).
    let b = &t.backends[&tcp1];
    assert_eq!(b.protocol, BackendProtocol::Tcp);
    assert_eq!(b.endpoints.len(), 1);
    assert_eq!(
        (b.endpoints[0].ip.as_str(), b.endpoints[0].port),
        ("10.9.0.1", 8443)
    );
}

#[test]
fn unresolved_backends_stay_in_the_table_without_a_key() {
    let out = out();
    let l = table_listener(gw(&out), "any");
    assert_eq!(
        hosts(l),
        ["missing.test", "grant.test", "kind.test", "*.wild.test"]
    );
    let missing = &vhost(l, "missing.test").routes[0];
    assert_eq!(missing.backends.len(), 1);
    assert_eq!(missing.backends[0].backend, None);
    assert_eq!(order(vhost(l, "*.wild.test")), ["catch-all#0"]);
}

#[test]
fn tls_listeners_without_certificates_are_not_in_the_table() {
    let out = out();
    let t = gw(&out);
    let ports: Vec<u16> = t.ports.iter().map(|p| p.port).collect();
    // no-mode (9445) terminates without certificates: not programmed, not served.
    assert_eq!(ports, [80, 443, 8443, 9443, 9444]);
}

const POLICIES: &str = r#"
apiVersion: tollgate.dev/v1alpha1
kind: AuthPolicy
metadata: {name: on-route, namespace: apps, generation: 1}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: TLSRoute, name: simple}]
  rules:
    authorization:
      nobody: {predicate: "false"}
---
apiVersion: tollgate.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: on-listener, namespace: infra, generation: 1}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: tls, sectionName: passthrough}]
  limits:
    tight: {rates: [{limit: 1, window: 1m}]}
---
apiVersion: tollgate.dev/v1alpha1
kind: AuthPolicy
metadata: {name: on-gateway, namespace: infra, generation: 1}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: tls}]
  rules:
    authorization:
      nobody: {predicate: "false"}
"#;

#[test]
fn policies_never_claim_tls_streams() {
    // Policies act on HTTP requests: a TLSRoute or a TLS listener as target is not found
    // (saying why), and a Gateway-wide policy leaves the TLS ports' routes without one.
    let out = run(&["tlsroute"], POLICIES);
    let route = &out.auth_policies[&ObjectKey::new("apps", "on-route")].conditions;
    assert_cond(route, "Accepted", "False", "TargetNotFound");
    assert!(
        cond(route, "Accepted")
            .message
            .contains("policies do not apply to TLSRoutes"),
        "{route:?}"
    );
    let listener = &out.rate_limit_policies[&ObjectKey::new("infra", "on-listener")].conditions;
    assert_cond(listener, "Accepted", "False", "TargetNotFound");
    let gateway = &out.auth_policies[&ObjectKey::new("infra", "on-gateway")].conditions;
    assert_cond(gateway, "Accepted", "True", "Accepted");
    let t = gw(&out);
    for p in t.ports.iter().filter(|p| p.protocol == Protocol::Tls) {
        for r in p
            .listeners
            .iter()
            .flat_map(|l| &l.virtual_hosts)
            .flat_map(|v| v.routes.iter())
        {
            assert_eq!(r.policy, None, "{} on port {}", r.route, p.port);
        }
    }
    // No TLSRoute is marked as affected by a policy.
    let simple = tls_parent_conds(&out, "apps", "simple", 0);
    assert!(
        simple.iter().all(|c| !c.type_.contains("PolicyAffected")),
        "{simple:?}"
    );
}
