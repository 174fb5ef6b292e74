//! AuthPolicy `external` authorization: the shapes accepted and refused (with their exact
//! status messages), backend resolution like a route's (ReferenceGrant from
//! `tollgate.dev/AuthPolicy`, BackendTLSPolicy, h2c for gRPC), the backend added to the table
//! that uses it, and an invalid external rule closing its route (fail closed).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod compile_support;

use compile_support::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use tollgate::compile::Output;
use tollgate_api::external::{AllowStatus, ExternalAuthz, ExternalProtocol, HttpCheck};
use tollgate_api::policy::{Closed, PolicySet};
use tollgate_api::{BackendProtocol, ObjectKey, RouteTable};

fn out() -> Output {
    run(&["external"], "")
}

fn gw(out: &Output) -> &RouteTable {
    table(out, "ext", "gw")
}

/// The policy set or the closure of the route of `<name>.test`.
fn of(out: &Output, name: &str) -> (Option<PolicySet>, Option<Closed>) {
    let t = gw(out);
    let host = format!("{name}.test");
    match vhost(table_listener(t, "http"), &host).routes[0]
        .policy
        .as_deref()
    {
        None => (None, None),
        Some(k) => (t.policies.get(k).cloned(), t.closed.get(k).cloned()),
    }
}

/// The external check of the policy `name`'s rule `opa`.
fn external(out: &Output, name: &str) -> ExternalAuthz {
    let (set, closed) = of(out, name);
    assert!(
        closed.is_none(),
        "{name} is closed: {:?}",
        out.auth_policies[&ObjectKey::new("ext", name)].conditions
    );
    let auth = set.unwrap().auth.unwrap();
    assert_eq!(auth.authorization.len(), 1);
    assert_eq!(auth.authorization[0].predicate, "");
    // Proxies count the rule's decisions under the policy that defined it.
    assert_eq!(auth.authorization[0].policy, ObjectKey::new("ext", name));
    auth.authorization[0].external.clone().unwrap()
}

/// Asserts the policy `name` is Invalid with exactly `message` (plus the fail-closed
/// sentence) and closes its route.
#[track_caller]
fn refused(out: &Output, name: &str, message: &str) {
    let c = &out.auth_policies[&ObjectKey::new("ext", name)].conditions;
    assert_eq!(cond(c, "Accepted").reason, "Invalid", "{name}");
    let m = &cond(c, "Accepted").message;
    assert!(m.starts_with(message), "{name}: {m}");
    assert!(
        m.contains("the routes it targets answer 500 until it is fixed"),
        "{m}"
    );
    let (set, closed) = of(out, name);
    assert!(set.is_none());
    assert_eq!(closed.unwrap().by, [ObjectKey::new("ext", name)]);
}

#[test]
fn an_http_rule_compiles_with_its_settings_and_backend() {
    let out = out();
    let c = &out.auth_policies[&ObjectKey::new("ext", "http-ok")].conditions;
    assert_cond(c, "Accepted", "True", "Accepted");
    assert_eq!(
        external(&out, "http-ok"),
        ExternalAuthz {
            id: "ext/http-ok/opa".into(),
            backend: "ext/authz:8080".into(),
            protocol: ExternalProtocol::Http(HttpCheck {
                path_prefix: "/check".into(),
                headers_to_upstream: vec!["x-user".into()],
                headers_to_client: vec!["x-auth-info".into()],
                all_headers_to_upstream: false,
                // The AuthPolicy's own rule: any 2xx allows.
                allow: AllowStatus::Any2xx,
            }),
            forward_headers: vec!["authorization".into(), "x-tenant".into()],
            max_body_bytes: Some(8192),
            timeout_ms: 150,
            fail_open: false,
            cache_ttl_ms: Some(30_000),
        }
    );
    // The authorization service is in the table like a route's backend.
    let b = &gw(&out).backends["ext/authz:8080"];
    assert_eq!(b.protocol, BackendProtocol::Http1);
    assert_eq!(b.endpoints.len(), 1);
    assert_eq!(b.endpoints[0].ip, "10.1.0.7");
    assert_eq!(b.endpoints[0].port, 8080);
}

