//! HTTPRoute attachment: parentRefs, sectionName, port, allowedRoutes, hostnames.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod compile_support;

use compile_support::*;
use tollgate::compile::CONTROLLER_NAME;
use tollgate_api::ObjectKey;

fn out() -> tollgate::compile::Output {
    run(&["attachment"], "")
}

#[test]
fn parent_entry_copies_the_parent_ref() {
    let out = out();
    let st = &out.http_routes[&ObjectKey::new("apps", "section-http")];
    assert_eq!(st.parents.len(), 1);
    let p = &st.parents[0];
    assert_eq!(p.controller_name, CONTROLLER_NAME);
    assert_eq!(p.parent_ref.name, "gw");
    assert_eq!(p.parent_ref.namespace.as_deref(), Some("infra"));
    assert_eq!(p.parent_ref.section_name.as_deref(), Some("http"));
    assert_eq!(p.parent_ref.kind, None);
    assert_route_ok(&out, "apps", "section-http");
    assert!(
        p.conditions
            .iter()
            .all(|c| c.observed_generation == Some(7))
    );
}

#[test]
fn section_name_selects_one_listener() {
    let out = out();
    let t = table(&out, "infra", "gw");
    let http = table_listener(t, "http");
    let names: Vec<String> = http.virtual_hosts.iter().flat_map(order).collect();
    assert!(names.contains(&"section-http#0".to_owned()));
    // Listener isolation: the route is on no other listener.
    for l in ["same", "selected", "expr", "wild", "exact"] {
        let cfg = table_listener(t, l);
        assert!(
            cfg.virtual_hosts
                .iter()
                .flat_map(order)
                .all(|n| n != "section-http#0"),
            "{l}"
        );
    }
}

#[test]
fn no_matching_parent_section_name() {
    let out = out();
    let c = parent_conds(&out, "apps", "section-missing", 0);
    assert_cond(c, "Accepted", "False", "NoMatchingParent");
    assert_cond(c, "ResolvedRefs", "True", "ResolvedRefs");
}

#[test]
fn port_selects_listener() {
    let out = out();
    assert_route_ok(&out, "apps", "port-wild");
    let wild = table_listener(table(&out, "infra", "gw"), "wild");
    // A route without hostnames takes the listener's.
    assert_eq!(order(vhost(wild, "*.example.com")), vec!["port-wild#0"]);
}

#[test]
fn no_matching_parent_port() {
    let out = out();
    assert_cond(
        parent_conds(&out, "apps", "port-missing", 0),
        "Accepted",
        "False",
        "NoMatchingParent",
    );
}

#[test]
fn allowed_routes_same() {
    let out = out();
    let c = parent_conds(&out, "apps", "same-from-apps", 0);
    assert_cond(c, "Accepted", "False", "NotAllowedByListeners");
    assert_route_ok(&out, "infra", "same-from-infra");
}

#[test]
fn allowed_routes_all() {
    let out = out();
    assert_route_ok(&out, "apps", "section-http");
    assert_route_ok(&out, "apps", "two-parents");
}

#[test]
fn allowed_routes_selector_match_labels() {
    let out = out();
    assert_route_ok(&out, "apps", "selected");
    let c = parent_conds(&out, "other", "selected", 0);
    assert_cond(c, "Accepted", "False", "NotAllowedByListeners");
}

#[test]
fn allowed_routes_selector_match_expressions() {
    let out = out();
    assert_route_ok(&out, "apps", "expr");
    assert_cond(
        parent_conds(&out, "other", "expr", 0),
        "Accepted",
        "False",
        "NotAllowedByListeners",
    );
}

#[test]
fn not_allowed_by_listeners_is_a_rejection() {
    let out = out();
    let rej = out.rejections();
    assert!(rej.iter().any(|r| r.kind == "HTTPRoute"
        && r.key == ObjectKey::new("other", "selected")
        && r.part.as_deref() == Some("parent infra/gw/selected")
        && r.reason == "NotAllowedByListeners"));
}

#[test]
fn hostname_intersection_route_exact_under_listener_wildcard() {
    let out = out();
    assert_route_ok(&out, "apps", "host-under-wildcard");
    let wild = table_listener(table(&out, "infra", "gw"), "wild");
    // example.com and other.org do not intersect *.example.com; a.b.example.com does.
    assert_eq!(
        order(vhost(wild, "bar.example.com")),
        vec!["host-under-wildcard#0"]
    );
    assert_eq!(
        order(vhost(wild, "a.b.example.com")),
        vec!["host-under-wildcard#0"]
    );
    assert_eq!(
        hosts(wild),
        vec!["a.b.example.com", "bar.example.com", "*.example.com"]
    );
}

