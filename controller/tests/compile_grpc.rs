//! GRPCRoute: method and header matches, attachment (kinds, hostnames), backends over h2c,
//! ReferenceGrants, precedence, and cross serving with HTTPRoutes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod compile_support;

use compile_support::*;
use tollgate::compile::{CONTROLLER_NAME, Output, RouteKind};
use tollgate_api::{
    BackendKey, BackendProtocol, Filter, HeaderMatch, HeaderModifier, Mirror, PathMatch, Route,
    RouteTable, StringMatch, VirtualHost, WeightedBackend,
};

fn out() -> Output {
    run(&["grpc"], "")
}

fn gw(out: &Output) -> &RouteTable {
    table(out, "infra", "grpc")
}

fn host<'a>(out: &'a Output, listener: &str, host: &str) -> &'a VirtualHost {
    vhost(table_listener(gw(out), listener), host)
}

/// The route entry of rule `rule` in a vhost of listener `http`.
fn rule<'a>(out: &'a Output, hostname: &str, rule: u32) -> &'a Route {
    host(out, "http", hostname)
        .routes
        .iter()
        .find(|r| r.rule_index == rule)
        .unwrap_or_else(|| panic!("no rule {rule} in {hostname}"))
}

#[track_caller]
fn assert_ok(out: &Output, name: &str) {
    let c = grpc_parent_conds(out, "apps", name, 0);
    assert_cond(c, "Accepted", "True", "Accepted");
    assert_cond(c, "ResolvedRefs", "True", "ResolvedRefs");
}

#[test]
fn status_entry_copies_the_parent_ref_and_generation() {
    let out = out();
    let st = &out.grpc_routes[&tollgate_api::ObjectKey::new("apps", "methods")];
    assert_eq!(st.parents.len(), 1);
    let p = &st.parents[0];
    assert_eq!(p.controller_name, CONTROLLER_NAME);
    assert_eq!(p.parent_ref.name, "grpc");
    assert_eq!(p.parent_ref.namespace.as_deref(), Some("infra"));
    assert_eq!(p.parent_ref.section_name.as_deref(), Some("http"));
    assert!(
        p.conditions
            .iter()
            .all(|c| c.observed_generation == Some(4))
    );
    assert_ok(&out, "methods");
    assert!(
        !out.http_routes
            .contains_key(&tollgate_api::ObjectKey::new("apps", "methods"))
    );
}

#[test]
fn method_exact_is_an_exact_path() {
    let out = out();
    let r = rule(&out, "methods.test", 0);
    assert_eq!(r.rule_name.as_deref(), Some("exact"));
    assert_eq!(r.matcher.path, PathMatch::Exact("/pkg.Svc/Get".into()));
    // gRPC is always POST, but the spec matches on service, method and headers only.
    assert_eq!(r.matcher.method, None);
}

#[test]
fn method_service_only_is_a_segment_prefix() {
    let out = out();
    let r = rule(&out, "methods.test", 1);
    // Segment-wise: matches /pkg.Svc/Anything, never /pkg.SvcX/Anything.
    assert_eq!(r.matcher.path, PathMatch::PathPrefix("/pkg.Svc".into()));
}

#[test]
fn method_only_is_a_regex_over_any_service() {
    let out = out();
    let r = rule(&out, "methods.test", 2);
    assert_eq!(
        r.matcher.path,
        PathMatch::RegularExpression("/[^/]+/Health".into())
    );
}

#[test]
fn method_regular_expression_anchors_each_part() {
    let out = out();
    let r = rule(&out, "methods.test", 3);
    assert_eq!(
        r.matcher.path,
        PathMatch::RegularExpression(r"/(?:pkg\.v[0-9]+\..*)/(?:List.*)".into())
    );
    let r = rule(&out, "methods.test", 4);
    assert_eq!(
        r.matcher.path,
        PathMatch::RegularExpression("/(?:[^/]+)/(?:Watch.*)".into())
    );
}

#[test]
fn no_matches_match_every_call() {
    let out = out();
    let r = rule(&out, "methods.test", 5);
    assert_eq!(r.matcher.path, PathMatch::PathPrefix("/".into()));
    assert!(r.matcher.headers.is_empty());
}

#[test]
fn precedence_exact_then_regex_then_service_then_method_then_any() {
    let out = out();
    assert_eq!(
        order(host(&out, "http", "methods.test")),
        vec![
            "methods#0",
            "methods#3",
            "methods#1",
            "methods#2",
            "methods#4",
            "methods#5"
        ]
    );
}

