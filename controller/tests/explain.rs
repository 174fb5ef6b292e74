//! `tollgate explain DIR` on the fixture of tests/fixtures/explain: the exact text for a
//! match, a near miss, a denied credential and a limited counter; the JSON object scripts
//! read; and the errors for what cannot be explained.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/explain")
}

/// Runs `tollgate explain` on the fixture: (exit code, stdout, stderr).
fn explain(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("explain")
        .arg(fixture())
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn text(args: &[&str]) -> String {
    let (code, out, err) = explain(args);
    assert_eq!(code, 0, "{err}");
    out
}

#[test]
fn a_match_with_a_valid_credential() {
    let out = text(&[
        "--host",
        "shop.example.com",
        "--path",
        "/api/orders",
        "-H",
        "x-env: prod",
        "-H",
        "X-API-Key: alice-key",
    ]);
    assert_eq!(
        out,
        "Gateway default/shop
listener http (port 8080), virtual host *
route default/api rule 0 (prod)
near misses:
  default/api rule 1 (writes): method GET is not POST
policies:
  AuthPolicy default/api-keys: allowed
backends:
  default/api:80 (weight 1): 10.0.0.1:9080, 10.0.0.2:9080
answer: forwarded to default/api:80
"
    );
}

#[test]
fn a_near_miss_says_which_predicate_failed() {
    let out = text(&[
        "--host",
        "shop.example.com",
        "--path",
        "/api/orders",
        "-H",
        "x-env: staging",
    ]);
    assert_eq!(
        out,
        "Gateway default/shop
listener http (port 8080), virtual host *
route default/web rule 0
near misses:
  default/api rule 1 (writes): method GET is not POST
  default/api rule 0 (prod): header x-env: \"staging\" is not Exact \"prod\"
policies:
  RateLimitPolicy default/web-budget limit per-client: counts
backends:
  default/web:80 (weight 1): no endpoints
answer: 503: no endpoints
"
    );
}

#[test]
fn a_missing_credential_is_denied_by_the_auth_policy() {
    let out = text(&[
        "--host",
        "shop.example.com",
        "--method",
        "POST",
        "--path",
        "/api/orders",
        "-H",
        "X-API-Key: mallory-key",
    ]);
    assert_eq!(
        out,
        "Gateway default/shop
listener http (port 8080), virtual host *
route default/api rule 1 (writes)
filters:
  RequestHeaderModifier {\"set\":[[\"x-write\",\"yes\"]]}
policies:
  AuthPolicy default/api-keys: denied 401
backends:
  default/api:80 (weight 1): 10.0.0.1:9080, 10.0.0.2:9080
answer: 401: not authenticated
"
    );
}

#[test]
fn a_cost_above_the_limit_is_limited() {
    let out = text(&[
        "--host",
        "shop.example.com:8080",
        "--path",
        "/home",
        "-H",
        "x-cost: 11",
    ]);
    assert_eq!(
        out,
        "Gateway default/shop
listener http (port 8080), virtual host *
route default/web rule 0
near misses:
  default/api rule 1 (writes): path /home is not under PathPrefix /api; method GET is not POST
  default/api rule 0 (prod): path /home is not under PathPrefix /api; header x-env is missing (Exact \"prod\")
policies:
  RateLimitPolicy default/web-budget limit per-client: limited
backends:
  default/web:80 (weight 1): no endpoints
answer: 429: rate limited
"
    );
}

#[test]
fn a_host_no_virtual_host_takes_is_a_404() {
    let out = text(&["--host", "admin.example.com"]);
    assert_eq!(
        out,
        "Gateway default/shop
listener admin (port 8080), virtual host (none)
route (none)
answer: 404: no virtual host of the listener takes \"admin.example.com\"
"
    );
}

#[test]
fn json_carries_listener_route_rule_policies_and_backends() {
    let (code, out, err) = explain(&[
        "--host",
        "shop.example.com",
        "--path",
        "/api/x",
        "-H",
        "x-env: prod",
        "-o",
        "json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["listener"],
        serde_json::json!({"name": "http", "port": 8080, "virtual_host": "*"})
    );
    assert_eq!(v["route"], "default/api");
    assert_eq!(v["rule"], serde_json::json!({"index": 0, "name": "prod"}));
    assert_eq!(
        v["policies"],
        serde_json::json!([{"kind": "AuthPolicy", "name": "default/api-keys", "outcome": "denied 401"}])
    );
    assert_eq!(v["backends"][0]["name"], "default/api:80");
    assert_eq!(
        v["backends"][0]["endpoints"],
        serde_json::json!(["10.0.0.1:9080", "10.0.0.2:9080"])
    );
    assert_eq!(v["answer"], "401: not authenticated");

    let (_, out, _) = explain(&["--host", "admin.example.com", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["route"].is_null() && v["rule"].is_null(), "{v}");
}

#[test]
fn what_cannot_be_explained_is_an_error_naming_it() {
    for (args, expect) in [
        (
            &["--host", "x", "--listener", "nope"][..],
            "no listener \"nope\" in the route table",
        ),
        (
            &["--host", "x", "-H", "bad header: x"][..],
            "header name \"bad header\"",
        ),
        (
            &["--host", "x", "-H", "no-colon"][..],
            "expected name:value",
        ),
        (
            &["--host", "x", "--gateway", "default/other"][..],
            "no served Gateway default/other",
        ),
    ] {
        let (code, out, err) = explain(args);
        assert_eq!(code, 2, "{args:?}: {out}");
        assert!(err.contains(expect), "{args:?}: {err}");
    }
}
