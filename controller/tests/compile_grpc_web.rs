//! gRPC-Web on GRPCRoutes: every GRPCRoute rule serves it (`grpc_web` in the table), no
//! HTTPRoute rule does, and a GRPCRoute takes CORS from its `tollgate.dev/cors` annotation
//! (a filter first in each rule, with what gRPC-Web needs filled in), or is rejected for a
//! value it cannot have.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod compile_support;

use compile_support::*;
use tollgate::compile::Output;
use tollgate_api::{Cors, Filter, Route, RouteTable};

fn gw(out: &Output) -> &RouteTable {
    table(out, "infra", "grpc")
}

fn routes<'a>(out: &'a Output, hostname: &str) -> &'a [Route] {
    &vhost(table_listener(gw(out), "http"), hostname).routes
}

/// A GRPCRoute `name` on `name.test` with `annotations` (a YAML flow map's inside).
fn grpc_route(name: &str, annotations: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\n\
         metadata: {{name: {name}, namespace: apps, annotations: {{{annotations}}}}}\n\
         spec:\n  parentRefs: [{{name: grpc, namespace: infra, sectionName: http}}]\n  \
         hostnames: [{name}.test]\n  rules:\n  - backendRefs: [{{name: web, port: 80}}]\n  \
         - matches: [{{method: {{service: pkg.Other}}}}]\n    \
         filters: [{{type: ResponseHeaderModifier, responseHeaderModifier: {{add: [{{name: x-a, value: b}}]}}}}]\n    \
         backendRefs: [{{name: web, port: 80}}]\n"
    )
}

#[test]
fn every_grpcroute_rule_serves_grpc_web_and_no_httproute_rule_does() {
    let out = run(&["grpc"], "");
    let grpc = routes(&out, "methods.test");
    assert!(!grpc.is_empty());
    assert!(grpc.iter().all(|r| r.grpc_web), "{grpc:?}");
    let http = routes(&out, "web-http.test");
    assert!(http.iter().all(|r| !r.grpc_web), "{http:?}");
    // The table says so only where it is true: HTTPRoute entries carry no field.
    let json = serde_json::to_value(&http[0]).unwrap();
    assert!(json.get("grpcWeb").is_none(), "{json}");
}

#[test]
fn the_cors_annotation_is_a_filter_first_in_every_rule() {
    let annotation =
        r#"tollgate.dev/cors: '{"allowOrigins": ["https://app.example"], "maxAge": 600}'"#;
    let out = run(&["grpc"], &grpc_route("browser", annotation));
    let c = grpc_parent_conds(&out, "apps", "browser", 0);
    assert_cond(c, "Accepted", "True", "Accepted");
    let want = Filter::Cors(Cors {
        allow_origins: vec!["https://app.example".into()],
        allow_credentials: false,
        allow_methods: vec!["POST".into()],
        allow_headers: ["content-type", "x-grpc-web", "x-user-agent", "grpc-timeout"]
            .map(String::from)
            .to_vec(),
        expose_headers: vec!["grpc-status".into(), "grpc-message".into()],
        max_age: 600,
    });
    let rs = routes(&out, "browser.test");
    assert_eq!(rs.len(), 2);
    for r in rs {
        assert_eq!(r.filters.first(), Some(&want), "rule {}", r.rule_index);
        assert!(r.grpc_web);
    }
    let other = rs.iter().find(|r| r.rule_index == 1).unwrap();
    assert_eq!(
        other.filters.len(),
        2,
        "the rule's own filter stays, after CORS"
    );
}

#[test]
fn a_cors_annotation_it_cannot_read_rejects_the_route() {
    for (value, why) in [
        (
            "'{\"allowOrigin\": [\"https://a.example\"]}'",
            "unknown field",
        ),
        ("'allowOrigins: [https://a.example]'", "not JSON"),
        ("'{\"maxAge\": -1}'", "maxAge must not be negative"),
    ] {
        let out = run(
            &["grpc"],
            &grpc_route("cors", &format!("tollgate.dev/cors: {value}")),
        );
        let c = grpc_parent_conds(&out, "apps", "cors", 0);
        assert_cond(c, "Accepted", "False", "UnsupportedValue");
        let message = &cond(c, "Accepted").message;
        assert!(message.contains("tollgate.dev/cors"), "{message}");
        assert!(message.contains(why), "{value}: {message}");
        assert!(
            !hosts(table_listener(gw(&out), "http")).contains(&"cors.test"),
            "a rejected route is not served"
        );
    }
}
