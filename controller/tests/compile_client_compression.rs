//! ClientPolicy `compression`: defaults, the issue's shape, a listener's section over its
//! Gateway's, `disabled`, the per-route opt-out, and every invalid setting with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod compile_support;

use compile_support::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use tollgate::compile::Output;
use tollgate_api::ObjectKey;
use tollgate_api::client::{Compression, Encoding};

/// A Gateway with `web` (80) and `secure` (8443) listeners, and an HTTPRoute `r` on it with
/// a rule `upload` (/upload) and an unnamed one (/).
const INPUTS: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: infra, generation: 1}
spec:
  gatewayClassName: tollgate
  listeners:
  - {name: web, protocol: HTTP, port: 80}
  - {name: secure, protocol: HTTP, port: 8443}
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

const GW: &str = "{group: gateway.networking.k8s.io, kind: Gateway, name: edge}";
const ROUTE: &str = "{group: gateway.networking.k8s.io, kind: HTTPRoute, name: r}";
const RULE: &str =
    "{group: gateway.networking.k8s.io, kind: HTTPRoute, name: r, sectionName: upload}";

fn policy(name: &str, created: &str, target: &str, body: &str) -> String {
    format!(
        "---\napiVersion: tollgate.dev/v1alpha1\nkind: ClientPolicy\nmetadata: {{name: {name}, \
         namespace: infra, generation: 2, creationTimestamp: \"{created}\"}}\nspec:\n  \
         targetRefs: [{target}]\n{body}\n"
    )
}

fn compiled(policies: &[String]) -> Output {
    run(&[], &format!("{INPUTS}{}", policies.concat()))
}

fn conds<'a>(out: &'a Output, name: &str) -> &'a [Condition] {
    &out.client_policies[&ObjectKey::new("infra", name)].conditions
}

fn compression(out: &Output, p: u16) -> Option<&Compression> {
    port(table(out, "infra", "edge"), p)
        .client
        .compression
        .as_ref()
}

/// Each rule of `r` and whether it opts out, with its body limit.
fn rules(out: &Output) -> Vec<(u32, bool, Option<u64>)> {
    let mut v: Vec<_> = table(out, "infra", "edge")
        .ports
        .iter()
        .flat_map(|p| &p.listeners)
        .flat_map(|l| &l.virtual_hosts)
        .flat_map(|h| h.routes.iter())
        .map(|r| {
            (
                r.rule_index,
                r.compression_disabled,
                r.max_request_body_bytes,
            )
        })
        .collect();
    v.sort();
    v.dedup();
    v
}

#[test]
fn the_issues_shape_compiles_as_written() {
    let out = compiled(&[policy(
        "edge",
        "2026-01-01T00:00:00Z",
        GW,
        "  compression: {algorithms: [zstd, br, gzip], minBytes: 1024, contentTypes: [text/html, text/plain, application/json]}",
    )]);
    assert_cond(conds(&out, "edge"), "Accepted", "True", "Accepted");
    assert_cond(conds(&out, "edge"), "Enforced", "True", "Enforced");
    let want = Compression {
        algorithms: vec![Encoding::Zstd, Encoding::Br, Encoding::Gzip],
        min_bytes: 1024,
        content_types: vec![
            "text/html".into(),
            "text/plain".into(),
            "application/json".into(),
        ],
        gzip_level: None,
    };
    assert_eq!(compression(&out, 80), Some(&want));
    assert_eq!(compression(&out, 8443), Some(&want));
}

#[test]
fn an_empty_section_takes_the_defaults() {
    let out = compiled(&[policy(
        "edge",
        "2026-01-01T00:00:00Z",
        GW,
        "  compression: {contentTypes: [Text/*, application/JSON]}",
    )]);
    let c = compression(&out, 80).unwrap();
    assert_eq!(c.algorithms, Encoding::ALL.to_vec());
    assert_eq!(c.min_bytes, 1024);
    assert_eq!(
        c.content_types,
        vec!["text/*", "application/json"],
        "lower case"
    );
    let out = compiled(&[policy(
        "edge",
        "2026-01-01T00:00:00Z",
        GW,
        "  compression: {}",
    )]);
    let c = compression(&out, 80).unwrap();
    assert!(c.content_types.contains(&"application/json".to_owned()));
    assert!(c.content_types.contains(&"text/html".to_owned()));
    assert!(!c.content_types.iter().any(|t| t.starts_with("image/png")));
}

#[test]
fn gzip_level_is_kept_when_set() {
    let out = compiled(&[policy(
        "edge",
        "2026-01-01T00:00:00Z",
        GW,
        "  compression: {algorithms: [gzip], gzipLevel: 6}",
    )]);
    assert_cond(conds(&out, "edge"), "Accepted", "True", "Accepted");
    assert_eq!(compression(&out, 80).unwrap().gzip_level, Some(6));
    let out = compiled(&[policy(
        "edge",
        "2026-01-01T00:00:00Z",
        GW,
        "  compression: {algorithms: [gzip]}",
    )]);
    assert_eq!(
        compression(&out, 80).unwrap().gzip_level,
        None,
        "the proxy's default"
    );
}

