//! CachePolicy: the issue's shape compiles into each rule's `cache` in the table, a rule's
//! policy over its route's over its Gateway's, conflicts, targets not found, and every
//! invalid field with its message (an invalid policy caches nothing).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod argocd_support;
mod compile_support;

use compile_support::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use tollgate::compile::Output;
use tollgate_api::ObjectKey;
use tollgate_api::cache::{CacheRule, QueryKey};

/// A Gateway `edge` and an HTTPRoute `catalog` with a rule `search` (/search) and an
/// unnamed one (/).
const INPUTS: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: default, generation: 1}
spec:
  gatewayClassName: tollgate
  listeners:
  - {name: web, protocol: HTTP, port: 80}
---
apiVersion: v1
kind: Service
metadata: {name: echo, namespace: default}
spec: {ports: [{port: 80}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: catalog, namespace: default}
spec:
  parentRefs: [{name: edge}]
  rules:
  - name: search
    matches: [{path: {type: PathPrefix, value: /search}}]
    backendRefs: [{name: echo, port: 80}]
  - backendRefs: [{name: echo, port: 80}]
"#;

const GW: &str = "{group: gateway.networking.k8s.io, kind: Gateway, name: edge}";
const ROUTE: &str = "{group: gateway.networking.k8s.io, kind: HTTPRoute, name: catalog}";
const RULE: &str =
    "{group: gateway.networking.k8s.io, kind: HTTPRoute, name: catalog, sectionName: search}";

fn policy(name: &str, created: &str, target: &str, body: &str) -> String {
    format!(
        "---\napiVersion: tollgate.dev/v1alpha1\nkind: CachePolicy\nmetadata: {{name: {name}, \
         namespace: default, generation: 2, creationTimestamp: \"{created}\"}}\nspec:\n  \
         targetRefs: [{target}]\n{body}\n"
    )
}

fn compiled(policies: &[String]) -> Output {
    run(&[], &format!("{INPUTS}{}", policies.concat()))
}

fn conds<'a>(out: &'a Output, name: &str) -> &'a [Condition] {
    &out.cache_policies[&ObjectKey::new("default", name)].conditions
}

/// Each rule of `catalog` with the policy its cache rule comes from.
fn rules(out: &Output) -> Vec<(u32, Option<String>)> {
    let mut v: Vec<_> = table(out, "default", "edge")
        .ports
        .iter()
        .flat_map(|p| &p.listeners)
        .flat_map(|l| &l.virtual_hosts)
        .flat_map(|h| h.routes.iter())
        .map(|r| {
            (
                r.rule_index,
                r.cache.as_ref().map(|c| c.policy.name.clone()),
            )
        })
        .collect();
    v.sort();
    v.dedup();
    v
}

fn rule_of(out: &Output, index: u32) -> CacheRule {
    table(out, "default", "edge")
        .ports
        .iter()
        .flat_map(|p| &p.listeners)
        .flat_map(|l| &l.virtual_hosts)
        .flat_map(|h| h.routes.iter())
        .find(|r| r.rule_index == index)
        .and_then(|r| r.cache.as_deref().cloned())
        .unwrap()
}

#[test]
fn the_issues_shape_compiles_as_written() {
    let out = compiled(&[policy(
        "catalog",
        "2026-01-01T00:00:00Z",
        ROUTE,
        "  defaultTTL: 60s\n  maxTTL: 1h\n  staleWhileRevalidate: 30s\n  staleIfError: 5m\n  \
         maxEntryBytes: 1048576\n  key: {query: {exclude: [utm_source]}, expressions: [\"auth.identity.sub\"]}",
    )]);
    assert_cond(conds(&out, "catalog"), "Accepted", "True", "Accepted");
    assert_cond(conds(&out, "catalog"), "Enforced", "True", "Enforced");
    let want = CacheRule {
        policy: ObjectKey::new("default", "catalog"),
        default_ttl_ms: Some(60_000),
        max_ttl_ms: Some(3_600_000),
        stale_while_revalidate_ms: 30_000,
        stale_if_error_ms: 300_000,
        max_entry_bytes: 1_048_576,
        query: QueryKey::Exclude(vec!["utm_source".into()]),
        expressions: vec!["auth.identity.sub".into()],
        methods: vec!["GET".into(), "HEAD".into()],
        store_set_cookie: false,
    };
    assert_eq!(rule_of(&out, 0), want);
    assert_eq!(rule_of(&out, 1), want);
}

