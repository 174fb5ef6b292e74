//! RateLimitPolicy `cost` and `mode`: what reaches the table, and the status of each mistake.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod compile_support;

use compile_support::*;
use tollgate::compile::Output;
use tollgate_api::ObjectKey;
use tollgate_api::policy::{Cost, LimitMode, RateLimit};

/// The `policies` fixture plus a route `llm.test` and a policy `tokens` on it with `limit`
/// (the YAML of one limit, under `limits.tokens`).
fn with_limit(limit: &str) -> Output {
    run(
        &["policies"],
        &format!(
            r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: llm, namespace: pol}}
spec:
  parentRefs: [{{name: gw, sectionName: http}}]
  hostnames: [llm.test]
  rules: [{{backendRefs: [{{name: app, port: 80}}]}}]
---
apiVersion: tollgate.dev/v1alpha1
kind: RateLimitPolicy
metadata: {{name: tokens, namespace: pol, generation: 1}}
spec:
  targetRefs: [{{group: gateway.networking.k8s.io, kind: HTTPRoute, name: llm}}]
  limits:
    tokens: {limit}
"#
        ),
    )
}

/// The Accepted condition's (status, message) of policy `tokens`.
fn accepted(out: &Output) -> (String, String) {
    let c = cond(
        &out.rate_limit_policies[&ObjectKey::new("pol", "tokens")].conditions,
        "Accepted",
    );
    (c.status.clone(), c.message.clone())
}

/// The table's limit `pol/tokens/tokens`.
fn table_limit(out: &Output) -> RateLimit {
    let t = table(out, "pol", "gw");
    t.policies
        .values()
        .flat_map(|s| &s.rate_limits)
        .find(|l| l.id == "pol/tokens/tokens")
        .cloned()
        .expect("limit pol/tokens/tokens in the table")
}

#[test]
fn a_response_cost_in_shadow_mode_reaches_the_table() {
    let out = with_limit(
        r#"
      rates: [{limit: 1000, window: 1m}]
      counters: [{expression: "request.headers['x-user']"}]
      cost: {response: "int(response.headers['x-tokens-used'])"}
      mode: Shadow"#,
    );
    assert_eq!(accepted(&out).0, "True", "{}", accepted(&out).1);
    let l = table_limit(&out);
    assert_eq!(
        l.cost,
        Some(Cost::Response(
            "int(response.headers['x-tokens-used'])".into()
        ))
    );
    assert_eq!(l.mode, LimitMode::Shadow);
}

#[test]
fn a_request_cost_enforced_by_default_reaches_the_table() {
    let out = with_limit(
        r#"
      rates: [{limit: 1000, window: 1m}]
      cost: {request: "int(request.headers['content-length'])"}"#,
    );
    assert_eq!(accepted(&out).0, "True", "{}", accepted(&out).1);
    let l = table_limit(&out);
    assert_eq!(
        l.cost,
        Some(Cost::Request(
            "int(request.headers['content-length'])".into()
        ))
    );
    assert_eq!(l.mode, LimitMode::Enforce);
}

#[test]
fn a_plain_limit_serializes_without_cost_or_mode() {
    let out = with_limit("{rates: [{limit: 5, window: 1s}], mode: Enforce}");
    let json = serde_json::to_string(&table_limit(&out)).unwrap();
    assert!(!json.contains("cost") && !json.contains("mode"), "{json}");
}

#[track_caller]
fn refused(limit: &str, message: &str) {
    let out = with_limit(limit);
    let (status, got) = accepted(&out);
    assert_eq!(status, "False", "{got}");
    assert!(got.contains(message), "message {got:?} lacks {message:?}");
}

#[test]
fn both_request_and_response_cost_is_refused() {
    refused(
        r#"{rates: [{limit: 5, window: 1s}], cost: {request: "1", response: "2"}}"#,
        "limits.tokens.cost: set request or response, not both",
    );
}

#[test]
fn an_empty_cost_is_refused() {
    refused(
        "{rates: [{limit: 5, window: 1s}], cost: {}}",
        "limits.tokens.cost: set request (CEL on the request) or response (CEL on the response)",
    );
}

