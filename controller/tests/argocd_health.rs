//! The Argo CD health check of the chart (charts/tollgate/argocd/health-policy.lua) run by a
//! real Lua interpreter on objects captured from a real kube-apiserver (its health_test.yaml,
//! in Argo CD's own test format), on shapes the controller does not write today, and checked
//! to stay within Lua 5.1 (Argo CD's gopher-lua). k8s_kstatus.rs runs the same script on live
//! objects, next to kstatus.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod argocd_support;

use serde::Deserialize;
use serde_json::{Value, json};

use argocd_support::{argocd_dir, health, policy_script, to_lua};

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HealthTests {
    tests: Vec<HealthTest>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HealthTest {
    health_status: HealthStatus,
    input_path: String,
}

#[derive(Deserialize)]
struct HealthStatus {
    status: String,
    message: String,
}

fn yaml(path: &std::path::Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn captured_policies_get_the_health_their_test_file_names() {
    let dir = argocd_dir();
    let tests: HealthTests =
        serde_yaml_ng::from_str(&std::fs::read_to_string(dir.join("health_test.yaml")).unwrap())
            .unwrap();
    let mut failures = Vec::new();
    for t in &tests.tests {
        let obj = yaml(&dir.join(&t.input_path));
        let (status, message) = health(&policy_script(), &obj);
        let want = &t.health_status;
        if (status.as_str(), message.as_str()) != (want.status.as_str(), want.message.as_str()) {
            failures.push(format!(
                "{}: got {status}: {message:?}, want {}: {:?}",
                t.input_path, want.status, want.message
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // Every sample is a test case, and every status Argo CD is given appears.
    let mut samples: Vec<String> = std::fs::read_dir(dir.join("testdata"))
        .unwrap()
        .map(|e| format!("testdata/{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    samples.sort();
    let mut listed: Vec<String> = tests.tests.iter().map(|t| t.input_path.clone()).collect();
    listed.sort();
    assert_eq!(samples, listed);
    for s in ["Healthy", "Progressing", "Degraded"] {
        assert!(
            tests.tests.iter().any(|t| t.health_status.status == s),
            "{s}"
        );
    }
}

fn policy(status: Value) -> Value {
    json!({
        "apiVersion": "tollgate.dev/v1alpha1", "kind": "RateLimitPolicy",
        "metadata": {"name": "p", "namespace": "shop", "generation": 3},
        "spec": {"targetRefs": [
            {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gw"}]},
        "status": status,
    })
}

fn cond(t: &str, status: &str, reason: &str, message: &str) -> Value {
    json!({"type": t, "status": status, "reason": reason, "message": message,
           "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 3})
}

fn check(status: Value) -> (String, String) {
    health(&policy_script(), &policy(status))
}

#[test]
fn a_status_default_of_generation_zero_reads_as_no_status_yet() {
    // What a CRD schema default `status: {observedGeneration: 0}` would serve for a policy
    // no controller has seen (the fix that makes kstatus say InProgress there too).
    let (s, m) = check(json!({"observedGeneration": 0}));
    assert_eq!(
        (s.as_str(), m.as_str()),
        (
            "Progressing",
            "Waiting for the Tollgate controller to report status"
        )
    );
    let (s, _) = check(json!({"conditions": [cond("Accepted", "True", "Accepted", "ok")]}));
    assert_eq!(s, "Progressing", "no observedGeneration at all");
}

#[test]
fn shapes_the_controller_does_not_write_still_get_an_answer() {
    let accepted = cond(
        "Accepted",
        "True",
        "Accepted",
        "RateLimitPolicy is accepted",
    );
    // Accepted but no Enforced condition: as kstatus, nothing says it is not current.
    let (s, m) = check(json!({"observedGeneration": 3, "conditions": [accepted]}));
    assert_eq!(
        (s.as_str(), m.as_str()),
        ("Healthy", "RateLimitPolicy is accepted")
    );
    // Accepted=Unknown: not decided yet.
    let (s, _) = check(json!({"observedGeneration": 3,
        "conditions": [cond("Accepted", "Unknown", "Pending", "")]}));
    assert_eq!(s, "Progressing");
    // No conditions at all.
    let (s, _) = check(json!({"observedGeneration": 3}));
    assert_eq!(s, "Progressing");
    // Stalled=True wins over an Accepted=True (kstatus: Failed).
    let (s, m) = check(json!({"observedGeneration": 3, "conditions": [
        cond("Accepted", "True", "Accepted", "x"), cond("Stalled", "True", "Invalid", "bad")]}));
    assert_eq!((s.as_str(), m.as_str()), ("Degraded", "Invalid: bad"));
    // An empty message leaves the reason.
    let (s, m) = check(json!({"observedGeneration": 3, "conditions": [
        cond("Accepted", "False", "Conflicted", "")]}));
    assert_eq!((s.as_str(), m.as_str()), ("Degraded", "Conflicted"));
    // A spec change not yet observed comes before any condition.
    let (s, m) = check(json!({"observedGeneration": 2, "conditions": [
        cond("Accepted", "False", "Invalid", "old news")]}));
    assert_eq!(s, "Progressing", "{m}");
}

#[test]
fn messages_pass_through_the_conversion_unchanged() {
    let text = "quote \" backslash \\ tab \t newline \n bell \u{7} unicode é ✓ ]] [[ end";
    let (s, m) = check(json!({"observedGeneration": 3, "conditions": [
        cond("Accepted", "False", "Invalid", text)]}));
    assert_eq!(s, "Degraded");
    assert_eq!(m, format!("Invalid: {text}"));
    // Nulls are absent keys, as Argo CD hands them to Lua.
    assert_eq!(
        to_lua(&json!({"a": null, "b": [1, "x"]})),
        r#"{["b"]={1,"x",},}"#
    );
}

/// Argo CD runs gopher-lua (Lua 5.1): nothing from 5.2+ may appear, whatever interpreter ran
/// the tests above.
#[test]
fn the_script_stays_within_lua_5_1() {
    let src = std::fs::read_to_string(policy_script()).unwrap();
    let code: String = src
        .lines()
        .map(|l| l.split("--").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n");
    for token in [
        "goto",
        "//",
        "<const>",
        "<close>",
        "table.unpack",
        "table.move",
        "utf8.",
        "string.pack",
        "math.type",
        "require",
        "os.",
        "io.",
    ] {
        assert!(!code.contains(token), "{token} is not for Argo CD's Lua");
    }
    // The interpreter the tests used, for the log.
    println!("lua: {}", argocd_support::lua().display());
}