#[test]
fn a_rules_policy_wins_over_its_routes_over_its_gateways() {
    let out = compiled(&[
        policy("gw", "2026-01-01T00:00:00Z", GW, "  defaultTTL: 1s"),
        policy("rule", "2026-01-03T00:00:00Z", RULE, "  defaultTTL: 3s"),
    ]);
    assert_eq!(
        rules(&out),
        vec![(0, Some("rule".into())), (1, Some("gw".into()))]
    );
    let out = compiled(&[
        policy("gw", "2026-01-01T00:00:00Z", GW, "  defaultTTL: 1s"),
        policy("route", "2026-01-02T00:00:00Z", ROUTE, "  defaultTTL: 2s"),
    ]);
    assert_eq!(
        rules(&out),
        vec![(0, Some("route".into())), (1, Some("route".into()))]
    );
    // Without any policy, nothing is cached.
    assert_eq!(rules(&compiled(&[])), vec![(0, None), (1, None)]);
}

#[test]
fn the_older_policy_holds_a_target_and_missing_targets_are_reported() {
    let out = compiled(&[
        policy("old", "2026-01-01T00:00:00Z", ROUTE, "  defaultTTL: 1s"),
        policy("new", "2026-01-02T00:00:00Z", ROUTE, "  defaultTTL: 2s"),
        policy(
            "lost",
            "2026-01-01T00:00:00Z",
            "{group: gateway.networking.k8s.io, kind: HTTPRoute, name: nope}",
            "  defaultTTL: 1s",
        ),
    ]);
    assert_cond(conds(&out, "old"), "Accepted", "True", "Accepted");
    assert_cond(conds(&out, "new"), "Accepted", "False", "Conflicted");
    assert_cond(conds(&out, "lost"), "Accepted", "False", "TargetNotFound");
    assert_eq!(
        rules(&out),
        vec![(0, Some("old".into())), (1, Some("old".into()))]
    );
}

#[test]
fn invalid_fields_are_refused_with_their_message_and_cache_nothing() {
    for (body, msg) in [
        ("  defaultTTL: soon", "spec.defaultTTL"),
        (
            "  key: {query: {include: [a], exclude: [b]}}",
            "exactly one of include and exclude",
        ),
        (
            "  key: {expressions: [\"auth.identity.\"]}",
            "spec.key.expressions[0]",
        ),
        ("  methods: [POST]", "spec.methods"),
        (
            "  maxEntryBytes: 67108865",
            "spec.maxEntryBytes 67108865 is out of range (1 to 67108864, 64 MiB)",
        ),
        ("  maxEntryBytes: 0", "spec.maxEntryBytes 0 is out of range"),
    ] {
        let out = compiled(&[policy("bad", "2026-01-01T00:00:00Z", ROUTE, body)]);
        let c = cond(conds(&out, "bad"), "Accepted");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "Invalid"),
            "{body}"
        );
        assert!(c.message.contains(msg), "{body}: {}", c.message);
        assert_eq!(rules(&out), vec![(0, None), (1, None)], "{body}");
    }
}

#[test]
fn argo_cds_health_check_reads_a_cache_policys_status() {
    // The status the compiler writes, read by the chart's Argo CD health check
    // (charts/tollgate/argocd) as Argo CD would run it.
    let out = compiled(&[
        policy("good", "2026-01-01T00:00:00Z", ROUTE, ""),
        policy("bad", "2026-01-01T00:00:00Z", ROUTE, "  maxEntryBytes: 0"),
        policy(
            "lost",
            "2026-01-01T00:00:00Z",
            "{group: gateway.networking.k8s.io, kind: HTTPRoute, name: nowhere}",
            "",
        ),
    ]);
    let health = |name: &str| {
        let status = &out.cache_policies[&ObjectKey::new("default", name)];
        let obj = serde_json::json!({
            "apiVersion": "tollgate.dev/v1alpha1", "kind": "CachePolicy",
            "metadata": {"name": name, "namespace": "default", "generation": 2},
            "spec": {"targetRefs": [
                {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "catalog"}]},
            "status": serde_json::to_value(status).unwrap(),
        });
        argocd_support::health(&argocd_support::policy_script(), &obj)
    };
    let (s, m) = health("good");
    assert_eq!(s, "Healthy", "{m}");
    assert!(m.starts_with("CachePolicy is accepted"), "{m}");
    let (s, m) = health("bad");
    assert_eq!(s, "Degraded", "{m}");
    assert!(m.starts_with("Invalid: spec.maxEntryBytes 0"), "{m}");
    let (s, m) = health("lost");
    assert_eq!(s, "Degraded", "{m}");
    assert!(m.starts_with("TargetNotFound: "), "{m}");
}
