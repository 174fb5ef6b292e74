//! Policies fail closed: an invalid policy keeps its last valid version (passed in as
//! `Inputs::last_valid`); an AuthPolicy never valid closes its targets (500); a
//! RateLimitPolicy never valid limits nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod compile_support;

use compile_support::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use tollgate::compile::{Inputs, Output, compile};
use tollgate_api::policy::{Closed, PolicySet};
use tollgate_api::{ObjectKey, RouteTable};

const BAD_CEL: &str = "request.method != ";

fn world() -> Inputs {
    inputs(&["fail_closed"], "")
}

fn ap<'a>(out: &'a Output, name: &str) -> &'a [Condition] {
    &out.auth_policies[&ObjectKey::new("fc", name)].conditions
}

fn rlp<'a>(out: &'a Output, name: &str) -> &'a [Condition] {
    &out.rate_limit_policies[&ObjectKey::new("fc", name)].conditions
}

/// The policy key of the only route of `host`.
fn key_of<'a>(t: &'a RouteTable, host: &str) -> Option<&'a str> {
    vhost(table_listener(t, "http"), host).routes[0]
        .policy
        .as_deref()
}

/// What the route of `host` is under: its policy set or its closure.
fn policy(out: &Output, host: &str) -> (Option<PolicySet>, Option<Closed>) {
    let t = table(out, "fc", "gw");
    match key_of(t, host) {
        None => (None, None),
        Some(k) => (t.policies.get(k).cloned(), t.closed.get(k).cloned()),
    }
}

/// Edits locked-auth's authorization predicate into `predicate`, at `generation`.
fn edit_auth(inputs: &mut Inputs, predicate: &str, generation: i64) {
    let p = &mut inputs.auth_policies[0];
    p.metadata.generation = Some(generation);
    let rules = p.spec.rules.as_mut().unwrap();
    rules.authorization.get_mut("no-delete").unwrap().predicate = Some(predicate.to_owned());
}

fn message<'a>(conds: &'a [Condition], type_: &str) -> &'a str {
    &cond(conds, type_).message
}

#[test]
fn invalid_auth_policy_keeps_its_last_valid_version() {
    let mut inputs = world();
    let valid = compile(&inputs);
    let (enforced, closed) = policy(&valid, "locked.test");
    let enforced = enforced.expect("locked-auth enforced on locked.test");
    assert!(closed.is_none());
    assert!(enforced.auth.is_some());

    // A typo in one predicate: the version compiled before stays enforced, unchanged.
    edit_auth(&mut inputs, BAD_CEL, 2);
    inputs.last_valid = valid.last_valid.clone();
    let kept = compile(&inputs);
    assert_eq!(policy(&kept, "locked.test"), (Some(enforced.clone()), None));
    let c = ap(&kept, "locked-auth");
    assert_cond(c, "Accepted", "False", "Invalid");
    assert_cond(c, "Stalled", "True", "Invalid");
    let m = message(c, "Accepted");
    assert!(m.contains("authorization.no-delete.predicate"), "{m}");
    assert!(
        m.contains("the last valid version (generation 1) stays enforced"),
        "{m}"
    );
    // Enforced as its last valid version, and said so per Gateway.
    assert_cond(c, "Enforced", "True", "Enforced");
    let s = &kept.auth_policies[&ObjectKey::new("fc", "locked-auth")];
    assert_eq!(s.observed_generation, Some(2));
    assert_eq!(s.ancestors.len(), 1);
    // The memory carries the valid version, not the typo, to the compile after.
    assert_eq!(
        kept.last_valid.auth_policies[&ObjectKey::new("fc", "locked-auth")]
            .metadata
            .generation,
        Some(1)
    );

    // Still invalid on the next compile: still the generation-1 rules.
    inputs.last_valid = kept.last_valid.clone();
    let again = compile(&inputs);
    assert_eq!(
        policy(&again, "locked.test"),
        (Some(enforced.clone()), None)
    );

    // Fixed as a new version: that one is enforced, and remembered.
    edit_auth(&mut inputs, "request.method != 'PUT'", 3);
    inputs.last_valid = again.last_valid.clone();
    let fixed = compile(&inputs);
    let (set, closed) = policy(&fixed, "locked.test");
    assert!(closed.is_none());
    let auth = set.unwrap().auth.unwrap();
    assert_eq!(auth.authorization[0].predicate, "request.method != 'PUT'");
    assert_cond(ap(&fixed, "locked-auth"), "Accepted", "True", "Accepted");
    assert_eq!(
        fixed.last_valid.auth_policies[&ObjectKey::new("fc", "locked-auth")]
            .metadata
            .generation,
        Some(3)
    );
}

