//! RateLimitPolicy and AuthPolicy: attachment, reasons, hierarchy, effective tables.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod compile_support;

use compile_support::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use tollgate::compile::Output;
use tollgate_api::policy::{Algorithm, Credentials, Method, PolicySet, Rate};
use tollgate_api::{ObjectKey, RouteTable};

fn out() -> Output {
    run(&["policies"], "")
}

fn rlp<'a>(out: &'a Output, name: &str) -> &'a [Condition] {
    &out.rate_limit_policies[&ObjectKey::new("pol", name)].conditions
}

fn ap<'a>(out: &'a Output, name: &str) -> &'a [Condition] {
    &out.auth_policies[&ObjectKey::new("pol", name)].conditions
}

/// The policy set of the first route of `host` on `listener`.
fn policy_of<'a>(
    t: &'a RouteTable,
    listener: &str,
    host: &str,
    path: &str,
) -> (&'a str, &'a PolicySet) {
    let r = vhost(table_listener(t, listener), host)
        .routes
        .iter()
        .find(|r| matches!(&r.matcher.path, tollgate_api::PathMatch::PathPrefix(p) if p == path))
        .unwrap_or_else(|| panic!("no route {path} on {host}"));
    let key = r
        .policy
        .as_deref()
        .unwrap_or_else(|| panic!("no policy on {host}{path}"));
    (key, &t.policies[key])
}

fn limit_names(set: &PolicySet) -> Vec<&str> {
    set.rate_limits.iter().map(|l| l.id.as_str()).collect()
}

#[test]
fn accepted_and_enforced_with_observed_generation() {
    let out = out();
    let c = rlp(&out, "gw-defaults");
    assert_cond(c, "Accepted", "True", "Accepted");
    assert_cond(c, "Enforced", "True", "Enforced");
    assert_eq!(cond(c, "Accepted").observed_generation, Some(2));
    let s = &out.rate_limit_policies[&ObjectKey::new("pol", "gw-defaults")];
    assert_eq!(s.observed_generation, Some(2));
    assert_eq!(s.ancestors.len(), 1);
    assert_eq!(s.ancestors[0].ancestor_ref.name, "gw");
    assert_eq!(
        s.ancestors[0].controller_name,
        "tollgate.dev/gateway-controller"
    );
    assert_cond(&s.ancestors[0].conditions, "Enforced", "True", "Enforced");
}

#[test]
fn target_not_found() {
    let out = out();
    let c = rlp(&out, "missing-target");
    assert_cond(c, "Accepted", "False", "TargetNotFound");
    let m = &cond(c, "Accepted").message;
    assert!(
        m.contains("HTTPRoute nope") && m.contains("section no-such-rule"),
        "{m}"
    );
    assert!(
        c.iter().all(|c| c.type_ != "Enforced"),
        "no Enforced when not accepted"
    );
}

#[test]
fn invalid_cel_and_window_and_methods() {
    let out = out();
    for (c, needle) in [
        (rlp(&out, "bad-cel"), "invalid CEL expression"),
        (rlp(&out, "bad-window"), "window \"1d\""),
        (ap(&out, "two-methods"), "exactly one of apiKey, basic, jwt"),
        (ap(&out, "no-creds"), "Secret pol/missing not found"),
    ] {
        assert_cond(c, "Accepted", "False", "Invalid");
        assert_cond(c, "Stalled", "True", "Invalid");
        let m = &cond(c, "Accepted").message;
        assert!(m.contains(needle), "{m}");
    }
}

/// Fail closed: the invalid, never valid AuthPolicies on vault close it (500), and say so.
/// The older one holds the route (the newer one lost it, as a valid one would).
#[test]
fn never_valid_auth_policies_close_their_route() {
    let out = out();
    let t = table(&out, "pol", "gw");
    let r = &vhost(table_listener(t, "http"), "vault.test").routes[0];
    let key = r.policy.as_deref().expect("vault names its closure");
    assert!(!t.policies.contains_key(key));
    assert_eq!(t.closed[key].by, [ObjectKey::new("pol", "no-creds")]);
    assert_eq!(t.closed.len(), 1, "{:?}", t.closed);
    for name in ["no-creds", "two-methods"] {
        let m = &cond(ap(&out, name), "Accepted").message;
        assert!(m.contains("answer 500 until it is fixed"), "{m}");
    }
}

