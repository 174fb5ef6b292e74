//! `tollgate validate` against the API server's own verdict: for each class of schema rule
//! (type, enum, pattern, bounds, required, CEL rule, unknown field, unknown kind), the same
//! file goes to `kubectl apply --dry-run=server --validate=strict` on the loopback control
//! plane and to `tollgate validate`; both refuse it, and every violation Tollgate names is
//! in kubectl's answer word for word. A valid file passes both.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod k8s_support;

use std::path::Path;
use std::process::Command;

use k8s_support::{kubeconfig, suffix, workspace};

const ROUTE: &str = r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: NAME, namespace: default}
spec:
  parentRefs: [{name: gw}]
  hostnames: [a.example.com]
  rules:
  - matches: [{path: {type: PathPrefix, value: /x}}]
    backendRefs: [{name: web, port: 80}]
"#;

/// (case, the file, a violation Tollgate must name).
fn cases() -> Vec<(&'static str, String, &'static str)> {
    let r = |from: &str, to: &str| ROUTE.replace(from, to);
    vec![
        (
            "type",
            r("port: 80", "port: eighty"),
            "spec.rules[0].backendRefs[0].port: Invalid value: \"string\": spec.rules[0].backendRefs[0].port in body must be of type integer: \"string\"",
        ),
        (
            "enum",
            r("type: PathPrefix", "type: Prefix"),
            "spec.rules[0].matches[0].path.type: Unsupported value: \"Prefix\": supported values: \"Exact\", \"PathPrefix\", \"RegularExpression\"",
        ),
        (
            "pattern",
            r("a.example.com", "Bad_Host"),
            "spec.hostnames[0]: Invalid value: \"Bad_Host\": spec.hostnames[0] in body should match",
        ),
        (
            "maximum",
            r("port: 80", "port: 70000"),
            "spec.rules[0].backendRefs[0].port: Invalid value: 70000: spec.rules[0].backendRefs[0].port in body should be less than or equal to 65535",
        ),
        (
            "required",
            r("{name: web, port: 80}", "{port: 80}"),
            "spec.rules[0].backendRefs[0].name: Required value",
        ),
        (
            "cel",
            r("value: /x", "value: x"),
            "spec.rules[0].matches[0].path: Invalid value: \"object\": value must be an absolute path and start with '/' when type one of ['Exact', 'PathPrefix']",
        ),
        (
            "unknown-field",
            r("  - matches:", "  - typo_field: 1\n    matches:"),
            "unknown field \"spec.rules[0].typo_field\"",
        ),
        (
            "unknown-field-policy",
            "apiVersion: tollgate.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: {name: NAME, namespace: default}\nspec:\n  targetRefs: [{group: gateway.networking.k8s.io, kind: HTTPRoute, name: r}]\n  limits:\n    per-client:\n      rates: [{limit: 10, window: 1m}]\n      typo_field: true\n".to_owned(),
            "unknown field \"spec.limits.per-client.typo_field\"",
        ),
        (
            "unknown-kind",
            "apiVersion: tollgate.dev/v1alpha1\nkind: BackendPolicyX\nmetadata: {name: NAME, namespace: default}\nspec: {}\n".to_owned(),
            "no matches for kind \"BackendPolicyX\" in version \"tollgate.dev/v1alpha1\"",
        ),
    ]
}

/// `kubectl apply --dry-run=server --validate=strict -f file` on the test cluster: (success,
/// stdout and stderr).
fn kubectl_verdict(file: &Path) -> (bool, String) {
    let out = Command::new(workspace().join("e2e/cluster.sh"))
        .args([
            "kubectl",
            "apply",
            "--dry-run=server",
            "--validate=strict",
            "-f",
        ])
        .arg(file)
        .env("KUBECONFIG", kubeconfig())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// `tollgate validate DIR`: (success, stdout).
fn tollgate_verdict(dir: &Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("validate")
        .arg(dir)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn validate_refuses_what_the_api_server_refuses() {
    let root = std::env::temp_dir().join(format!("tollgate-k8s-validate-{}", suffix()));
    let mut mismatches = Vec::new();
    for (case, yaml, want) in cases() {
        let dir = root.join(case);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("object.yaml");
        std::fs::write(&file, yaml.replace("NAME", &format!("v-{case}"))).unwrap();
        let (k_ok, k_text) = kubectl_verdict(&file);
        let (t_ok, t_text) = tollgate_verdict(&dir);
        if k_ok || t_ok {
            mismatches.push(format!(
                "{case}: kubectl accepted={k_ok}, tollgate accepted={t_ok}\nkubectl: {k_text}\ntollgate: {t_text}"
            ));
            continue;
        }
        if !t_text.contains(want) {
            mismatches.push(format!("{case}: tollgate does not say {want:?}:\n{t_text}"));
        }
        if !k_text.contains(want) {
            mismatches.push(format!("{case}: kubectl does not say {want:?}:\n{k_text}"));
        }
    }
    // And a valid file passes both.
    let dir = root.join("valid");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("object.yaml");
    std::fs::write(&file, ROUTE.replace("NAME", "v-valid")).unwrap();
    let (k_ok, k_text) = kubectl_verdict(&file);
    assert!(k_ok, "kubectl refused the valid route: {k_text}");
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("validate")
        .arg(&dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !text.contains("error:"),
        "tollgate found a schema error in the valid route:\n{text}"
    );
    let _ = std::fs::remove_dir_all(&root);
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n\n"));
}