#[test]
fn a_grpc_rule_speaks_h2_to_its_service_with_the_defaults() {
    let out = out();
    let e = external(&out, "grpc-ok");
    assert_eq!(e.backend, "ext/opa:9191#h2c");
    assert_eq!(e.protocol, ExternalProtocol::Grpc);
    assert_eq!(
        (e.timeout_ms, e.fail_open, e.cache_ttl_ms),
        (200, true, None)
    );
    assert!(e.forward_headers.is_empty());
    let (set, _) = of(&out, "grpc-ok");
    assert_eq!(
        set.unwrap().auth.unwrap().authorization[0].when,
        ["request.url_path.startsWith('/api')"]
    );
    let b = &gw(&out).backends["ext/opa:9191#h2c"];
    assert_eq!(b.protocol, BackendProtocol::H2c);
    assert_eq!(b.endpoints[0].ip, "10.1.0.9");
}

#[test]
fn a_backend_tls_policy_on_the_service_applies_to_the_check() {
    let out = out();
    let e = external(&out, "tls");
    let b = &gw(&out).backends[&e.backend];
    let tls = b.tls.as_ref().expect("TLS to the authorization service");
    assert_eq!(tls.server_name, "authz.example.com");
    // An HTTP service picks HTTP/2 or HTTP/1.1.
    assert_eq!(tls.alpn, ["h2", "http/1.1"]);
    assert_eq!(b.protocol, BackendProtocol::Http1);
}

#[test]
fn a_grpc_service_behind_a_backend_tls_policy_is_offered_h2_alone() {
    // gRPC needs HTTP/2: ALPN `h2` only (grpc-go refuses a client that does not offer it).
    let out = out();
    let e = external(&out, "tls-grpc");
    let b = &gw(&out).backends[&e.backend];
    assert_eq!(b.protocol, BackendProtocol::H2c);
    let tls = b.tls.as_ref().expect("TLS to the authorization service");
    assert_eq!(tls.server_name, "opa.example.com");
    assert_eq!(tls.alpn, ["h2"]);
}

#[test]
fn another_namespace_needs_a_reference_grant_from_auth_policies() {
    let out = out();
    assert_eq!(external(&out, "granted").backend, "shared/granted:8080");
    refused(
        &out,
        "not-granted",
        "authorization.opa.external.http.backendRef: Service shared/private is not permitted by any ReferenceGrant in shared (from tollgate.dev/AuthPolicy)",
    );
}

#[test]
fn an_unresolvable_backend_makes_the_policy_invalid_and_closes_its_route() {
    let out = out();
    refused(
        &out,
        "missing",
        "authorization.opa.external.grpc.backendRef: Service ext/nope not found",
    );
    refused(
        &out,
        "no-port",
        "authorization.opa.external.grpc.backendRef: backendRef to Service ext/opa needs a port",
    );
}

#[test]
fn shapes_that_are_refused() {
    let out = out();
    for (name, message) in [
        (
            "both",
            "authorization.opa.external: set exactly one of grpc, http",
        ),
        (
            "neither",
            "authorization.opa.external: set exactly one of grpc, http",
        ),
        (
            "empty-rule",
            "authorization.opa: set exactly one of predicate, external",
        ),
        (
            "predicate-and-external",
            "authorization.opa: set exactly one of predicate, external",
        ),
        (
            "bad-timeout",
            "authorization.opa.external.timeout: \"soon\" is not a duration like 200ms, 1s, 30s, 5m",
        ),
        (
            "bad-ttl",
            "authorization.opa.external.cacheTTL: \"0s\" is not a duration like 200ms, 1s, 30s, 5m",
        ),
        (
            "bad-header",
            "authorization.opa.external.http.forwardHeaders: \"bad header\" is not a header name",
        ),
        (
            "bad-path",
            "authorization.opa.external.http.path: \"check?x=1\" is not an absolute path without a query",
        ),
    ] {
        refused(&out, name, message);
    }
}