#[test]
fn never_valid_auth_policy_closes_its_targets_only() {
    let mut inputs = world();
    edit_auth(&mut inputs, BAD_CEL, 1);
    let out = compile(&inputs);
    let t = table(&out, "fc", "gw");
    let key = key_of(t, "locked.test").expect("the closed route names its closure");
    assert_eq!(
        t.closed[key].by,
        [ObjectKey::new("fc", "locked-auth")],
        "{t:#?}"
    );
    assert!(!t.policies.contains_key(key), "closed, not a policy set");
    // Other routes are untouched.
    assert_eq!(key_of(t, "open.test"), None);
    let c = ap(&out, "locked-auth");
    assert_cond(c, "Accepted", "False", "Invalid");
    let m = message(c, "Accepted");
    assert!(m.contains("it was never valid"), "{m}");
    assert!(
        m.contains("the routes it targets answer 500 until it is fixed"),
        "{m}"
    );
    assert!(c.iter().all(|c| c.type_ != "Enforced"), "{c:#?}");
    // The route says which policy closes it.
    let route = &out.http_routes[&ObjectKey::new("fc", "locked")].parents[0].conditions;
    assert!(
        message(route, "tollgate.dev/AuthPolicyAffected").contains("fc/locked-auth"),
        "{route:#?}"
    );
    assert!(out.last_valid.auth_policies.is_empty());
}

/// What an invalid policy would enforce is unknown, so it closes the rule, unless a valid
/// atomic override from a less specific target replaces it whatever it says.
#[test]
fn an_atomic_override_above_replaces_an_invalid_policy() {
    let overrides = |strategy: &str| {
        format!(
            r#"apiVersion: tollgate.dev/v1alpha1
kind: AuthPolicy
metadata: {{name: gw-overrides, namespace: fc}}
spec:
  targetRefs: [{{group: gateway.networking.k8s.io, kind: Gateway, name: gw}}]
  overrides:
    strategy: {strategy}
    rules:
      authorization:
        internal-net: {{predicate: "source.address.startsWith('10.')"}}
"#
        )
    };
    let mut inputs = inputs(&["fail_closed"], &overrides("atomic"));
    edit_auth(&mut inputs, BAD_CEL, 1);
    let out = compile(&inputs);
    let (set, closed) = policy(&out, "locked.test");
    assert_eq!(closed, None);
    let auth = set.unwrap().auth.unwrap();
    assert_eq!(auth.sources, [ObjectKey::new("fc", "gw-overrides")]);

    // A merge override keeps the entries it does not name: unknown here, so closed.
    let mut inputs = compile_support::inputs(&["fail_closed"], &overrides("merge"));
    edit_auth(&mut inputs, BAD_CEL, 1);
    let out = compile(&inputs);
    let (set, closed) = policy(&out, "locked.test");
    assert_eq!(set, None);
    assert_eq!(closed.unwrap().by, [ObjectKey::new("fc", "locked-auth")]);
}

#[test]
fn a_policy_recreated_under_the_same_name_does_not_inherit_the_old_rules() {
    let mut inputs = world();
    let valid = compile(&inputs);
    edit_auth(&mut inputs, BAD_CEL, 1);
    inputs.auth_policies[0].metadata.uid = Some("22222222-2222-2222-2222-222222222222".into());
    inputs.last_valid = valid.last_valid;
    let out = compile(&inputs);
    let (set, closed) = policy(&out, "locked.test");
    assert_eq!(set, None);
    assert_eq!(closed.unwrap().by, [ObjectKey::new("fc", "locked-auth")]);
    assert!(message(ap(&out, "locked-auth"), "Accepted").contains("never valid"));
}