#[test]
fn a_listener_section_replaces_the_gateways_and_disabled_turns_it_off() {
    let out = compiled(&[
        policy(
            "edge",
            "2026-01-01T00:00:00Z",
            GW,
            "  compression: {algorithms: [gzip], minBytes: 10}",
        ),
        policy(
            "secure",
            "2026-01-02T00:00:00Z",
            "{group: gateway.networking.k8s.io, kind: Gateway, name: edge, sectionName: secure}",
            "  compression: {disabled: true}",
        ),
    ]);
    assert_cond(conds(&out, "secure"), "Accepted", "True", "Accepted");
    assert_eq!(
        compression(&out, 80).unwrap().algorithms,
        vec![Encoding::Gzip]
    );
    assert_eq!(compression(&out, 8443), None);
    // No section at all: no compression.
    let out = compiled(&[policy(
        "edge",
        "2026-01-01T00:00:00Z",
        GW,
        "  limits: {maxRequestHeaders: 50}",
    )]);
    assert_eq!(compression(&out, 80), None);
}

#[test]
fn a_route_or_rule_opts_out_with_disabled_alone() {
    let out = compiled(&[
        policy(
            "no-gzip",
            "2026-01-01T00:00:00Z",
            ROUTE,
            "  compression: {disabled: true}",
        ),
        policy(
            "uploads",
            "2026-01-02T00:00:00Z",
            RULE,
            "  limits: {maxRequestBodyBytes: 5000}",
        ),
    ]);
    assert_cond(conds(&out, "no-gzip"), "Accepted", "True", "Accepted");
    assert_cond(conds(&out, "no-gzip"), "Enforced", "True", "Enforced");
    assert_eq!(
        rules(&out),
        vec![(0, true, Some(5000)), (1, true, None)],
        "the rule's body limit, the route's opt-out: each field from where it is set"
    );
    assert_cond(
        &out.http_routes[&ObjectKey::new("infra", "r")].parents[0].conditions,
        "tollgate.dev/ClientPolicyAffected",
        "True",
        "Accepted",
    );
    let only_rule = compiled(&[policy(
        "one",
        "2026-01-01T00:00:00Z",
        RULE,
        "  compression: {disabled: true}",
    )]);
    assert_eq!(rules(&only_rule), vec![(0, true, None), (1, false, None)]);
}

#[test]
fn on_a_route_compression_settings_other_than_disabled_are_invalid() {
    for body in [
        "  compression: {minBytes: 10}",
        "  compression: {}",
        "  compression: {disabled: false}",
    ] {
        let out = compiled(&[policy("r", "2026-01-01T00:00:00Z", ROUTE, body)]);
        let c = conds(&out, "r");
        assert_cond(c, "Accepted", "False", "Invalid");
        let m = &cond(c, "Accepted").message;
        assert!(m.contains("on an HTTPRoute only"), "{body}: {m}");
        assert_eq!(rules(&out), vec![(0, false, None), (1, false, None)]);
    }
}

#[test]
fn invalid_compression_settings_make_the_policy_invalid() {
    for (name, body, says) in [
        (
            "unknown",
            "  compression: {algorithms: [gzip, deflate]}",
            "compression.algorithms: \"deflate\" is not one of zstd, br and gzip",
        ),
        (
            "empty",
            "  compression: {algorithms: []}",
            "compression.algorithms must list 1 to 3",
        ),
        (
            "twice",
            "  compression: {algorithms: [br, br]}",
            "\"br\" is listed twice",
        ),
        (
            "upper",
            "  compression: {algorithms: [GZIP]}",
            "\"GZIP\" is not one of",
        ),
        (
            "huge-min",
            "  compression: {minBytes: 16777217}",
            "compression.minBytes must be 0 to 16777216, not 16777217",
        ),
        (
            "no-types",
            "  compression: {contentTypes: []}",
            "compression.contentTypes must list 1 to 64",
        ),
        (
            "not-a-type",
            "  compression: {contentTypes: [json]}",
            "\"json\" is not a media type",
        ),
        (
            "params",
            "  compression: {contentTypes: [\"text/html; charset=utf-8\"]}",
            "no parameters",
        ),
        (
            "any",
            "  compression: {contentTypes: [\"*/*\"]}",
            "is not a media type",
        ),
        (
            "grpc",
            "  compression: {contentTypes: [application/grpc]}",
            "is gRPC",
        ),
        (
            "gzip-zero",
            "  compression: {gzipLevel: 0}",
            "compression.gzipLevel must be 1 to 9, not 0",
        ),
        (
            "gzip-ten",
            "  compression: {gzipLevel: 10}",
            "compression.gzipLevel must be 1 to 9, not 10",
        ),
        (
            "disabled-and-more",
            "  compression: {disabled: true, algorithms: [gzip]}",
            "compression.disabled: true takes no other field",
        ),
    ] {
        let out = compiled(&[policy(name, "2026-01-01T00:00:00Z", GW, body)]);
        let c = conds(&out, name);
        assert_cond(c, "Accepted", "False", "Invalid");
        let m = &cond(c, "Accepted").message;
        assert!(m.contains(says), "{name}: {m}");
        // Never valid: the ports it targets close, as for its other fields.
        assert!(
            !port(table(&out, "infra", "edge"), 80)
                .client
                .closed_by
                .is_empty(),
            "{name}"
        );
    }
}