#[test]
fn newer_policy_on_the_same_target_is_conflicted() {
    let out = out();
    let c = rlp(&out, "shop-limits-2");
    assert_cond(c, "Accepted", "False", "Conflicted");
    assert!(cond(c, "Accepted").message.contains("pol/shop-limits"));
    assert_cond(rlp(&out, "shop-limits"), "Accepted", "True", "Accepted");
}

#[test]
fn gateway_merge_defaults_fill_names_the_route_policy_lacks() {
    let out = out();
    let t = table(&out, "pol", "gw");
    let (key, set) = policy_of(t, "http", "shop.test", "/");
    assert_eq!(key, "pol/shop/0");
    assert_eq!(
        limit_names(set),
        [
            "pol/gw-defaults/global",
            "pol/shop-limits/per-ip",
            "pol/shop-limits/per-user"
        ]
    );
    let per_user = &set.rate_limits[2];
    assert_eq!(per_user.algorithm, Algorithm::TokenBucket);
    assert_eq!(
        per_user.rates,
        [Rate {
            limit: 100,
            window_ms: 60_000
        }]
    );
    assert_eq!(per_user.counters, ["auth.identity.sub"]);
    // The policy-level `when` comes first, then the limit's own.
    assert_eq!(
        per_user.when,
        ["request.host == 'shop.test'", "request.method == 'POST'"]
    );
    assert_eq!(
        set.rate_limits[1].rates,
        [Rate {
            limit: 10,
            window_ms: 1000
        }]
    );
    assert!(set.auth.is_none(), "invalid AuthPolicies enforce nothing");
}

#[test]
fn rule_policy_replaces_route_policy_atomically() {
    let out = out();
    let t = table(&out, "pol", "gw");
    let (_, set) = policy_of(t, "http", "shop.test", "/checkout");
    assert_eq!(
        limit_names(set),
        [
            "pol/checkout-limit/checkout",
            "pol/gw-defaults/global",
            "pol/gw-defaults/per-ip"
        ]
    );
    assert_eq!(set.rate_limits[0].algorithm, Algorithm::FixedWindow);
    assert_cond(rlp(&out, "checkout-limit"), "Enforced", "True", "Enforced");
}

#[test]
fn gateway_defaults_apply_where_no_route_policy_is_valid() {
    let out = out();
    let t = table(&out, "pol", "gw");
    let (_, set) = policy_of(t, "http", "admin.test", "/");
    assert_eq!(
        limit_names(set),
        ["pol/gw-defaults/global", "pol/gw-defaults/per-ip"]
    );
    assert_eq!(
        set.rate_limits[1].rates,
        [Rate {
            limit: 50,
            window_ms: 10_000
        }]
    );
}

#[test]
fn listener_overrides_win_and_key_the_set_per_listener() {
    let out = out();
    let t = table(&out, "pol", "gw");
    let (key, set) = policy_of(t, "internal", "shop.test", "/");
    assert_eq!(key, "pol/shop/0@internal");
    let auth = set.auth.as_ref().unwrap();
    assert_eq!(auth.sources, [ObjectKey::new("pol", "internal-only")]);
    assert!(auth.authentication.is_empty());
    assert_eq!(auth.authorization.len(), 1);
    assert_eq!(
        auth.authorization[0].predicate,
        "source.address.startsWith('10.')"
    );
    assert_cond(ap(&out, "internal-only"), "Enforced", "True", "Enforced");
}