#[test]
fn tables_without_external_rules_get_no_authorization_backends() {
    // The base world alone: no AuthPolicy names a service, no backend is added.
    let out = run(&["external"], "");
    let names: Vec<&String> = gw(&out).backends.keys().collect();
    assert!(
        !names.iter().any(|k| k.contains("shared/private")),
        "{names:?}"
    );
    assert!(!names.iter().any(|k| k.contains("nope")), "{names:?}");
}

// ---- the HTTPRoute ExternalAuth filter (GEP-1494) ----

/// The ExternalAuth filter of the route of `<name>.test`.
fn filter_of(out: &Output, name: &str) -> ExternalAuthz {
    let host = format!("{name}.test");
    vhost(table_listener(gw(out), "http"), &host).routes[0]
        .filters
        .iter()
        .find_map(|f| match f {
            tollgate_api::Filter::ExternalAuth(e) => Some(e.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no ExternalAuth filter on {host}"))
}

fn route_conds(out: &Output, name: &str) -> Vec<Condition> {
    out.http_routes[&ObjectKey::new("ext", name)].parents[0]
        .conditions
        .clone()
}

#[test]
fn an_http_external_auth_filter_compiles_to_the_same_check() {
    let out = out();
    assert_cond(
        &route_conds(&out, "filter-http"),
        "Accepted",
        "True",
        "Accepted",
    );
    assert_eq!(
        filter_of(&out, "filter-http"),
        ExternalAuthz {
            id: "ext/spec.rules[0].filters[0]".into(),
            backend: "ext/authz:8080".into(),
            protocol: ExternalProtocol::Http(HttpCheck {
                path_prefix: "/verify".into(),
                headers_to_upstream: vec![],
                headers_to_client: vec![],
                // allowedResponseHeaders unset: every header of the answer goes upstream.
                all_headers_to_upstream: true,
                // GEP-1494: only a 200 allows.
                allow: AllowStatus::Only200,
            }),
            // Authorization always, plus allowedHeaders.
            forward_headers: vec!["authorization".into(), "x-tenant".into()],
            max_body_bytes: Some(1024),
            timeout_ms: 200,
            fail_open: false,
            cache_ttl_ms: None,
        }
    );
    assert!(gw(&out).backends.contains_key("ext/authz:8080"));
}

#[test]
fn a_grpc_external_auth_filter_speaks_h2() {
    let out = out();
    let e = filter_of(&out, "filter-grpc");
    assert_eq!(e.protocol, ExternalProtocol::Grpc);
    assert_eq!(e.backend, "ext/opa:9191#h2c");
    assert_eq!(e.forward_headers, ["authorization"]);
    assert_eq!(
        gw(&out).backends["ext/opa:9191#h2c"].protocol,
        BackendProtocol::H2c
    );
}

#[test]
fn an_unresolvable_external_auth_backend_is_a_resolved_refs_problem_and_denies() {
    let out = out();
    let c = route_conds(&out, "filter-missing");
    assert_cond(&c, "ResolvedRefs", "False", "BackendNotFound");
    assert_eq!(
        cond(&c, "ResolvedRefs").message,
        "spec.rules[0].filters[0].externalAuth.backendRef: Service ext/nope not found"
    );
    // Kept with no backend: the proxy cannot reach it and answers 403.
    assert_eq!(filter_of(&out, "filter-missing").backend, "");
}

#[test]
fn an_external_auth_filter_on_a_backend_ref_is_refused() {
    let out = out();
    let c = route_conds(&out, "filter-on-backend");
    assert_cond(&c, "Accepted", "False", "UnsupportedValue");
    assert_eq!(
        cond(&c, "Accepted").message,
        "spec.rules[0].backendRefs[0].filters[0]: ExternalAuth filters are supported on rules, not on backendRefs"
    );
}

#[test]
fn an_external_auth_path_that_is_no_request_path_is_refused() {
    // Outside the API server (`tollgate run`) the CRD's pattern does not screen it.
    let out = out();
    let c = route_conds(&out, "filter-bad-path");
    assert_cond(&c, "Accepted", "False", "UnsupportedValue");
    assert_eq!(
        cond(&c, "Accepted").message,
        "spec.rules[0].filters[0].http.path: \"/check me\" is not an absolute path"
    );
}