#[test]
fn header_matches_lowercase_first_wins_and_regex() {
    let out = out();
    let v = host(&out, "http", "headers.test");
    let m = &v.routes[0].matcher;
    assert_eq!(m.path, PathMatch::Exact("/pkg.Svc/Get".into()));
    assert_eq!(
        m.headers,
        vec![
            HeaderMatch {
                name: "x-tenant".into(),
                value: StringMatch::Exact("a".into())
            },
            HeaderMatch {
                name: "x-version".into(),
                value: StringMatch::RegularExpression("v[12]".into())
            },
        ]
    );
    // The second match: headers only, every method.
    let m = &v.routes[1].matcher;
    assert_eq!(m.path, PathMatch::PathPrefix("/".into()));
    assert_eq!(m.headers.len(), 1);
}

#[test]
fn filters_reuse_the_httproute_conversions() {
    let out = out();
    let r = &host(&out, "http", "filters.test").routes[0];
    assert_eq!(
        r.filters,
        vec![
            Filter::RequestHeaderModifier(HeaderModifier {
                set: vec![("x-set".into(), "1".into())],
                add: vec![],
                remove: vec!["x-drop".into()],
            }),
            Filter::ResponseHeaderModifier(HeaderModifier {
                set: vec![],
                add: vec![("x-added".into(), "2".into())],
                remove: vec![],
            }),
            Filter::RequestMirror(Mirror {
                backend: Some(BackendKey::h2c("apps", "web", 80)),
                per_million: 500_000,
                sampler: Default::default(),
            }),
        ]
    );
    assert_eq!(
        r.backends,
        vec![WeightedBackend {
            backend: Some(BackendKey::h2c("apps", "api", 8080)),
            weight: 2,
            filters: vec![Filter::RequestHeaderModifier(HeaderModifier {
                set: vec![("x-backend".into(), "api".into())],
                add: vec![],
                remove: vec![],
            })],
        }]
    );
    assert_ok(&out, "filters");
}

#[test]
fn h2c_backends_have_their_own_key() {
    let out = out();
    let t = gw(&out);
    // `web` names no appProtocol: HTTP/1.1 for the HTTPRoute, h2c for the GRPCRoute.
    let grpc = &t.backends[&BackendKey::h2c("apps", "web", 80)];
    let http = &t.backends[&BackendKey::of("apps", "web", 80)];
    assert_eq!(grpc.protocol, BackendProtocol::H2c);
    assert_eq!(http.protocol, BackendProtocol::Http1);
    assert_eq!(grpc.endpoints, http.endpoints);
    assert_eq!(BackendKey::h2c("apps", "web", 80), "apps/web:80#h2c");
    let r = rule(&out, "methods.test", 0);
    assert_eq!(r.backends[0].backend.as_deref(), Some("apps/web:80#h2c"));
    let http_route = &host(&out, "http", "web-http.test").routes[0];
    assert_eq!(
        http_route.backends[0].backend.as_deref(),
        Some("apps/web:80")
    );
}

/// The GRPCRoute `name` (hostname `name.test`) is `Accepted=False UnsupportedValue` with a
/// message holding `why`, and is not served.
fn assert_unsupported(out: &Output, name: &str, why: &str) {
    let c = grpc_parent_conds(out, "apps", name, 0);
    assert_cond(c, "Accepted", "False", "UnsupportedValue");
    let message = &cond(c, "Accepted").message;
    assert!(message.contains(why), "{name}: {message}");
    assert!(
        !hosts(table_listener(gw(out), "http")).contains(&format!("{name}.test").as_str()),
        "{name}: a rejected route is not served"
    );
}

#[test]
fn invalid_service_name_is_unsupported_value() {
    assert_unsupported(
        &out(),
        "bad-service",
        "spec.rules[0].matches[0].method.service",
    );
}

/// A GRPCRoute reads `tollgate.dev/request-trailers` as an HTTPRoute does: a value other
/// than `forward` or `drop` rejects it.
#[test]
fn request_trailers_annotation_is_checked() {
    let extra = "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\n\
                 metadata: {name: trailers, namespace: apps, \
                 annotations: {tollgate.dev/request-trailers: 'yes'}}\n\
                 spec:\n  parentRefs: [{name: grpc, namespace: infra, sectionName: http}]\n  \
                 hostnames: [trailers.test]\n  rules: [{backendRefs: [{name: web, port: 80}]}]\n";
    assert_unsupported(
        &run(&["grpc"], extra),
        "trailers",
        "tollgate.dev/request-trailers",
    );
}

#[test]
fn invalid_regex_is_unsupported_value() {
    assert_unsupported(&out(), "bad-regex", "invalid regular expression");
}

