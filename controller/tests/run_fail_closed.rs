//! Policies fail closed under `tollgate run`: an AuthPolicy edited into an invalid state
//! keeps its last valid version enforced; one never valid makes its route answer 500 while
//! every other route keeps serving. Real sockets on 127.0.0.1, the `tollgate` binary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use support::{Tollgate, eventually, free_port, gateway_yaml, get, get_with, temp_dir};

const WAIT: Duration = Duration::from_secs(60);
const KEY: (&str, &str) = ("x-api-key", "alice-key");

fn base_yaml(gw_port: u16, be_port: u16) -> String {
    format!(
        r#"{gateway}---
apiVersion: v1
kind: Service
metadata: {{name: echo, namespace: default}}
spec:
  ports: [{{name: http, port: 80}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: echo-1
  namespace: default
  labels: {{kubernetes.io/service-name: echo}}
addressType: IPv4
ports: [{{name: http, port: {be_port}}}]
endpoints:
- addresses: ["127.0.0.1"]
---
apiVersion: v1
kind: Secret
metadata: {{name: key-alice, namespace: default, labels: {{app: locked, tollgate.dev/credential: "true"}}}}
stringData: {{api_key: alice-key}}
{}{}{}"#,
        route_yaml("locked"),
        route_yaml("open"),
        route_yaml("never"),
        gateway = gateway_yaml(gw_port),
    )
}

fn route_yaml(name: &str) -> String {
    format!(
        r#"---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: {name}, namespace: default}}
spec:
  parentRefs: [{{name: gw}}]
  hostnames: [{name}.test]
  rules: [{{backendRefs: [{{name: echo, port: 80}}]}}]
"#
    )
}

/// An AuthPolicy on route `route`: an API key in `X-API-Key`, and `predicate` must hold.
fn auth_yaml(name: &str, route: &str, predicate: &str) -> String {
    format!(
        r#"apiVersion: tollgate.dev/v1alpha1
kind: AuthPolicy
metadata: {{name: {name}, namespace: default}}
spec:
  targetRefs: [{{group: gateway.networking.k8s.io, kind: HTTPRoute, name: {route}}}]
  rules:
    authentication:
      keys:
        apiKey: {{selector: {{matchLabels: {{app: locked}}}}}}
        credentials: {{customHeader: {{name: X-API-Key}}}}
    authorization:
      no-delete: {{predicate: "{predicate}"}}
"#
    )
}

fn status(port: u16, host: &str, headers: &[(&str, &str)]) -> u16 {
    get_with(port, host, "/", headers).map_or(0, |r| r.status)
}

#[test]
fn run_keeps_the_last_valid_auth_policy_and_closes_never_valid_ones() {
    let dir = temp_dir("fail-closed");
    let logs = temp_dir("fail-closed-logs");
    let (gw, be) = (free_port(), free_port());
    std::fs::write(dir.join("base.yaml"), base_yaml(gw, be)).unwrap();
    let valid = auth_yaml("locked-auth", "locked", "request.method != 'DELETE'");
    std::fs::write(dir.join("auth.yaml"), &valid).unwrap();
    let be_addr = format!("127.0.0.1:{be}");
    let tg = Tollgate::start(
        &[
            "run",
            dir.to_str().unwrap(),
            "--demo-backend",
            &be_addr,
            "--admin",
            "off",
        ],
        &logs,
    );
    eventually(WAIT, || {
        get(gw, "open.test", "/").filter(|r| r.status == 200)
    })
    .unwrap_or_else(|| panic!("open.test never served:\n{}", tg.log()));
    // The valid policy is enforced.
    assert_eq!(status(gw, "locked.test", &[]), 401, "{}", tg.log());
    assert_eq!(status(gw, "locked.test", &[KEY]), 200, "{}", tg.log());
    assert_eq!(status(gw, "never.test", &[]), 200, "{}", tg.log());

    // A typo in the predicate: rejected, and its last valid version stays enforced.
    std::fs::write(
        dir.join("auth.yaml"),
        valid.replace("request.method != 'DELETE'", "request.method != "),
    )
    .unwrap();
    eventually(WAIT, || {
        tg.log()
            .contains("AuthPolicy default/locked-auth")
            .then_some(())
    })
    .unwrap_or_else(|| panic!("the invalid edit was not reported:\n{}", tg.log()));
    assert_eq!(status(gw, "locked.test", &[]), 401, "{}", tg.log());
    assert_eq!(status(gw, "locked.test", &[KEY]), 200, "{}", tg.log());
    assert_eq!(status(gw, "open.test", &[]), 200, "{}", tg.log());
    assert!(
        tg.log().contains("the last valid version stays enforced"),
        "{}",
        tg.log()
    );

    // A policy that was never valid closes its route: 500, with or without a key.
    std::fs::write(
        dir.join("never.yaml"),
        auth_yaml("never-auth", "never", "request.method != "),
    )
    .unwrap();
    eventually(WAIT, || {
        tg.log()
            .contains("AuthPolicy default/never-auth")
            .then_some(())
    })
    .unwrap_or_else(|| panic!("the never valid policy was not reported:\n{}", tg.log()));
    eventually(WAIT, || {
        get(gw, "never.test", "/").filter(|r| r.status == 500)
    })
    .unwrap_or_else(|| panic!("never.test not closed:\n{}", tg.log()));
    assert_eq!(status(gw, "never.test", &[KEY]), 500, "{}", tg.log());
    assert!(
        tg.log()
            .contains("the routes it targets answer 500 until it is fixed"),
        "{}",
        tg.log()
    );
    // Everything else keeps serving as before.
    assert_eq!(status(gw, "open.test", &[]), 200, "{}", tg.log());
    assert_eq!(status(gw, "locked.test", &[]), 401, "{}", tg.log());
    assert_eq!(status(gw, "locked.test", &[KEY]), 200, "{}", tg.log());

    // Fixed: the policy is enforced as written, no longer 500.
    std::fs::write(
        dir.join("never.yaml"),
        auth_yaml("never-auth", "never", "request.method != 'DELETE'"),
    )
    .unwrap();
    eventually(WAIT, || {
        get(gw, "never.test", "/").filter(|r| r.status == 401)
    })
    .unwrap_or_else(|| panic!("never.test not reopened:\n{}", tg.log()));
    assert_eq!(status(gw, "never.test", &[KEY]), 200, "{}", tg.log());
}

/// `tollgate validate` has no memory of earlier versions: it says a never-valid AuthPolicy
/// closes its targets, and fails.
#[test]
fn validate_says_a_never_valid_auth_policy_closes_its_targets() {
    let dir = temp_dir("fail-closed-validate");
    std::fs::write(dir.join("base.yaml"), base_yaml(8080, 9080)).unwrap();
    std::fs::write(
        dir.join("never.yaml"),
        auth_yaml("never-auth", "never", "request.method != "),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("validate")
        .arg(&dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    // The policy's block: its header, then its conditions (a CEL error spans lines).
    let header = "\nAuthPolicy default/never-auth\n";
    let block = &text[text.find(header).unwrap_or_else(|| panic!("{text}"))..];
    let accepted = &block[header.len()..block.find("  Stalled=").unwrap_or(block.len())];
    assert!(accepted.starts_with("  Accepted=False Invalid: "), "{text}");
    assert!(
        accepted
            .contains("it was never valid, so the routes it targets answer 500 until it is fixed"),
        "{text}"
    );
}