#[test]
fn api_keys_are_digests_of_labelled_selected_secrets() {
    let out = out();
    let t = table(&out, "pol", "gw");
    let (_, set) = policy_of(t, "http", "admin.test", "/");
    let auth = set.auth.as_ref().unwrap();
    let names: Vec<&str> = auth
        .authentication
        .iter()
        .map(|m| m.name.as_str())
        .collect();
    assert_eq!(names, ["keys", "users"]);
    let keys = &auth.authentication[0];
    assert_eq!(
        keys.credentials,
        Credentials::CustomHeader {
            name: "x-api-key".into()
        }
    );
    let Method::ApiKey(k) = &keys.method else {
        panic!("{:?}", keys.method)
    };
    assert_eq!(k.keys.len(), 1, "only key-alice is labelled and selected");
    assert_eq!(
        k.keys[0].sha256,
        tollgate::compile::policies::auth::sha256_hex(b"alice-secret-key")
    );
    assert_eq!(k.keys[0].identity["metadata"]["name"], "key-alice");
    assert_eq!(
        k.keys[0].identity["metadata"]["annotations"]["owner"],
        "alice"
    );
    let json = serde_json::to_string(t).unwrap();
    assert!(
        !json.contains("alice-secret-key"),
        "the key itself never reaches the table"
    );
    let users = &auth.authentication[1];
    assert_eq!(
        users.credentials,
        Credentials::AuthorizationHeader {
            prefix: "Bearer".into()
        }
    );
    assert!(
        matches!(&users.method, Method::Jwt(j) if j.issuer == "https://id.test" && j.audiences == ["admin"])
    );
    assert_eq!(
        auth.success_headers,
        [("x-user".to_owned(), "auth.identity.sub".to_owned())]
    );
    assert_eq!(auth.unauthenticated.code, 401);
    assert_eq!(
        auth.unauthenticated.message.as_deref(),
        Some("who are you?")
    );
    assert_eq!(auth.unauthorized.code, 403);
}

#[test]
fn routes_and_gateways_show_the_policies_affecting_them() {
    let out = out();
    let c = parent_conds(&out, "pol", "admin", 0);
    assert_cond(c, "tollgate.dev/AuthPolicyAffected", "True", "Accepted");
    assert!(
        cond(c, "tollgate.dev/AuthPolicyAffected")
            .message
            .contains("pol/admin-auth")
    );
    let m = &cond(c, "tollgate.dev/RateLimitPolicyAffected").message;
    assert!(m.contains("pol/gw-defaults"), "{m}");
    let g = gateway_conds(&out, "pol", "gw");
    let m = &cond(g, "tollgate.dev/RateLimitPolicyAffected").message;
    assert!(
        m.contains("pol/shop-limits") && m.contains("pol/checkout-limit"),
        "{m}"
    );
}

#[test]
fn rejected_policies_are_rejections() {
    let out = out();
    let rej: Vec<String> = out
        .rejections()
        .iter()
        .filter(|r| r.kind.ends_with("Policy"))
        .map(|r| format!("{} {} {}", r.kind, r.key, r.reason))
        .collect();
    assert_eq!(
        rej,
        [
            "AuthPolicy pol/no-creds Invalid",
            "AuthPolicy pol/two-methods Invalid",
            "RateLimitPolicy pol/bad-cel Invalid",
            "RateLimitPolicy pol/bad-window Invalid",
            "RateLimitPolicy pol/missing-target TargetNotFound",
            "RateLimitPolicy pol/shop-limits-2 Conflicted",
        ]
    );
}

#[test]
fn routes_without_policies_carry_no_policy_key() {
    let out = run(&["backends"], "");
    for t in out.tables.values() {
        assert!(t.policies.is_empty());
        for l in t.ports.iter().flat_map(|p| &p.listeners) {
            for v in &l.virtual_hosts {
                assert!(v.routes.iter().all(|r| r.policy.is_none()));
            }
        }
    }
}

#[test]
fn atomic_defaults_replaced_everywhere_are_overridden() {
    let out = run(
        &["policies"],
        r#"
apiVersion: tollgate.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: internal-defaults, namespace: pol, generation: 1}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: gw, sectionName: internal}]
  limits: {internal: {rates: [{limit: 7, window: 1s}]}}