#[test]
fn a_last_valid_version_that_no_longer_compiles_closes_the_targets() {
    let mut inputs = world();
    // Introspection needs its credentials Secret: valid while it exists.
    let extra = r#"apiVersion: v1
kind: Secret
metadata: {name: introspect-creds, namespace: fc, labels: {tollgate.dev/credential: "true"}}
stringData: {clientID: gw, clientSecret: s3cret}
"#;
    inputs.extend(tollgate::compile::inputs_from_yaml(extra, now()).unwrap());
    let rules = inputs.auth_policies[0].spec.rules.as_mut().unwrap();
    let mut m = rules.authentication.remove("keys").unwrap();
    m.api_key = None;
    m.credentials = None;
    m.oauth2_introspection = Some(
        serde_json::from_value(serde_json::json!({
            "endpoint": "http://127.0.0.1:9/introspect",
            "credentialsRef": {"name": "introspect-creds"},
        }))
        .unwrap(),
    );
    rules.authentication.insert("tokens".into(), m);
    let valid = compile(&inputs);
    assert!(policy(&valid, "locked.test").0.is_some());

    // Now a typo, and the Secret the last valid version needs is gone too.
    edit_auth(&mut inputs, BAD_CEL, 2);
    inputs
        .secrets
        .retain(|s| s.metadata.name.as_deref() != Some("introspect-creds"));
    inputs.last_valid = valid.last_valid;
    let out = compile(&inputs);
    let (set, closed) = policy(&out, "locked.test");
    assert_eq!(set, None);
    assert!(closed.is_some());
    let m = message(ap(&out, "locked-auth"), "Accepted");
    assert!(
        m.contains("its last valid version (generation 1) no longer compiles either"),
        "{m}"
    );
    assert!(m.contains("answer 500 until it is fixed"), "{m}");
}

#[test]
fn rate_limit_policy_keeps_its_last_valid_version_but_never_valid_closes_nothing() {
    let mut inputs = world();
    let valid = compile(&inputs);
    let (limited, _) = policy(&valid, "limited.test");
    let limited = limited.expect("limited-rl enforced");
    assert_eq!(limited.rate_limits.len(), 1);

    let break_it = |inputs: &mut Inputs| {
        let p = &mut inputs.rate_limit_policies[0];
        p.metadata.generation = Some(2);
        let limits = p.spec.limits.as_mut().unwrap();
        limits.get_mut("per-ip").unwrap().rates[0].window = "1d".into();
    };
    break_it(&mut inputs);
    inputs.last_valid = valid.last_valid;
    let kept = compile(&inputs);
    assert_eq!(policy(&kept, "limited.test"), (Some(limited), None));
    let m = message(rlp(&kept, "limited-rl"), "Accepted");
    assert!(
        m.contains("the last valid version (generation 1) stays enforced"),
        "{m}"
    );

    // Never valid: the route serves without its limits, and is not closed.
    let mut fresh = world();
    break_it(&mut fresh);
    let out = compile(&fresh);
    assert_eq!(policy(&out, "limited.test"), (None, None));
    let c = rlp(&out, "limited-rl");
    assert_cond(c, "Accepted", "False", "Invalid");
    assert!(
        message(c, "Accepted").contains("so it enforces nothing until it is fixed"),
        "{c:#?}"
    );
}

/// `Inputs::last_valid` is input like any other: compiling the same inputs twice gives the
/// same output, and without it the compile is the one `tollgate validate` shows.
#[test]
fn last_valid_is_an_explicit_input() {
    let mut inputs = world();
    let valid = compile(&inputs);
    edit_auth(&mut inputs, BAD_CEL, 2);
    let without = compile(&inputs);
    inputs.last_valid = valid.last_valid;
    let with = compile(&inputs);
    assert_eq!(with, compile(&inputs));
    assert_ne!(
        policy(&with, "locked.test"),
        policy(&without, "locked.test")
    );
}