#[test]
fn hostname_intersection_route_wildcard_over_listener_exact() {
    let out = out();
    assert_route_ok(&out, "apps", "wildcard-route-exact-listener");
    let exact = table_listener(table(&out, "infra", "gw"), "exact");
    assert_eq!(hosts(exact), vec!["foo.example.com"]);
    assert_eq!(exact.hostname.as_deref(), Some("foo.example.com"));
}

#[test]
fn no_matching_listener_hostname() {
    let out = out();
    let c = parent_conds(&out, "apps", "host-mismatch", 0);
    assert_cond(c, "Accepted", "False", "NoMatchingListenerHostname");
}

#[test]
fn parents_that_are_not_our_gateways_get_no_entry() {
    let out = out();
    assert!(
        !out.http_routes
            .contains_key(&ObjectKey::new("apps", "not-our-gateway"))
    );
    let st = &out.http_routes[&ObjectKey::new("apps", "two-parents")];
    assert_eq!(st.parents.len(), 1);
    assert_eq!(st.parents[0].parent_ref.name, "gw");
}

#[test]
fn attached_routes_counts_successful_attachments() {
    let out = out();
    let count = |l: &str| listener(&out, "infra", "gw", l).attached_routes;
    assert_eq!(count("http"), 2); // section-http, two-parents
    assert_eq!(count("same"), 1); // same-from-infra
    assert_eq!(count("selected"), 1);
    assert_eq!(count("expr"), 1);
    assert_eq!(count("wild"), 2); // port-wild, host-under-wildcard
    assert_eq!(count("exact"), 1);
    let gw = gateway_conds(&out, "infra", "gw");
    assert_cond(gw, "Accepted", "True", "Accepted");
    assert_cond(gw, "Programmed", "True", "Programmed");
    assert_eq!(gw[0].observed_generation, Some(2));
}

#[test]
fn route_to_unaccepted_gateway_is_no_matching_parent() {
    let out = run(
        &["attachment"],
        r"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: broken, namespace: apps}
spec:
  gatewayClassName: tollgate
  listeners: [{name: quic, port: 53, protocol: example.com/QUIC}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: to-broken, namespace: apps}
spec:
  parentRefs: [{name: broken}]
  rules: [{}]
",
    );
    assert_cond(
        parent_conds(&out, "apps", "to-broken", 0),
        "Accepted",
        "False",
        "NoMatchingParent",
    );
}

#[test]
fn listener_isolation_with_hostname_intersection() {
    // Shaped like the GatewayHTTPListenerIsolation conformance test.
    let out = run(
        &[],
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: iso, namespace: infra}
spec:
  gatewayClassName: tollgate
  listeners:
  - {name: empty-hostname, port: 80, protocol: HTTP, allowedRoutes: {namespaces: {from: All}}}
  - {name: wildcard-example-com, port: 80, protocol: HTTP, hostname: "*.example.com", allowedRoutes: {namespaces: {from: All}}}
  - {name: wildcard-foo-example-com, port: 80, protocol: HTTP, hostname: "*.foo.example.com", allowedRoutes: {namespaces: {from: All}}}
  - {name: abc-foo-example-com, port: 80, protocol: HTTP, hostname: abc.foo.example.com, allowedRoutes: {namespaces: {from: All}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: on-wildcard, namespace: apps}
spec:
  parentRefs: [{name: iso, namespace: infra, sectionName: wildcard-example-com}]
  hostnames: [bar.com, "*.example.com", "*.foo.example.com", abc.foo.example.com]
  rules: [{matches: [{path: {value: /wildcard-example-com}}], backendRefs: [{name: web, port: 80}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: on-abc, namespace: apps}
spec:
  parentRefs: [{name: iso, namespace: infra, sectionName: abc-foo-example-com}]
  rules: [{matches: [{path: {value: /abc-foo-example-com}}], backendRefs: [{name: web, port: 80}]}]
"#,
    );
    assert_route_ok(&out, "apps", "on-wildcard");
    assert_route_ok(&out, "apps", "on-abc");
    let t = table(&out, "infra", "iso");
    let p = port(t, 80);
    let names: Vec<&str> = p.listeners.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(
        names,
        vec![
            "abc-foo-example-com",
            "wildcard-foo-example-com",
            "wildcard-example-com",
            "empty-hostname"
        ]
    );
    let wild = table_listener(t, "wildcard-example-com");
    assert_eq!(
        hosts(wild),
        vec!["abc.foo.example.com", "*.foo.example.com", "*.example.com"]
    );
    let abc = table_listener(t, "abc-foo-example-com");
    assert_eq!(hosts(abc), vec!["abc.foo.example.com"]);
    assert_eq!(order(vhost(abc, "abc.foo.example.com")), vec!["on-abc#0"]);
    assert!(table_listener(t, "empty-hostname").virtual_hosts.is_empty());
    assert_eq!(
        listener(&out, "infra", "iso", "wildcard-foo-example-com").attached_routes,
        0
    );
}
