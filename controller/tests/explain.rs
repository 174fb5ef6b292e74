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
  AuthPolicy default/api-keys authentication.keys: authenticated
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
  RateLimitPolicy default/web-budget limits.per-client: allowed
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
  AuthPolicy default/api-keys authentication.keys: unauthenticated
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
  RateLimitPolicy default/web-budget limits.per-client: limited
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
        serde_json::json!([{"kind": "AuthPolicy", "name": "default/api-keys", "rule": "authentication.keys", "outcome": "unauthenticated"}])
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

/// A free loopback port.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The fixture with its Gateway on a free port (8080 may be taken), in a directory of its own.
fn fixture_on_free_port() -> (tempdir::Dir, u16) {
    let port = free_port();
    let dir = tempdir::Dir::new();
    let text = std::fs::read_to_string(fixture().join("gateway.yaml"))
        .unwrap()
        .replace("port: 8080", &format!("port: {port}"));
    std::fs::write(dir.path().join("gateway.yaml"), text).unwrap();
    (dir, port)
}

mod tempdir {
    /// A directory removed when dropped.
    pub struct Dir(std::path::PathBuf);

    impl Dir {
        pub fn new() -> Self {
            let p = std::env::temp_dir().join(format!(
                "tollgate-explain-{}-{}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos()
            ));
            std::fs::create_dir_all(&p).unwrap();
            Self(p)
        }

        pub fn path(&self) -> &std::path::Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// `tollgate run DIR --admin 127.0.0.1:ADMIN` with `extra`, killed when dropped.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn run(dir: &std::path::Path, admin: u16, extra: &[&str]) -> Running {
    Running(
        Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .arg("run")
            .arg(dir)
            .args([
                "--admin",
                &format!("127.0.0.1:{admin}"),
                "--access-log",
                "false",
            ])
            .args(extra)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// `tollgate explain` with `args` (no directory), retried until the server answers at all.
fn explain_live(args: &[&str]) -> (i32, String, String) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .arg("explain")
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        let refused = err.contains("connecting to") || err.contains("no route table yet");
        if !refused || std::time::Instant::now() > deadline {
            return (
                out.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                err,
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn a_running_gateway_explains_on_its_live_table_as_the_files_do() {
    let (dir, port) = fixture_on_free_port();
    let admin = free_port();
    let _run = run(dir.path(), admin, &[]);
    let url = format!("http://127.0.0.1:{admin}");
    let request = [
        "--host",
        "shop.example.com",
        "--path",
        "/home",
        "-H",
        "x-cost: 11",
    ];
    let (code, live, err) = explain_live(&[&["--admin", url.as_str()][..], &request[..]].concat());
    assert_eq!(code, 0, "{err}");
    let dir_arg = dir.path().to_str().unwrap();
    let (code, offline, err) = explain_live(&[&[dir_arg][..], &request[..]].concat());
    assert_eq!(code, 0, "{err}");
    assert_eq!(live, offline);
    assert!(
        live.contains(&format!("listener http (port {port})")),
        "{live}"
    );
    assert!(live.contains("limited"), "{live}");
}

#[test]
fn with_a_token_file_the_live_explanation_needs_the_token() {
    let (dir, _) = fixture_on_free_port();
    let token = dir.path().join("token");
    std::fs::write(&token, "  s3cret-token\n").unwrap();
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, "not-it").unwrap();
    let admin = free_port();
    let token_arg = token.to_str().unwrap();
    // Only .yaml/.yml files are manifests: the token files beside them are not read as such.
    let _run = run(dir.path(), admin, &["--admin-token-file", token_arg]);
    let url = format!("http://127.0.0.1:{admin}");
    let base = ["--admin", url.as_str(), "--host", "shop.example.com"];
    let (code, _, err) = explain_live(&base);
    assert_eq!(code, 2);
    assert!(err.contains("403 Forbidden"), "{err}");
    let (code, _, err) = explain_live(
        &[
            &base[..],
            &["--admin-token-file", wrong.to_str().unwrap()][..],
        ]
        .concat(),
    );
    assert_eq!(code, 2);
    assert!(err.contains("403 Forbidden"), "{err}");
    let (code, out, err) =
        explain_live(&[&base[..], &["--admin-token-file", token_arg][..]].concat());
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("route default/web rule 0"), "{out}");
}

#[test]
fn each_rule_of_a_policy_has_its_own_outcome() {
    let example = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/api-key");
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("explain")
        .arg(&example)
        .args([
            "--host",
            "localhost",
            "--path",
            "/admin/stats",
            "-H",
            "X-API-Key: bob-demo-key",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(
            "policies:
  AuthPolicy default/orders-auth authentication.api-keys: authenticated
  AuthPolicy default/orders-auth authorization.admins-only-on-admin: forbidden
"
        ),
        "{text}"
    );
    assert!(text.ends_with("answer: 403: not authorized\n"), "{text}");
}

#[test]
fn an_external_authorization_service_is_not_called_nor_taken_for_a_refusal() {
    let example = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/ext-authz");
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("explain")
        .arg(&example)
        .args(["--host", "localhost", "--path", "/orders"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("  AuthPolicy default/orders-auth authorization.demo-service: not evaluated (external service)\n"),
        "{text}"
    );
    assert!(
        text.ends_with(
            "answer: depends on the external authorization service (not called to explain)\n"
        ),
        "{text}"
    );
}
