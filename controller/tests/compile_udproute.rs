//! UDPRoute on UDP listeners: listener acceptance and supportedKinds, attachment (sectionName,
//! port, kinds), the oldest route carrying a listener's datagrams, weighted backends keyed
//! as UDP, unresolved backends, policies refused on UDP, and TCP and UDP on one port. The
//! cases follow the GATEWAY-UDP conformance tests of Gateway API v1.6.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod compile_support;

use compile_support::*;
use tollgate::compile::Output;
use tollgate_api::{BackendKey, BackendProtocol, ObjectKey, Protocol, WeightedBackend};

fn out() -> Output {
    run(&["udproute"], "")
}

#[test]
fn udp_listeners_serve_udproutes_and_the_oldest_carries_the_datagrams() {
    let out = out();
    let l = listener(&out, "infra", "udp", "dns");
    assert_cond(&l.conditions, "Accepted", "True", "Accepted");
    assert_cond(&l.conditions, "Programmed", "True", "Programmed");
    let kinds: Vec<&str> = l
        .supported_kinds
        .iter()
        .flatten()
        .map(|k| k.kind.as_str())
        .collect();
    assert_eq!(kinds, ["UDPRoute"]);
    // older (by sectionName) and newer (by port) both attach.
    assert_eq!(l.attached_routes, 2);
    for name in ["older", "newer"] {
        assert_cond(
            udp_parent_conds(&out, "apps", name, 0),
            "Accepted",
            "True",
            "Accepted",
        );
    }
    let t = table(&out, "infra", "udp");
    let p = port(t, 5300);
    assert_eq!(p.protocol, Protocol::Udp);
    let routes = order(vhost(&p.listeners[0], "*"));
    assert_eq!(routes, ["older#0", "newer#0"]);
}

#[test]
fn weighted_backends_are_udp_backends() {
    let out = out();
    assert_cond(
        udp_parent_conds(&out, "apps", "older", 0),
        "ResolvedRefs",
        "True",
        "ResolvedRefs",
    );
    let t = table(&out, "infra", "udp");
    let route = &vhost(table_listener(t, "dns"), "*").routes[0];
    let (a, b) = (
        BackendKey::udp("apps", "dns", 53),
        BackendKey::udp("apps", "dns-2", 53),
    );
    assert_eq!(
        route.backends,
        [
            WeightedBackend {
                backend: Some(a.clone()),
                weight: 3,
                filters: Vec::new()
            },
            WeightedBackend {
                backend: Some(b),
                weight: 1,
                filters: Vec::new()
            },
        ]
    );
    let backend = &t.backends[&a];
    assert_eq!(backend.protocol, BackendProtocol::Udp);
    assert_eq!(
        backend
            .endpoints
            .iter()
            .map(|e| (e.ip.as_str(), e.port))
            .collect::<Vec<_>>(),
        [("10.2.0.1", 5353)]
    );
}

#[test]
fn a_missing_backend_and_a_listener_without_udp_are_said() {
    // UDPRouteInvalidBackendRefNonexistent, UDPRouteNotAllowedByListeners.
    let out = out();
    assert_cond(
        udp_parent_conds(&out, "apps", "newer", 0),
        "ResolvedRefs",
        "False",
        "BackendNotFound",
    );
    let c = udp_parent_conds(&out, "apps", "on-tls", 0);
    assert_cond(c, "Accepted", "False", "NotAllowedByListeners");
    assert!(
        cond(c, "Accepted")
            .message
            .contains("no matching listener takes UDPRoutes"),
        "{c:?}"
    );
}

#[test]
fn tcp_and_udp_on_one_port_conflict() {
    let out = out();
    for name in ["mixed-udp", "mixed-tcp"] {
        let l = listener(&out, "infra", "udp", name);
        assert_cond(&l.conditions, "Accepted", "False", "ProtocolConflict");
        assert_cond(&l.conditions, "Conflicted", "True", "ProtocolConflict");
    }
}

#[test]
fn policies_never_claim_udp_datagrams() {
    let policies = r#"
apiVersion: tollgate.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: on-route, namespace: apps, generation: 1}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: UDPRoute, name: older}]
  limits:
    tight: {rates: [{limit: 1, window: 1m}]}
---
apiVersion: tollgate.dev/v1alpha1
kind: BackendPolicy
metadata: {name: dns, namespace: apps, generation: 1}
spec:
  targetRefs: [{group: "", kind: Service, name: dns}]
  loadBalancer: {type: RoundRobin}
  healthCheck:
    interval: 1s
    tcp: {}
"#;
    let out = run(&["udproute"], policies);
    let route = &out.rate_limit_policies[&ObjectKey::new("apps", "on-route")].conditions;
    assert_cond(route, "Accepted", "False", "TargetNotFound");
    assert!(
        cond(route, "Accepted")
            .message
            .contains("policies do not apply to UDPRoutes"),
        "{route:?}"
    );
    // On a UDP backend only the balancing applies: no probe is made of it.
    let bp = &out.backend_policies[&ObjectKey::new("apps", "dns")].conditions;
    assert_cond(bp, "Accepted", "True", "Accepted");
    assert!(
        cond(bp, "Accepted")
            .message
            .contains("on UDPRoute backends only loadBalancer"),
        "{bp:?}"
    );
    let t = table(&out, "infra", "udp");
    let b = &t.backends[&BackendKey::udp("apps", "dns", 53)];
    assert_eq!(b.settings.health_check, None);
}

#[test]
fn a_client_policy_does_not_take_a_udp_listener() {
    // Connection limits and the PROXY protocol have nothing to act on in datagrams: the
    // policy names no listener it can apply to, and says so.
    let policy = r#"
apiVersion: tollgate.dev/v1alpha1
kind: ClientPolicy
metadata: {name: on-udp, namespace: infra, generation: 1}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: udp, sectionName: dns}]
  limits:
    maxConnectionsPerClient: 10
"#;
    let out = run(&["udproute"], policy);
    let c = &out.client_policies[&ObjectKey::new("infra", "on-udp")].conditions;
    assert_cond(c, "Accepted", "False", "TargetNotFound");
    let t = table(&out, "infra", "udp");
    assert_eq!(port(t, 5300).client, Default::default());
}
