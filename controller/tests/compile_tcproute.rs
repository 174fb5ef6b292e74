//! TCPRoute on TCP listeners: listener acceptance, supportedKinds and conflicts, attachment
//! (sectionName, namespaces, kinds), the oldest route carrying a listener's connections,
//! weighted backends (Service, ReferenceGrant, missing Service), status parents, policies
//! refused on TCP, and the TCP ports in the table. The cases follow the GATEWAY-TCP
//! conformance tests of Gateway API v1.6.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod compile_support;

use compile_support::*;
use tollgate::compile::{CONTROLLER_NAME, Output};
use tollgate_api::{BackendKey, BackendProtocol, ObjectKey, Protocol, WeightedBackend};

fn out() -> Output {
    run(&["tcproute"], "")
}

fn kinds(out: &Output, name: &str) -> Vec<String> {
    listener(out, "infra", "tcp", name)
        .supported_kinds
        .iter()
        .flatten()
        .map(|k| format!("{}/{}", k.group.as_deref().unwrap_or_default(), k.kind))
        .collect()
}

#[test]
fn tcp_listeners_are_accepted_and_serve_tcproutes_only() {
    let out = out();
    for name in ["tcp", "tcp-same", "kinds"] {
        let l = listener(&out, "infra", "tcp", name);
        assert_cond(&l.conditions, "Accepted", "True", "Accepted");
        assert_cond(&l.conditions, "Programmed", "True", "Programmed");
        assert_eq!(kinds(&out, name), ["gateway.networking.k8s.io/TCPRoute"]);
    }
    // HTTPRoute named in allowedRoutes.kinds of a TCP listener: dropped, said so.
    let l = listener(&out, "infra", "tcp", "kinds");
    assert_cond(&l.conditions, "ResolvedRefs", "False", "InvalidRouteKinds");
    // older, newer, not-granted on `tcp`; weighted on `tcp-same`; missing on `kinds`.
    let attached = |n| listener(&out, "infra", "tcp", n).attached_routes;
    assert_eq!(
        (attached("tcp"), attached("tcp-same"), attached("kinds")),
        (3, 1, 1)
    );
    assert_eq!(attached("http"), 0);
}

#[test]
fn tcp_listeners_on_one_port_conflict() {
    let out = out();
    for name in ["dup-a", "dup-b"] {
        let l = listener(&out, "infra", "tcp", name);
        assert_cond(&l.conditions, "Accepted", "False", "HostnameConflict");
        assert_cond(&l.conditions, "Conflicted", "True", "HostnameConflict");
        assert_cond(&l.conditions, "Programmed", "False", "HostnameConflict");
    }
    for name in ["clash-tcp", "clash-http"] {
        let l = listener(&out, "infra", "tcp", name);
        assert_cond(&l.conditions, "Accepted", "False", "ProtocolConflict");
        assert_cond(&l.conditions, "Conflicted", "True", "ProtocolConflict");
    }
    let t = table(&out, "infra", "tcp");
    assert!(
        t.ports.iter().all(|p| p.port != 9003 && p.port != 9004),
        "conflicted ports are not served: {:?}",
        t.ports.iter().map(|p| p.port).collect::<Vec<_>>()
    );
}

#[test]
fn every_route_on_a_listener_is_accepted_and_the_oldest_carries_its_connections() {
    // TCPRouteMultipleRoutesAttachment.
    let out = out();
    for name in ["older", "newer"] {
        let c = tcp_parent_conds(&out, "apps", name, 0);
        assert_cond(c, "Accepted", "True", "Accepted");
    }
    assert_cond(
        tcp_parent_conds(&out, "apps", "older", 0),
        "ResolvedRefs",
        "True",
        "ResolvedRefs",
    );
    let t = table(&out, "infra", "tcp");
    let p = port(t, 9000);
    assert_eq!(p.protocol, Protocol::Tcp);
    assert_eq!(p.listeners.len(), 1);
    let l = &p.listeners[0];
    assert_eq!(l.hostname, None);
    assert!(!l.passthrough);
    assert_eq!(hosts(l), ["*"]);
    // The stream path takes the first route of the port: the oldest.
    let routes = order(vhost(l, "*"));
    assert_eq!(
        routes.first().map(String::as_str),
        Some("older#0"),
        "{routes:?}"
    );
    assert!(routes.contains(&"newer#0".to_owned()), "{routes:?}");
}

#[test]
fn weighted_backends_are_copied_as_bytes() {
    // TCPRouteWeightedRouting.
    let out = out();
    let c = tcp_parent_conds(&out, "infra", "weighted", 0);
    assert_cond(c, "Accepted", "True", "Accepted");
    assert_cond(c, "ResolvedRefs", "True", "ResolvedRefs");
    let t = table(&out, "infra", "tcp");
    let l = table_listener(t, "tcp-same");
    let route = &vhost(l, "*").routes[0];
    let db = BackendKey::tcp("infra", "db", 5432);
    let replica = BackendKey::tcp("infra", "db-replica", 5432);
    assert_eq!(
        route.backends,
        [
            WeightedBackend {
                backend: Some(db.clone()),
                weight: 3,
                filters: Vec::new()
            },
            WeightedBackend {
                backend: Some(replica.clone()),
                weight: 1,
                filters: Vec::new()
            },
        ]
    );
    // Bytes are copied whatever the port's appProtocol (postgresql here).
    let b = &t.backends[&db];
    assert_eq!(b.protocol, BackendProtocol::Tcp);
    assert_eq!(
        b.endpoints
            .iter()
            .map(|e| (e.ip.as_str(), e.port))
            .collect::<Vec<_>>(),
        [("10.1.0.1", 15432)]
    );
    assert_eq!(route.policy, None);
}