#[test]
fn method_match_without_service_or_method_is_unsupported_value() {
    let out = out();
    let c = grpc_parent_conds(&out, "apps", "empty-method", 0);
    assert_cond(c, "Accepted", "False", "UnsupportedValue");
    assert!(cond(c, "Accepted").message.contains("service and method"));
}

#[test]
fn hostnames_intersect_the_listener() {
    let out = out();
    let c = grpc_parent_conds(&out, "apps", "narrow-miss", 0);
    assert_cond(c, "Accepted", "False", "NoMatchingListenerHostname");
    assert_ok(&out, "narrow-hit");
    let narrow = table_listener(gw(&out), "narrow");
    assert_eq!(hosts(narrow), vec!["a.narrow.test"]);
    assert_eq!(order(vhost(narrow, "a.narrow.test")), vec!["narrow-hit#0"]);
}

#[test]
fn listener_kinds_exclude_grpcroute() {
    let out = out();
    let c = grpc_parent_conds(&out, "apps", "on-http-only", 0);
    assert_cond(c, "Accepted", "False", "NotAllowedByListeners");
    assert!(cond(c, "Accepted").message.contains("GRPCRoutes"), "{c:?}");
    let l = listener(&out, "infra", "grpc", "http-only");
    assert_eq!(l.attached_routes, 0);
    let kinds: Vec<&str> = l
        .supported_kinds
        .iter()
        .flatten()
        .map(|k| k.kind.as_str())
        .collect();
    assert_eq!(kinds, vec!["HTTPRoute"]);
}

#[test]
fn listener_kinds_exclude_httproute() {
    let out = out();
    assert_ok(&out, "on-grpc-only");
    let c = parent_conds(&out, "apps", "http-on-grpc-only", 0);
    assert_cond(c, "Accepted", "False", "NotAllowedByListeners");
    let l = listener(&out, "infra", "grpc", "grpc-only");
    assert_eq!(l.attached_routes, 1);
    assert_eq!(
        order(vhost(
            table_listener(gw(&out), "grpc-only"),
            "grpc-only.test"
        )),
        vec!["on-grpc-only#0"]
    );
}

#[test]
fn default_supported_kinds_list_both() {
    let out = out();
    let l = listener(&out, "infra", "grpc", "http");
    let kinds: Vec<&str> = l
        .supported_kinds
        .iter()
        .flatten()
        .map(|k| k.kind.as_str())
        .collect();
    assert_eq!(kinds, vec!["HTTPRoute", "GRPCRoute"]);
    assert_cond(&l.conditions, "ResolvedRefs", "True", "ResolvedRefs");
}

#[test]
fn backend_not_found() {
    let out = out();
    let c = grpc_parent_conds(&out, "apps", "missing-backend", 0);
    assert_cond(c, "Accepted", "True", "Accepted");
    assert_cond(c, "ResolvedRefs", "False", "BackendNotFound");
    let r = &host(&out, "http", "missing.test").routes[0];
    assert_eq!(r.backends[0].backend, None);
}

#[test]
fn websocket_backend_is_unsupported_protocol() {
    let out = out();
    let c = grpc_parent_conds(&out, "apps", "ws-backend", 0);
    assert_cond(c, "ResolvedRefs", "False", "UnsupportedProtocol");
}

#[test]
fn cross_namespace_backend_needs_a_grant_for_grpcroute() {
    let out = out();
    // The grant for other/shared names HTTPRoute: it does not cover a GRPCRoute.
    let c = grpc_parent_conds(&out, "apps", "cross-denied", 0);
    assert_cond(c, "Accepted", "True", "Accepted");
    assert_cond(c, "ResolvedRefs", "False", "RefNotPermitted");
    assert_ok(&out, "cross-granted");
    let r = &host(&out, "http", "granted.test").routes[0];
    assert_eq!(
        r.backends[0].backend,
        Some(BackendKey::h2c("other", "remote", 80))
    );
}

#[test]
fn cross_serving_the_older_route_keeps_the_hostname() {
    let out = out();
    assert_route_ok(&out, "apps", "old-http");
    let c = grpc_parent_conds(&out, "apps", "new-grpc", 0);
    assert_cond(c, "Accepted", "False", "HostnameConflict");
    let msg = &cond(c, "Accepted").message;
    assert!(msg.contains("HTTPRoute apps/old-http"), "{msg}");
    assert!(msg.contains("listener shared"), "{msg}");
    assert_cond(c, "ResolvedRefs", "True", "ResolvedRefs");
    assert_eq!(order(host(&out, "shared", "both.test")), vec!["old-http#0"]);
}

