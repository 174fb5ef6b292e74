//! Gateway API route precedence: one test per rule, named after it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod compile_support;

use compile_support::*;

/// An HTTPRoute on apps/gw with `hostnames` and `rules` (YAML flow sequences).
fn route(ns: &str, name: &str, created: &str, hostnames: &str, rules: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: {name}, namespace: {ns}, creationTimestamp: \"{created}\"}}
spec:
  parentRefs: [{{name: gw, namespace: apps}}]
  hostnames: {hostnames}
  rules: {rules}
---
"
    )
}

const T0: &str = "2024-01-01T00:00:00Z";
const T1: &str = "2024-06-01T00:00:00Z";

/// Route order in the `*` (or given) vhost after compiling `routes`.
fn order_of(host: &str, routes: &[String]) -> Vec<String> {
    let out = run(&["precedence"], &routes.concat());
    let l = table_listener(table(&out, "apps", "gw"), "http");
    order(vhost(l, host))
}

#[test]
fn precedence_exact_path_beats_prefix() {
    let routes = [
        route(
            "apps",
            "a",
            T0,
            "[]",
            "[{matches: [{path: {type: PathPrefix, value: /foo/bar}}]}]",
        ),
        route(
            "apps",
            "b",
            T1,
            "[]",
            "[{matches: [{path: {type: Exact, value: /foo}}]}]",
        ),
    ];
    assert_eq!(order_of("*", &routes), vec!["b#0", "a#0"]);
}

#[test]
fn precedence_longest_prefix_wins() {
    let routes = [
        route(
            "apps",
            "a",
            T0,
            "[]",
            "[{matches: [{path: {value: /api}}]}, {matches: [{path: {value: /}}]}]",
        ),
        route(
            "apps",
            "b",
            T1,
            "[]",
            "[{matches: [{path: {value: /api/v1}}]}]",
        ),
    ];
    assert_eq!(order_of("*", &routes), vec!["b#0", "a#0", "a#1"]);
}

#[test]
fn precedence_regex_between_exact_and_prefix() {
    let routes = [
        route(
            "apps",
            "a",
            T0,
            "[]",
            "[{matches: [{path: {value: /very/long/prefix}}]}]",
        ),
        route(
            "apps",
            "b",
            T0,
            "[]",
            "[{matches: [{path: {type: RegularExpression, value: '/v[0-9]+/.*'}}]}]",
        ),
        route(
            "apps",
            "c",
            T0,
            "[]",
            "[{matches: [{path: {type: Exact, value: /x}}]}]",
        ),
    ];
    assert_eq!(order_of("*", &routes), vec!["c#0", "b#0", "a#0"]);
}

#[test]
fn precedence_method_beats_none() {
    let routes = [
        route(
            "apps",
            "a",
            T0,
            "[]",
            "[{matches: [{path: {value: /p}, headers: [{name: h, value: v}]}]}]",
        ),
        route(
            "apps",
            "b",
            T1,
            "[]",
            "[{matches: [{path: {value: /p}, method: GET}]}]",
        ),
    ];
    assert_eq!(order_of("*", &routes), vec!["b#0", "a#0"]);
}

#[test]
fn precedence_more_headers_wins() {
    let routes = [
        route(
            "apps",
            "a",
            T0,
            "[]",
            "[{matches: [{headers: [{name: a, value: '1'}], queryParams: [{name: q, value: '1'}, {name: r, value: '2'}]}]}]",
        ),
        route(
            "apps",
            "b",
            T1,
            "[]",
            "[{matches: [{headers: [{name: a, value: '1'}, {name: b, value: '2'}]}]}]",
        ),
    ];
    assert_eq!(order_of("*", &routes), vec!["b#0", "a#0"]);
}

#[test]
fn precedence_more_query_params_wins() {
    let routes = [
        route(
            "apps",
            "a",
            T0,
            "[]",
            "[{matches: [{queryParams: [{name: q, value: '1'}]}]}]",
        ),
        route(
            "apps",
            "b",
            T1,
            "[]",
            "[{matches: [{queryParams: [{name: q, value: '1'}, {name: r, value: '2'}]}]}]",
        ),
    ];
    assert_eq!(order_of("*", &routes), vec!["b#0", "a#0"]);
}

#[test]
fn precedence_oldest_route_wins() {
    let routes = [
        route(
            "apps",
            "a-new",
            T1,
            "[]",
            "[{matches: [{path: {value: /same}}]}]",
        ),
        route(
            "apps",
            "z-old",
            T0,
            "[]",
            "[{matches: [{path: {value: /same}}]}]",
        ),
    ];
    assert_eq!(order_of("*", &routes), vec!["z-old#0", "a-new#0"]);
}

#[test]
fn precedence_namespace_name_breaks_ties() {
    let routes = [
        route(
            "other",
            "a",
            T0,
            "[]",
            "[{matches: [{path: {value: /same}}]}]",
        ),
        route(
            "apps",
            "b",
            T0,
            "[]",
            "[{matches: [{path: {value: /same}}]}]",
        ),
        route(
            "apps",
            "a",
            T0,
            "[]",
            "[{matches: [{path: {value: /same}}]}]",
        ),
    ];
    let out = run(&["precedence"], &routes.concat());
    let l = table_listener(table(&out, "apps", "gw"), "http");
    let keys: Vec<String> = vhost(l, "*")
        .routes
        .iter()
        .map(|r| r.route.to_string())
        .collect();
    assert_eq!(keys, vec!["apps/a", "apps/b", "other/a"]);
}

#[test]
fn precedence_rule_then_match_order_within_a_route() {
    let routes = [route(
        "apps",
        "a",
        T0,
        "[]",
        "[{matches: [{path: {value: /x}}, {path: {value: /y}}]}, {matches: [{path: {value: /z}}]}]",
    )];
    let out = run(&["precedence"], &routes.concat());
    let l = table_listener(table(&out, "apps", "gw"), "http");
    let v = vhost(l, "*");
    let paths: Vec<String> = v
        .routes
        .iter()
        .map(|r| format!("{:?}", r.matcher.path))
        .collect();
    assert_eq!(
        paths,
        vec![
            r#"PathPrefix("/x")"#,
            r#"PathPrefix("/y")"#,
            r#"PathPrefix("/z")"#
        ]
    );
}

#[test]
fn precedence_hostname_exact_before_wildcard() {
    let routes = [
        route("apps", "any", T0, "[]", "[{}]"),
        route("apps", "wild", T0, "['*.example.com']", "[{}]"),
        route("apps", "deep", T0, "['*.api.example.com']", "[{}]"),
        route("apps", "exact", T1, "[Foo.Example.com, a.io]", "[{}]"),
    ];
    let out = run(&["precedence"], &routes.concat());
    let l = table_listener(table(&out, "apps", "gw"), "http");
    assert_eq!(
        hosts(l),
        vec![
            "foo.example.com",
            "a.io",
            "*.api.example.com",
            "*.example.com",
            "*"
        ]
    );
    assert_eq!(order(vhost(l, "foo.example.com")), vec!["exact#0"]);
    assert_eq!(order(vhost(l, "*")), vec!["any#0"]);
}