#[test]
fn routes_a_listener_does_not_allow_are_not_accepted() {
    // TCPRouteInvalidNonTCPListener, and a namespace the listener does not allow.
    let out = out();
    let c = tcp_parent_conds(&out, "apps", "on-http", 0);
    assert_cond(c, "Accepted", "False", "NotAllowedByListeners");
    assert!(
        cond(c, "Accepted")
            .message
            .contains("no matching listener takes TCPRoutes"),
        "{c:?}"
    );
    let c = tcp_parent_conds(&out, "apps", "not-allowed", 0);
    assert_cond(c, "Accepted", "False", "NotAllowedByListeners");
    assert!(
        cond(c, "Accepted")
            .message
            .contains("no listener allows TCPRoutes from namespace apps"),
        "{c:?}"
    );
    let st = &out.tcp_routes[&ObjectKey::new("apps", "on-http")];
    assert_eq!(st.parents[0].controller_name, CONTROLLER_NAME);
    assert_eq!(
        st.parents[0].parent_ref.section_name.as_deref(),
        Some("http")
    );
}

#[test]
fn unresolved_backends_are_said_and_their_connections_refused() {
    // TCPRouteInvalidBackendRefNonexistent, TCPRouteInvalidCrossNamespaceBackendRef.
    let out = out();
    let c = tcp_parent_conds(&out, "infra", "missing", 0);
    assert_cond(c, "Accepted", "True", "Accepted");
    assert_cond(c, "ResolvedRefs", "False", "BackendNotFound");
    let c = tcp_parent_conds(&out, "apps", "not-granted", 0);
    assert_cond(c, "Accepted", "True", "Accepted");
    assert_cond(c, "ResolvedRefs", "False", "RefNotPermitted");
    // The route stays in the table with no backend: the proxy closes its connections.
    let t = table(&out, "infra", "tcp");
    let l = table_listener(t, "kinds");
    let route = &vhost(l, "*").routes[0];
    assert_eq!(route.backends.len(), 1);
    assert_eq!(route.backends[0].backend, None);
}

#[test]
fn a_grant_for_tcproutes_permits_the_cross_namespace_backend() {
    // TCPRouteReferenceGrant.
    let grant = r#"
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: tcp-to-shared, namespace: other}
spec:
  from: [{group: gateway.networking.k8s.io, kind: TCPRoute, namespace: apps}]
  to: [{group: "", kind: Service, name: shared}]
"#;
    let out = run(&["tcproute"], grant);
    let c = tcp_parent_conds(&out, "apps", "not-granted", 0);
    assert_cond(c, "ResolvedRefs", "True", "ResolvedRefs");
}

#[test]
fn policies_never_claim_tcp_streams() {
    let policies = r#"
apiVersion: tollgate.dev/v1alpha1
kind: AuthPolicy
metadata: {name: on-route, namespace: apps, generation: 1}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: TCPRoute, name: older}]
  rules:
    authorization:
      nobody: {predicate: "false"}
---
apiVersion: tollgate.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: on-listener, namespace: infra, generation: 1}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: tcp, sectionName: tcp}]
  limits:
    tight: {rates: [{limit: 1, window: 1m}]}
---
apiVersion: tollgate.dev/v1alpha1
kind: AuthPolicy
metadata: {name: on-gateway, namespace: infra, generation: 1}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: tcp}]
  rules:
    authorization:
      nobody: {predicate: "false"}
"#;
    let out = run(&["tcproute"], policies);
    let route = &out.auth_policies[&ObjectKey::new("apps", "on-route")].conditions;
    assert_cond(route, "Accepted", "False", "TargetNotFound");
    assert!(
        cond(route, "Accepted")
            .message
            .contains("policies do not apply to TCPRoutes"),
        "{route:?}"
    );
    let listener = &out.rate_limit_policies[&ObjectKey::new("infra", "on-listener")].conditions;
    assert_cond(listener, "Accepted", "False", "TargetNotFound");
    // Gateway-wide: accepted for the HTTP listener, and the status says which listeners it
    // does not reach.
    let gateway = &out.auth_policies[&ObjectKey::new("infra", "on-gateway")].conditions;
    assert_cond(gateway, "Accepted", "True", "Accepted");
    let message = &cond(gateway, "Accepted").message;
    assert!(
        message.contains("not enforced on the stream listeners of Gateway infra/tcp (tcp (TCP), tcp-same (TCP), kinds (TCP))"),
        "{message}"
    );
    let t = table(&out, "infra", "tcp");
    for p in t.ports.iter().filter(|p| p.protocol == Protocol::Tcp) {
        for r in p
            .listeners
            .iter()
            .flat_map(|l| &l.virtual_hosts)
            .flat_map(|v| v.routes.iter())
        {
            assert_eq!(r.policy, None, "{} on port {}", r.route, p.port);
        }
    }
}