#[test]
fn cross_serving_wildcards_intersect() {
    let out = out();
    assert_ok(&out, "old-grpc");
    let c = parent_conds(&out, "apps", "new-http", 0);
    assert_cond(c, "Accepted", "False", "HostnameConflict");
    assert!(
        cond(c, "Accepted")
            .message
            .contains("GRPCRoute apps/old-grpc")
    );
    let shared = table_listener(gw(&out), "shared");
    assert!(
        !hosts(shared).contains(&"*.wild.test"),
        "{:?}",
        hosts(shared)
    );
    assert_eq!(order(vhost(shared, "api.wild.test")), vec!["old-grpc#0"]);
}

#[test]
fn cross_serving_same_age_first_by_name() {
    let out = out();
    assert_ok(&out, "tie-a");
    let c = parent_conds(&out, "apps", "tie-b", 0);
    assert_cond(c, "Accepted", "False", "HostnameConflict");
}

#[test]
fn cross_serving_disjoint_hostnames_share_a_listener() {
    let out = out();
    assert_ok(&out, "apart-grpc");
    assert_route_ok(&out, "apps", "apart-http");
    let shared = table_listener(gw(&out), "shared");
    assert_eq!(
        order(vhost(shared, "grpc.apart.test")),
        vec!["apart-grpc#0"]
    );
    assert_eq!(order(vhost(shared, "www.apart.test")), vec!["apart-http#0"]);
    // Conflicts change no attachment count: eight routes name the listener.
    let l = listener(&out, "infra", "grpc", "shared");
    assert_eq!(l.attached_routes, 8);
}

#[test]
fn attached_routes_count_kinds_apart() {
    let out = out();
    let l = listener(&out, "infra", "grpc", "twins");
    assert_eq!(l.attached_routes, 2);
    assert_ok(&out, "twin");
    assert_route_ok(&out, "apps", "twin");
}

#[test]
fn rejections_name_grpcroutes() {
    let out = out();
    let r = out.rejections();
    let bad = r
        .iter()
        .find(|r| r.key.name == "bad-service")
        .expect("bad-service rejected");
    assert_eq!(bad.kind, RouteKind::Grpc.as_str());
    assert_eq!(bad.part.as_deref(), Some("parent infra/grpc/http"));
    assert_eq!(bad.reason, "UnsupportedValue");
    assert!(
        r.iter()
            .any(|r| r.kind == "GRPCRoute" && r.key.name == "new-grpc")
    );
    assert!(
        r.iter()
            .any(|r| r.kind == "HTTPRoute" && r.key.name == "new-http")
    );
}

#[test]
fn grpc_routes_change_no_other_gateway() {
    // Fault isolation: this fixture's Gateway and routes (some rejected) change nothing in the
    // golden world's tables.
    let with = run(&["golden", "grpc"], "");
    let without = run(&["golden"], "");
    for (k, t) in &without.tables {
        assert_eq!(&with.tables[k], t, "{k}");
    }
}

/// Two RateLimitPolicies, one on the HTTPRoute `twin` and one on the GRPCRoute `twin`.
const TWIN_POLICIES: &str = r"
apiVersion: tollgate.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: http-twin, namespace: apps}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: HTTPRoute, name: twin}]
  limits:
    all: {rates: [{limit: 10, window: 1m}]}
---
apiVersion: tollgate.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: grpc-twin, namespace: apps}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: GRPCRoute, name: twin}]
  limits:
    all: {rates: [{limit: 20, window: 1m}]}
";

#[test]
fn policies_target_grpcroutes_apart_from_a_same_named_httproute() {
    let out = run(&["grpc"], TWIN_POLICIES);
    for name in ["http-twin", "grpc-twin"] {
        let c = &out.rate_limit_policies[&tollgate_api::ObjectKey::new("apps", name)].conditions;
        assert_cond(c, "Accepted", "True", "Accepted");
    }
    let twins = table_listener(gw(&out), "twins");
    let key_of = |host: &str| vhost(twins, host).routes[0].policy.clone().unwrap();
    let (http_key, grpc_key) = (key_of("twin-http.test"), key_of("twin-grpc.test"));
    assert_eq!(http_key, "apps/twin/0");
    assert_eq!(grpc_key, "apps/twin/0#grpc");
    let limit = |key: &str| gw(&out).policies[key].rate_limits[0].rates[0].limit;
    assert_eq!((limit(&http_key), limit(&grpc_key)), (10, 20));
    let c = grpc_parent_conds(&out, "apps", "twin", 0);
    let m = &cond(c, "tollgate.dev/RateLimitPolicyAffected").message;
    assert!(
        m.contains("apps/grpc-twin") && !m.contains("apps/http-twin"),
        "{m}"
    );
}
