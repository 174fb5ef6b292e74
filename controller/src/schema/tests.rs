//! One case per rule class, on the real CRDs.
#![allow(clippy::unwrap_used)]

use super::*;

fn check(yaml: &str) -> Vec<String> {
    let v: Value = serde_yaml_ng::from_str(yaml).unwrap();
    Schemas::shared()
        .check(&v)
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect()
}

const ROUTE: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: default}
spec:
  parentRefs: [{name: gw}]
  hostnames: [HOST]
  rules:
  - matches: [{path: {type: TYPE, value: VALUE}}]
    backendRefs: [{name: web, port: PORT}]
"#;

fn route(host: &str, ty: &str, value: &str, port: &str) -> String {
    ROUTE
        .replace("HOST", host)
        .replace("TYPE", ty)
        .replace("VALUE", value)
        .replace("PORT", port)
}

#[test]
fn a_valid_route_passes() {
    assert_eq!(
        check(&route("a.example.com", "PathPrefix", "/x", "80")),
        Vec::<String>::new()
    );
}

#[test]
fn type_enum_pattern_and_bounds_are_checked() {
    assert_eq!(
        check(&route("a.example.com", "PathPrefix", "/x", "eighty")),
        [
            "spec.rules[0].backendRefs[0].port: Invalid value: \"string\": spec.rules[0].backendRefs[0].port in body must be of type integer: \"string\""
        ]
    );
    let e = check(&route("a.example.com", "Prefix", "/x", "80"));
    assert!(
        e.iter().any(|e| e.starts_with(
            "spec.rules[0].matches[0].path.type: Unsupported value: \"Prefix\": supported values: \"Exact\", \"PathPrefix\", \"RegularExpression\""
        )),
        "{e:?}"
    );
    let e = check(&route("Bad_Host", "PathPrefix", "/x", "80"));
    assert!(
        e.iter().any(|e| e.starts_with(
            "spec.hostnames[0]: Invalid value: \"Bad_Host\": spec.hostnames[0] in body should match"
        )),
        "{e:?}"
    );
    let e = check(&route("a.example.com", "PathPrefix", "/x", "70000"));
    assert!(
        e.iter().any(|e| e == "spec.rules[0].backendRefs[0].port: Invalid value: 70000: spec.rules[0].backendRefs[0].port in body should be less than or equal to 65535"),
        "{e:?}"
    );
}

#[test]
fn cel_rules_are_evaluated() {
    // "value must be an absolute path and start with '/' when type one of ['Exact', 'PathPrefix']"
    let e = check(&route("a.example.com", "PathPrefix", "x", "80"));
    assert!(
        e.iter().any(|e| e.starts_with("spec.rules[0].matches[0].path: Invalid value: \"object\": value must be an absolute path")),
        "{e:?}"
    );
}

#[test]
fn required_fields_and_unknown_fields_are_checked() {
    let e = check(&route("a.example.com", "PathPrefix", "/x", "80").replace("{name: web, ", "{"));
    assert!(
        e.iter()
            .any(|e| e == "spec.rules[0].backendRefs[0].name: Required value"),
        "{e:?}"
    );
    let e = check(
        &route("a.example.com", "PathPrefix", "/x", "80")
            .replace("  - matches:", "  - typo_field: 1\n    matches:"),
    );
    assert_eq!(e, ["unknown field \"spec.rules[0].typo_field\""]);
    let e = check(
        r#"
apiVersion: tollgate.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: p, namespace: default}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: HTTPRoute, name: r}]
  limits:
    per-client:
      rates: [{limit: 10, window: 1m}]
      typo_field: true
"#,
    );
    assert_eq!(e, ["unknown field \"spec.limits.per-client.typo_field\""]);
}

#[test]
fn unknown_kinds_of_our_groups_are_named() {
    let e = check("apiVersion: tollgate.dev/v1alpha1\nkind: BackendPolicyX\nmetadata: {name: x}\n");
    assert_eq!(
        e,
        ["no matches for kind \"BackendPolicyX\" in version \"tollgate.dev/v1alpha1\""]
    );
    let e =
        check("apiVersion: gateway.networking.k8s.io/v9\nkind: TCPRoute\nmetadata: {name: x}\n");
    assert_eq!(
        e,
        ["no matches for kind \"TCPRoute\" in version \"gateway.networking.k8s.io/v9\""]
    );
    let other: Value = serde_yaml_ng::from_str("apiVersion: apps/v1\nkind: Deployment\n").unwrap();
    assert!(Schemas::shared().check(&other).is_none());
}

/// Every CEL rule of the CRDs parses, transition rules aside (they are skipped by design).
#[test]
fn every_rule_of_the_crds_compiles() {
    fn rules(n: &Value, out: &mut Vec<String>) {
        match n {
            Value::Object(m) => {
                for r in m
                    .get("x-kubernetes-validations")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    out.push(r["rule"].as_str().unwrap_or_default().to_owned());
                }
                m.values().for_each(|v| rules(v, out));
            }
            Value::Array(a) => a.iter().for_each(|v| rules(v, out)),
            _ => {}
        }
    }
    let mut all = Vec::new();
    for text in gateway_types::CRDS.iter().chain(OWN_CRDS) {
        rules(&serde_yaml_ng::from_str::<Value>(text).unwrap(), &mut all);
    }
    assert!(all.len() > 300, "{} rules", all.len());
    let failed: Vec<&String> = all
        .iter()
        .filter(|r| !r.contains("oldSelf") && cel::Program::compile(r).is_err())
        .collect();
    assert!(failed.is_empty(), "{failed:#?}");
}

#[test]
fn list_map_keys_are_unique() {
    let e = check(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: g, namespace: default}
spec:
  gatewayClassName: c
  listeners:
  - {name: http, port: 80, protocol: HTTP}
  - {name: http, port: 81, protocol: HTTP}
"#,
    );
    assert!(
        e.contains(
            &"spec.listeners[1]: Duplicate value: map[string]interface {}{\"name\":\"http\"}"
                .to_owned()
        ),
        "{e:?}"
    );
}