"#,
    );
    let c = rlp(&out, "internal-defaults");
    assert_cond(c, "Accepted", "True", "Accepted");
    assert_cond(c, "Enforced", "False", "Overridden");
    let t = table(&out, "pol", "gw");
    let (_, set) = policy_of(t, "internal", "shop.test", "/");
    assert!(
        !limit_names(set)
            .iter()
            .any(|n| n.contains("internal-defaults"))
    );
}

#[test]
fn policies_on_another_controllers_gateway_get_no_status_from_us() {
    let out = run(
        &["policies"],
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: theirs, namespace: pol}
spec:
  gatewayClassName: someone-else
  listeners: [{name: http, port: 80, protocol: HTTP}]
---
apiVersion: tollgate.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: on-theirs, namespace: pol}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: theirs}]
  limits: {a: {rates: [{limit: 1, window: 1s}]}}
"#,
    );
    assert!(
        !out.rate_limit_policies
            .contains_key(&ObjectKey::new("pol", "on-theirs"))
    );
    assert!(
        out.rate_limit_policies
            .contains_key(&ObjectKey::new("pol", "missing-target"))
    );
}

#[test]
fn x509_authentication_compiles_to_the_verified_client_certificate_method() {
    let out = run(
        &["policies"],
        r#"
apiVersion: tollgate.dev/v1alpha1
kind: AuthPolicy
metadata: {name: devices, namespace: pol}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: HTTPRoute, name: shop, sectionName: checkout}]
  rules:
    authentication:
      devices: {x509: {}}
    response:
      success:
        headers: {x-device: {expression: auth.identity.cn}}
"#,
    );
    assert_cond(ap(&out, "devices"), "Accepted", "True", "Accepted");
    let t = table(&out, "pol", "gw");
    let (_, set) = policy_of(t, "http", "shop.test", "/checkout");
    let auth = set.auth.as_ref().unwrap();
    assert_eq!(auth.authentication.len(), 1);
    assert_eq!(auth.authentication[0].method, Method::X509);
}

/// Proxies count each decision under the policy and rule that took it
/// (`tollgate_policy_decisions_total`), so every rule that decides carries its policy into
/// the table, through merges too: a Gateway-wide `merge` default adds its method and rule
/// to the route's own policy's, each still naming where it came from.
#[test]
fn every_deciding_rule_names_the_policy_that_defined_it() {
    let out = run(
        &["policies"],
        r#"
apiVersion: tollgate.dev/v1alpha1
kind: AuthPolicy
metadata: {name: gw-auth, namespace: pol}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: gw}]
  defaults:
    strategy: merge
    rules:
      authentication:
        sso: {jwt: {issuer: "https://sso.test", jwks: '{"keys": []}'}}
      authorization:
        no-delete: {predicate: "request.method != 'DELETE'"}
"#,
    );
    assert_cond(ap(&out, "gw-auth"), "Enforced", "True", "Enforced");
    let t = table(&out, "pol", "gw");
    let (_, set) = policy_of(t, "http", "admin.test", "/");
    let auth = set.auth.as_ref().unwrap();
    let admin = ObjectKey::new("pol", "admin-auth");
    let gw = ObjectKey::new("pol", "gw-auth");
    assert_eq!(auth.sources, [admin.clone(), gw.clone()]);
    let methods: Vec<(&str, &ObjectKey)> = auth
        .authentication
        .iter()
        .map(|m| (m.name.as_str(), &m.policy))
        .collect();
    assert_eq!(methods, [("keys", &admin), ("sso", &gw), ("users", &admin)]);
    let rules: Vec<(&str, &ObjectKey)> = auth
        .authorization
        .iter()
        .map(|r| (r.name.as_str(), &r.policy))
        .collect();
    assert_eq!(rules, [("admins-only", &admin), ("no-delete", &gw)]);
    // A limit's id is `namespace/policy/limit`: the policy and the limit's name.
    assert_eq!(
        limit_names(set),
        ["pol/gw-defaults/global", "pol/gw-defaults/per-ip"]
    );
    // The table says so on the wire.
    let json = serde_json::to_value(&auth.authentication[1]).unwrap();
    assert_eq!(
        json["policy"],
        serde_json::json!({"namespace": "pol", "name": "gw-auth"})
    );
}
