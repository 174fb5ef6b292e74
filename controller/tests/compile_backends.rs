//! Backend resolution: Services, ports, EndpointSlices, ReferenceGrants.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod compile_support;

use compile_support::*;
use tollgate_api::{
    BackendKey, BackendProtocol, Endpoint, Filter, LoadBalancer, Route, RouteTable, WeightedBackend,
};

fn out() -> tollgate::compile::Output {
    run(&["backends"], "")
}

fn first_route<'a>(t: &'a RouteTable, host: &str) -> &'a Route {
    &vhost(table_listener(t, "http"), host).routes[0]
}

fn ep(ip: &str, port: u16) -> Endpoint {
    Endpoint {
        ip: ip.to_owned(),
        port,
    }
}

#[test]
fn weights_keep_an_unresolved_backend_share() {
    let out = out();
    let c = parent_conds(&out, "apps", "weights", 0);
    assert_cond(c, "Accepted", "True", "Accepted");
    assert_cond(c, "ResolvedRefs", "False", "BackendNotFound");
    let t = table(&out, "infra", "gw");
    let r = first_route(t, "weights.test");
    let expect = |backend: Option<String>, weight| WeightedBackend {
        backend,
        weight,
        filters: vec![],
    };
    assert_eq!(
        r.backends,
        vec![
            expect(Some(BackendKey::of("apps", "web", 80)), 3),
            expect(None, 1),
            expect(Some(BackendKey::of("apps", "api", 8080)), 0),
        ]
    );
}

#[test]
fn backend_not_found() {
    let out = out();
    for name in ["no-such-port", "external"] {
        let c = parent_conds(&out, "apps", name, 0);
        assert_cond(c, "ResolvedRefs", "False", "BackendNotFound");
        assert_cond(c, "Accepted", "True", "Accepted");
    }
}

#[test]
fn ref_not_permitted_backend() {
    let out = out();
    let c = parent_conds(&out, "apps", "cross-denied", 0);
    assert_cond(c, "ResolvedRefs", "False", "RefNotPermitted");
    let r = first_route(table(&out, "infra", "gw"), "denied.test");
    assert_eq!(r.backends[0].backend, None);
    // The grant in `other` names Service shared only.
    assert_route_ok(&out, "apps", "cross-granted");
    let t = table(&out, "infra", "gw");
    let key = BackendKey::of("other", "shared", 80);
    assert_eq!(
        first_route(t, "granted.test").backends[0].backend.as_ref(),
        Some(&key)
    );
    assert_eq!(t.backends[&key].endpoints, vec![ep("10.3.0.1", 80)]);
}

#[test]
fn invalid_kind() {
    let out = out();
    assert_cond(
        parent_conds(&out, "apps", "wrong-kind", 0),
        "ResolvedRefs",
        "False",
        "InvalidKind",
    );
}

#[test]
fn endpoints_ready_only_deduped_and_sorted() {
    let out = out();
    let t = table(&out, "infra", "gw");
    let web = &t.backends[&BackendKey::of("apps", "web", 80)];
    // 10.0.0.3 (serving+terminating) and 10.0.0.4 (not ready) are left out while others are ready.
    assert_eq!(
        web.endpoints,
        vec![
            ep("10.0.0.1", 8080),
            ep("10.0.0.2", 8080),
            ep("10.0.0.5", 8080)
        ]
    );
    assert_eq!(web.protocol, BackendProtocol::Http1);
    assert_eq!(web.load_balancer, LoadBalancer::LeastRequest);
}

#[test]
fn endpoints_serving_terminating_when_none_ready() {
    let out = out();
    assert_route_ok(&out, "apps", "rolling");
    let t = table(&out, "infra", "gw");
    let b = &t.backends[&BackendKey::of("apps", "rolling", 80)];
    assert_eq!(b.endpoints, vec![ep("10.2.0.1", 8000)]);
    assert_eq!(b.protocol, BackendProtocol::Http1); // kubernetes.io/ws
}

#[test]
fn named_ports_map_to_slice_ports() {
    let out = out();
    assert_route_ok(&out, "apps", "ports");
    let t = table(&out, "infra", "gw");
    let admin = &t.backends[&BackendKey::of("apps", "web", 9000)];
    // Only slice web-abc carries the admin port.
    assert_eq!(
        admin.endpoints,
        vec![ep("10.0.0.1", 9901), ep("10.0.0.2", 9901)]
    );
    // Unnamed Service port matches the unnamed slice port.
    let api = &t.backends[&BackendKey::of("apps", "api", 8080)];
    assert_eq!(api.endpoints, vec![ep("10.1.0.1", 50051)]);
    assert_eq!(api.protocol, BackendProtocol::H2c);
    assert_eq!(api.load_balancer, LoadBalancer::RoundRobin);
}