#[test]
fn a_request_cost_reading_the_response_is_refused() {
    refused(
        r#"{rates: [{limit: 5, window: 1s}], cost: {request: "int(response.headers['x'])"}}"#,
        "limits.tokens.cost.request: CEL expression `int(response.headers['x'])` uses unknown variable `response`",
    );
}

#[test]
fn a_response_cost_reading_the_request_is_refused() {
    refused(
        r#"{rates: [{limit: 5, window: 1s}], cost: {response: "int(request.headers['x'])"}}"#,
        "limits.tokens.cost.response: CEL expression `int(request.headers['x'])` uses unknown variable `request` (a response expression knows only: response)",
    );
}

#[test]
fn a_cost_that_does_not_parse_is_refused() {
    refused(
        r#"{rates: [{limit: 5, window: 1s}], cost: {response: "int(response.headers["}}"#,
        "limits.tokens.cost.response: invalid CEL expression",
    );
    refused(
        r#"{rates: [{limit: 5, window: 1s}], cost: {request: "sise(request.headers)"}}"#,
        "limits.tokens.cost.request: CEL expression `sise(request.headers)` calls unknown function `sise`",
    );
}

#[test]
fn an_unknown_mode_is_refused_when_loading() {
    let yaml = r#"
apiVersion: tollgate.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: tokens, namespace: pol}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: HTTPRoute, name: llm}]
  limits: {tokens: {rates: [{limit: 5, window: 1s}], mode: DryRun}}
"#;
    let Err(err) = tollgate::compile::inputs_from_yaml(yaml, now()) else {
        panic!("an unknown mode does not load");
    };
    let err = err.to_string();
    assert!(
        err.contains("unknown variant `DryRun`, expected `Enforce` or `Shadow`"),
        "{err}"
    );
}

#[test]
fn a_body_cost_and_its_cap_reach_the_table() {
    let out = with_limit(
        r#"
      rates: [{limit: 1000, window: 1m}]
      cost: {response: "int(response.body.usage.total_tokens)", maxBodyBytes: 65536}"#,
    );
    assert_eq!(accepted(&out).0, "True", "{}", accepted(&out).1);
    let l = table_limit(&out);
    assert_eq!(
        l.cost,
        Some(Cost::Response(
            "int(response.body.usage.total_tokens)".into()
        ))
    );
    assert_eq!(l.cost_max_body_bytes, Some(65_536));
    // Without maxBodyBytes the proxy's default applies: nothing in the table.
    let out = with_limit(
        r#"{rates: [{limit: 1000, window: 1m}], cost: {response: "int(response.body.usage.total_tokens)"}}"#,
    );
    assert_eq!(table_limit(&out).cost_max_body_bytes, None);
    let json = serde_json::to_string(&table_limit(&out)).unwrap();
    assert!(!json.contains("costMaxBodyBytes"), "{json}");
}

#[test]
fn a_body_cap_without_a_response_cost_or_out_of_range_is_refused() {
    refused(
        r#"{rates: [{limit: 5, window: 1s}], cost: {request: "1", maxBodyBytes: 1024}}"#,
        "limits.tokens.cost.maxBodyBytes: only with cost.response (the body read is the response's)",
    );
    refused(
        r#"{rates: [{limit: 5, window: 1s}], cost: {response: "int(response.body.n)", maxBodyBytes: 0}}"#,
        "limits.tokens.cost.maxBodyBytes: 0 is out of range (1 to 16777216)",
    );
    refused(
        r#"{rates: [{limit: 5, window: 1s}], cost: {response: "int(response.body.n)", maxBodyBytes: 16777217}}"#,
        "limits.tokens.cost.maxBodyBytes: 16777217 is out of range (1 to 16777216)",
    );
}

#[test]
fn a_request_cost_reading_the_response_body_is_refused_with_where_it_belongs() {
    refused(
        r#"{rates: [{limit: 5, window: 1s}], cost: {request: "int(response.body.usage.total_tokens)"}}"#,
        "limits.tokens.cost.request: CEL expression `int(response.body.usage.total_tokens)` uses unknown variable `response` (known: request, source, auth); the response (its status, headers and body) is read by cost.response, counted after the response",
    );
}