#[test]
fn table_holds_only_referenced_backends() {
    let out = out();
    let t = table(&out, "infra", "gw");
    let keys: Vec<&str> = t.backends.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        vec![
            "apps/api:8080",
            "apps/rolling:80",
            "apps/web:80",
            "apps/web:9000",
            "other/shared:80"
        ]
    );
}

#[test]
fn unresolved_mirror_is_skipped_not_rejected() {
    let out = out();
    let c = parent_conds(&out, "apps", "mirror-missing", 0);
    assert_cond(c, "Accepted", "True", "Accepted");
    assert_cond(c, "ResolvedRefs", "False", "BackendNotFound");
    let r = first_route(table(&out, "infra", "gw"), "mirror.test");
    match &r.filters[..] {
        [Filter::RequestMirror(m)] => {
            assert_eq!(m.backend, None);
            assert_eq!(m.per_million, 250_000);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn unsupported_backend_protocol() {
    let out = run(
        &["backends"],
        r"
apiVersion: v1
kind: Service
metadata: {name: grpc, namespace: apps}
spec:
  ports:
  - {port: 9000, appProtocol: example.com/custom}
  - {port: 53, protocol: UDP}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: odd-protocols, namespace: apps}
spec:
  parentRefs: [{name: gw, namespace: infra}]
  hostnames: [odd.test]
  rules:
  - backendRefs: [{name: grpc, port: 9000}, {name: grpc, port: 53}]
",
    );
    let c = parent_conds(&out, "apps", "odd-protocols", 0);
    assert_cond(c, "Accepted", "True", "Accepted");
    assert_cond(c, "ResolvedRefs", "False", "UnsupportedProtocol");
    let msg = &cond(c, "ResolvedRefs").message;
    assert!(
        msg.contains("backendRefs[0]") && msg.contains("backendRefs[1]"),
        "{msg}"
    );
    let r = first_route(table(&out, "infra", "gw"), "odd.test");
    assert!(r.backends.iter().all(|b| b.backend.is_none()));
}

/// The HTTPRoute annotation `tollgate.dev/request-trailers: forward` marks every entry of
/// the route as forwarding request trailers; without it, or with `drop`, they are dropped
/// (the default); any other value rejects the route, naming the annotation, and the route
/// is not served.
#[test]
fn request_trailers_annotation_opts_a_route_in() {
    let route = |name: &str, host: &str, annotation: &str| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\n\
             metadata: {{name: {name}, namespace: apps{annotation}}}\n\
             spec:\n  parentRefs: [{{name: gw, namespace: infra}}]\n  hostnames: [{host}]\n  \
             rules: [{{backendRefs: [{{name: web, port: 80}}]}}]\n"
        )
    };
    let extra = [
        route(
            "fwd",
            "fwd.test",
            ", annotations: {tollgate.dev/request-trailers: forward}",
        ),
        route(
            "drop",
            "drop.test",
            ", annotations: {tollgate.dev/request-trailers: drop}",
        ),
        route(
            "typo",
            "typo.test",
            ", annotations: {tollgate.dev/request-trailers: forwrd}",
        ),
        route("plain", "plain.test", ""),
        route(
            "long",
            "long.test",
            &format!(
                ", annotations: {{tollgate.dev/request-trailers: {}}}",
                "y".repeat(100_000)
            ),
        ),
    ]
    .join("---\n");
    let out = run(&["backends"], &extra);
    let t = table(&out, "infra", "gw");
    assert!(first_route(t, "fwd.test").request_trailers);
    assert!(!first_route(t, "drop.test").request_trailers);
    assert!(!first_route(t, "plain.test").request_trailers);
    for name in ["fwd", "drop", "plain"] {
        assert_route_ok(&out, "apps", name);
    }
    let c = parent_conds(&out, "apps", "typo", 0);
    assert_cond(c, "Accepted", "False", "UnsupportedValue");
    let msg = &cond(c, "Accepted").message;
    assert!(
        msg.contains("metadata.annotations[tollgate.dev/request-trailers]")
            && msg.contains("\"forwrd\""),
        "{msg}"
    );
    assert!(
        !hosts(table_listener(t, "http")).contains(&"typo.test"),
        "a rejected route is not served"
    );
    // A long value is quoted by its start only: a condition message holds at most 32 KiB.
    let c = parent_conds(&out, "apps", "long", 0);
    assert_cond(c, "Accepted", "False", "UnsupportedValue");
    let msg = &cond(c, "Accepted").message;
    assert!(
        msg.len() < 200 && msg.contains(&format!("\"{}\"...", "y".repeat(64))),
        "{msg}"
    );
}
