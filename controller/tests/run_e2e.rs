//! End-to-end tests of the `tollgate` binary: `run` on the quickstart exactly as the README
//! says (and every other example, gRPC over h2c and the policy examples included), `run`
//! applying file changes without a restart, and `validate`'s verdicts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod policy_examples;
mod support;
mod tls_examples;

use std::time::Duration;

use support::{
    Tollgate, eventually, free_port, gateway_yaml, get, get_tls, get_with, post_h2c, temp_dir,
    workspace,
};

const WAIT: Duration = Duration::from_secs(60);

/// Every example, served as its header comment says. They share documented ports, so they run
/// one after another in this single test.
#[test]
fn examples_serve_as_documented() {
    quickstart();
    https();
    tls();
    tls_examples::backend_tls();
    traffic_split();
    listenerset();
    tcp();
    udp();
    grpc();
    policy_examples::rate_limit();
    policy_examples::llm_tokens();
    policy_examples::api_key();
    policy_examples::basic_auth();
    policy_examples::jwt();
    policy_examples::introspection();
    policy_examples::ext_authz();
    policy_examples::oidc();
    policy_examples::mtls();
    policy_examples::client_ip();
    policy_examples::resilience();
}

/// The README's first command: the quickstart with its demo backend, on the ports it documents.
fn quickstart() {
    let logs = temp_dir("quickstart");
    let tg = Tollgate::start(
        &[
            "run",
            "examples/quickstart",
            "--demo-backend",
            "127.0.0.1:9080",
            "--admin",
            "127.0.0.1:9901",
        ],
        &logs,
    );
    let hello = eventually(WAIT, || get(8080, "127.0.0.1:8080", "/hello"))
        .unwrap_or_else(|| panic!("gateway never answered; log:\n{}", tg.log()));
    assert_eq!(hello.status, 200, "{hello:?}\n{}", tg.log());
    let doc = hello.json();
    assert_eq!(doc["backend"], "demo-backend");
    assert_eq!(doc["path"], "/hello");
    assert_eq!(doc["headers"]["x-forwarded-proto"], "http");
    assert!(doc["headers"]["x-request-id"].is_string(), "{doc}");

    let old = get(8080, "127.0.0.1:8080", "/old").unwrap();
    assert_eq!(old.status, 301);
    assert_eq!(old.header("location"), Some("http://127.0.0.1:8080/v2"));

    let v2 = get(8080, "127.0.0.1:8080", "/v2/x?q=1").unwrap();
    assert_eq!(v2.status, 200);
    let doc = v2.json();
    assert_eq!(doc["path"], "/x?q=1");
    assert_eq!(doc["headers"]["x-api-version"], "2");

    let metrics = eventually(WAIT, || get(9901, "127.0.0.1", "/metrics")).unwrap();
    assert_eq!(metrics.status, 200);
    assert!(
        metrics.body.contains("tollgate_requests_total"),
        "{}",
        metrics.body
    );
    assert!(
        metrics.body.contains("default/echo"),
        "route label missing: {}",
        metrics.body
    );
}

/// examples/listenerset: a ListenerSet's listeners beside the Gateway's, on its port and on
/// a port of their own; each parent's routes on its own listeners only.
fn listenerset() {
    let logs = temp_dir("listenerset");
    let tg = Tollgate::start(
        &[
            "run",
            "examples/listenerset",
            "--demo-backend",
            "127.0.0.1:9080",
            "--admin",
            "off",
        ],
        &logs,
    );
    let www = eventually(WAIT, || get(8080, "www.example.test", "/"))
        .unwrap_or_else(|| panic!("gateway never answered; log:\n{}", tg.log()));
    assert_eq!(www.status, 200, "{www:?}\n{}", tg.log());
    assert!(www.json()["headers"]["x-served-by"].is_null(), "{www:?}");
    for (port, host) in [(8080, "api.example.test"), (8081, "127.0.0.1:8081")] {
        let api = get(port, host, "/v1/items").unwrap();
        assert_eq!(api.status, 200, "{host}: {api:?}");
        let doc = api.json();
        assert_eq!(doc["path"], "/v1/items");
        assert_eq!(doc["headers"]["x-served-by"], "team-a", "{doc}");
    }
    // The Gateway's route is not on team-a's listeners, nor team-a's on the Gateway's.
    assert_eq!(get(8080, "api.example.test", "/").unwrap().status, 404);
    assert_eq!(
        get(8080, "www.example.test", "/v1/items").unwrap().status,
        200
    );
    assert!(
        get(8080, "www.example.test", "/v1/items").unwrap().json()["headers"]["x-served-by"]
            .is_null()
    );
    assert_eq!(get(8081, "www.example.test", "/").unwrap().status, 404);
}

/// examples/tcp: bytes copied to the echo backend, no HTTP processing on the way.
fn tcp() {
    let logs = temp_dir("tcp");
    let tg = Tollgate::start(
        &[
            "run",
            "examples/tcp",
            "--demo-backend",
            "127.0.0.1:9080",
            "--admin",
            "off",
        ],
        &logs,
    );
    let hello = eventually(WAIT, || get(9000, "127.0.0.1:9000", "/hello"))
        .unwrap_or_else(|| panic!("TCP listener never answered; log:\n{}", tg.log()));
    assert_eq!(hello.status, 200, "{hello:?}");
    let doc = hello.json();
    assert_eq!(doc["path"], "/hello");
    assert!(
        doc["headers"]["x-forwarded-proto"].is_null() && doc["headers"]["x-request-id"].is_null(),
        "an HTTP listener's headers on a TCP stream: {doc}"
    );
}

/// examples/udp: a datagram through the gateway, answered by the demo backend.
fn udp() {
    let logs = temp_dir("udp");
    let tg = Tollgate::start(
        &[
            "run",
            "examples/udp",
            "--demo-backend",
            "127.0.0.1:9080",
            "--admin",
            "off",
        ],
        &logs,
    );
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let answer = eventually(WAIT, || {
        socket.send_to(b"hello udp", "127.0.0.1:5300").ok()?;
        let mut buf = [0u8; 65536];
        let n = socket.recv(&mut buf).ok()?;
        Some(String::from_utf8_lossy(&buf[..n]).into_owned())
    })
    .unwrap_or_else(|| panic!("UDP listener never answered; log:\n{}", tg.log()));
    assert!(answer.contains("\"text\": \"hello udp\""), "{answer}");
}

fn https() {
    let logs = temp_dir("https");
    let tg = Tollgate::start(
        &[
            "run",
            "examples/https",
            "--demo-backend",
            "127.0.0.1:9080",
            "--admin",
            "off",
        ],
        &logs,
    );
    let ca = workspace().join("examples/https/demo-ca.pem");
    let resp = eventually(WAIT, || get_tls(8443, "app.example.test", "/x", &ca))
        .unwrap_or_else(|| panic!("HTTPS never answered; log:\n{}", tg.log()));
    assert_eq!(resp.status, 200, "{resp:?}");
    let doc = resp.json();
    assert_eq!(doc["path"], "/x");
    assert_eq!(doc["headers"]["x-forwarded-proto"], "https");
    // A hostname the listener does not cover has no route.
    let other = get_tls(8443, "other.example.test", "/x", &ca).unwrap();
    assert_eq!(other.status, 404);
    // Plain HTTP redirects to HTTPS.
    let redirect = get(8081, "app.example.test", "/x?y=1").unwrap();
    assert_eq!(redirect.status, 301);
    assert_eq!(
        redirect.header("location"),
        Some("https://app.example.test:8443/x?y=1")
    );
}

/// examples/tls: one TLS port, a terminating listener and a passthrough one picked by SNI.
fn tls() {
    let logs = temp_dir("tls");
    let tg = Tollgate::start(
        &[
            "run",
            "examples/tls",
            "--demo-backend",
            "127.0.0.1:9080",
            "--admin",
            "off",
        ],
        &logs,
    );
    let ca = workspace().join("examples/tls/demo-ca.pem");
    // Terminated here: the decrypted bytes reach the echo backend as the client wrote them.
    let resp = eventually(WAIT, || {
        get_tls(9443, "terminate.example.test", "/hello", &ca)
    })
    .unwrap_or_else(|| panic!("the TLS listener never answered; log:\n{}", tg.log()));
    assert_eq!(resp.status, 200, "{resp:?}");
    let doc = resp.json();
    assert_eq!(doc["path"], "/hello");
    assert_eq!(doc["host"], "terminate.example.test");
    assert!(doc["headers"].get("x-forwarded-proto").is_none(), "{doc}");
    // Passed through: the client's TLS ends at the HTTPS listener on 9444, which adds its
    // forwarding headers before the echo backend.
    let resp = get_tls(9443, "passthrough.example.test", "/hello", &ca)
        .unwrap_or_else(|| panic!("passthrough failed; log:\n{}", tg.log()));
    assert_eq!(resp.status, 200, "{resp:?}");
    let doc = resp.json();
    assert_eq!(doc["headers"]["x-forwarded-proto"], "https", "{doc}");
    assert_eq!(doc["host"], "passthrough.example.test");
    // No route takes this SNI: the connection is closed without an answer.
    assert!(get_tls(9443, "other.example.test", "/", &ca).is_none());
}

fn traffic_split() {
    let logs = temp_dir("split");
    let tg = Tollgate::start(
        &[
            "run",
            "examples/traffic-split",
            "--demo-backend",
            "127.0.0.1:9080",
            "--admin",
            "off",
        ],
        &logs,
    );
    eventually(WAIT, || get(8082, "shop", "/").filter(|r| r.status == 200))
        .unwrap_or_else(|| panic!("never served; log:\n{}", tg.log()));
    let (mut v1, mut v2) = (0, 0);
    for _ in 0..200 {
        let r = get(8082, "shop", "/").unwrap();
        match r.json()["headers"]["x-version"].as_str() {
            Some("v1") => v1 += 1,
            Some("v2") => v2 += 1,
            other => panic!("unexpected x-version {other:?}"),
        }
    }
    // 90/10: both get traffic and v1 gets most of it (binomial; failing odds below 1e-9).
    assert!(v1 > 140 && v2 > 0, "v1={v1} v2={v2}");
    for _ in 0..20 {
        let r = get_with(8082, "shop", "/", &[("x-canary", "always")]).unwrap();
        assert_eq!(r.json()["headers"]["x-version"], "v2");
    }
}

/// A unary gRPC call as a client sends it: an h2c POST carrying one empty message frame.
fn grpc_call(port: u16, path: &str) -> Option<support::Resp> {
    let headers = [("content-type", "application/grpc"), ("te", "trailers")];
    // One gRPC message frame: not compressed, length 0.
    post_h2c(port, path, &headers, &[0u8; 5])
}

/// A GRPCRoute served to an h2c backend: an HTTP/2 prior-knowledge POST to
/// `/service/method`, as a gRPC client sends it, reaches the backend over HTTP/2.
fn grpc() {
    let logs = temp_dir("grpc");
    let tg = Tollgate::start(
        &[
            "run",
            "examples/grpc",
            "--demo-backend",
            "127.0.0.1:9080",
            "--admin",
            "off",
        ],
        &logs,
    );
    let call = |path: &str| grpc_call(8083, path);
    let hello = eventually(WAIT, || {
        call("/helloworld.Greeter/SayHello").filter(|r| r.status == 200)
    })
    .unwrap_or_else(|| panic!("gRPC never served; log:\n{}", tg.log()));
    let doc = hello.json();
    assert_eq!(
        doc["protocol"], "HTTP/2.0",
        "the backend is spoken to over h2c: {doc}"
    );
    assert_eq!(doc["method"], "POST");
    assert_eq!(doc["path"], "/helloworld.Greeter/SayHello");
    assert_eq!(doc["headers"]["content-type"], "application/grpc");
    assert_eq!(doc["headers"]["x-rule"], "say-hello");
    assert_eq!(doc["bodyBytes"], 5);
    // A service-only match takes every method of the service.
    let health = call("/grpc.health.v1.Health/Watch").unwrap();
    assert_eq!(health.status, 200, "{health:?}");
    assert_eq!(health.json()["headers"]["x-rule"], "health");
    // Another method of Greeter has no route; a service whose name extends Health's neither.
    // The gateway says so as a gRPC server would: UNIMPLEMENTED (12), in a Trailers-Only
    // answer.
    for path in [
        "/helloworld.Greeter/SayGoodbye",
        "/grpc.health.v1.HealthX/Check",
    ] {
        let r = call(path).unwrap();
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.header("grpc-status"), Some("12"), "{path}: {r:?}");
        assert_eq!(r.header("content-type"), Some("application/grpc"));
        assert!(r.body.is_empty(), "{r:?}");
    }
}

/// An h2c upstream answering every call like a gRPC server: one message frame, then
/// `grpc-status` in the trailers. Returns its port; it serves until `rt` is dropped.
fn grpc_upstream(rt: &tokio::runtime::Runtime) -> u16 {
    use std::convert::Infallible;

    use http_body_util::StreamBody;
    use hyper::body::Frame;

    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    rt.spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let svc = hyper::service::service_fn(|req: http::Request<hyper::body::Incoming>| {
                let path = req.uri().path().to_owned();
                async move {
                    let mut trailers = http::HeaderMap::new();
                    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                    trailers.insert("grpc-message", http::HeaderValue::from_str(&path).unwrap());
                    let frames = vec![
                        Ok::<_, Infallible>(Frame::data(bytes::Bytes::from_static(&[
                            0, 0, 0, 0, 0,
                        ]))),
                        Ok(Frame::trailers(trailers)),
                    ];
                    let body = StreamBody::new(futures_util::stream::iter(frames));
                    let mut resp = http::Response::new(body);
                    resp.headers_mut().insert(
                        http::header::CONTENT_TYPE,
                        http::HeaderValue::from_static("application/grpc"),
                    );
                    Ok::<_, Infallible>(resp)
                }
            });
            tokio::spawn(
                hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc),
            );
        }
    });
    port
}

/// gRPC needs trailers: `grpc-status` from an h2c upstream reaches the client through
/// `tollgate run`.
#[test]
fn run_serves_grpc_with_trailers() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let upstream = grpc_upstream(&rt);
    let dir = temp_dir("grpc-trailers");
    let logs = temp_dir("grpc-trailers-logs");
    let gw_port = free_port();
    let route = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: greeter, namespace: default}
spec:
  parentRefs: [{name: gw}]
  rules:
  - matches: [{method: {service: helloworld.Greeter}}]
    backendRefs: [{name: echo, port: 80}]
"#;
    std::fs::write(dir.join("gateway.yaml"), gateway_yaml(gw_port)).unwrap();
    std::fs::write(dir.join("backend.yaml"), backend_yaml(upstream)).unwrap();
    std::fs::write(dir.join("route.yaml"), route).unwrap();
    let tg = Tollgate::start(&["run", dir.to_str().unwrap(), "--admin", "off"], &logs);
    let call = |path: &str| grpc_call(gw_port, path);
    let resp = eventually(WAIT, || {
        call("/helloworld.Greeter/SayHello").filter(|r| r.status == 200)
    })
    .unwrap_or_else(|| panic!("gRPC never served; log:\n{}", tg.log()));
    assert_eq!(resp.header("content-type"), Some("application/grpc"));
    assert_eq!(resp.body.len(), 5);
    let trailer = |name: &str| {
        resp.trailers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(trailer("grpc-status"), Some("0"), "{resp:?}");
    assert_eq!(
        trailer("grpc-message"),
        Some("/helloworld.Greeter/SayHello")
    );
    drop(rt);
}

fn backend_yaml(port: u16) -> String {
    format!(
        r#"apiVersion: v1
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
ports: [{{name: http, port: {port}}}]
endpoints:
- addresses: ["127.0.0.1"]
"#
    )
}

fn route_yaml(name: &str, path: &str) -> String {
    format!(
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: {name}, namespace: default}}
spec:
  parentRefs: [{{name: gw}}]
  rules:
  - matches: [{{path: {{type: PathPrefix, value: {path}}}}}]
    backendRefs: [{{name: echo, port: 80}}]
"#
    )
}

/// Edits to the watched directory apply without a restart; a bad route and a broken file
/// are reported and change nothing else.
#[test]
fn run_applies_file_changes_and_isolates_bad_objects() {
    let dir = temp_dir("watch");
    let logs = temp_dir("watch-logs");
    let (gw_port, be_port, admin) = (free_port(), free_port(), free_port());
    std::fs::write(dir.join("gateway.yaml"), gateway_yaml(gw_port)).unwrap();
    std::fs::write(dir.join("backend.yaml"), backend_yaml(be_port)).unwrap();
    std::fs::write(dir.join("a.yaml"), route_yaml("a", "/a")).unwrap();
    let admin_addr = format!("127.0.0.1:{admin}");
    let be_addr = format!("127.0.0.1:{be_port}");
    let tg = Tollgate::start(
        &[
            "run",
            dir.to_str().unwrap(),
            "--demo-backend",
            &be_addr,
            "--admin",
            &admin_addr,
        ],
        &logs,
    );
    let ok =
        |path: &'static str| move || get(gw_port, "example.test", path).filter(|r| r.status == 200);
    eventually(WAIT, ok("/a")).unwrap_or_else(|| panic!("/a never served:\n{}", tg.log()));
    assert_eq!(get(gw_port, "example.test", "/b").unwrap().status, 404);

    // A new file adds a route.
    std::fs::write(dir.join("b.yaml"), route_yaml("b", "/b")).unwrap();
    eventually(WAIT, ok("/b")).unwrap_or_else(|| panic!("/b never served:\n{}", tg.log()));

    // A route with a bad regex is rejected alone.
    std::fs::write(
        dir.join("bad.yaml"),
        route_yaml("bad", "/c").replace(
            "{type: PathPrefix, value: /c}",
            "{type: RegularExpression, value: '/c(['}",
        ),
    )
    .unwrap();
    eventually(WAIT, || {
        tg.log()
            .contains("default/bad")
            .then_some(())
            .filter(|_| tg.log().contains("rejected"))
    })
    .unwrap_or_else(|| panic!("bad route not reported:\n{}", tg.log()));
    assert_eq!(get(gw_port, "example.test", "/a").unwrap().status, 200);
    assert_eq!(get(gw_port, "example.test", "/b").unwrap().status, 200);

    // A file that stops parsing keeps its last good objects.
    std::fs::write(dir.join("b.yaml"), "kind: HTTPRoute\n  : : not yaml [").unwrap();
    eventually(WAIT, || {
        tg.log().contains("manifest not loaded").then_some(())
    })
    .unwrap_or_else(|| panic!("parse error not reported:\n{}", tg.log()));
    assert_eq!(get(gw_port, "example.test", "/b").unwrap().status, 200);

    // Deleting the file removes its route.
    std::fs::remove_file(dir.join("b.yaml")).unwrap();
    eventually(WAIT, || {
        get(gw_port, "example.test", "/b").filter(|r| r.status == 404)
    })
    .unwrap_or_else(|| panic!("/b still served after delete:\n{}", tg.log()));
    assert_eq!(get(gw_port, "example.test", "/a").unwrap().status, 200);
}

fn validate(dir: &std::path::Path) -> (i32, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("validate")
        .arg(dir)
        .current_dir(workspace())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn validate_accepts_every_example() {
    let examples = workspace().join("examples");
    for entry in std::fs::read_dir(&examples).unwrap() {
        let dir = entry.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        let (code, out) = validate(&dir);
        assert_eq!(code, 0, "{}:\n{out}", dir.display());
        assert!(out.contains("Accepted=True"), "{out}");
    }
}

/// `validate` prints "the status every object would get": policies are objects too, and a
/// user checking a policy example should see it Accepted, not only learn of it when rejected.
#[test]
fn validate_prints_policy_status() {
    for (dir, header) in [
        (
            "examples/rate-limit",
            "RateLimitPolicy default/api-per-client",
        ),
        (
            "examples/rate-limit",
            "RateLimitPolicy default/gateway-default",
        ),
        (
            "examples/rate-limit",
            "RateLimitPolicy default/exports-token-bucket",
        ),
        (
            "examples/rate-limit",
            "RateLimitPolicy default/reports-fixed-window",
        ),
        ("examples/llm-tokens", "RateLimitPolicy default/llm-budget"),
        ("examples/api-key", "AuthPolicy default/orders-auth"),
        ("examples/basic-auth", "AuthPolicy default/admin-auth"),
        ("examples/introspection", "AuthPolicy default/accounts-auth"),
        ("examples/oidc", "AuthPolicy default/shop-login"),
        ("examples/ext-authz", "AuthPolicy default/orders-auth"),
        ("examples/mtls", "AuthPolicy default/api-auth"),
    ] {
        let (code, out) = validate(&workspace().join(dir));
        assert_eq!(code, 0, "{out}");
        let mut lines = out.lines().skip_while(|l| *l != header);
        assert_eq!(
            lines.next(),
            Some(header),
            "{dir}: no {header} block:\n{out}"
        );
        assert!(
            lines.next().is_some_and(|l| l.contains("Accepted=True")),
            "{dir}:\n{out}"
        );
    }
}

#[test]
fn validate_names_the_rejected_object_and_fails() {
    let dir = temp_dir("validate");
    std::fs::write(dir.join("gateway.yaml"), gateway_yaml(8080)).unwrap();
    std::fs::write(dir.join("backend.yaml"), backend_yaml(9080)).unwrap();
    std::fs::write(dir.join("a.yaml"), route_yaml("good", "/a")).unwrap();
    std::fs::write(
        dir.join("b.yaml"),
        route_yaml("missing-backend", "/b").replace("name: echo", "name: nope"),
    )
    .unwrap();
    let (code, out) = validate(&dir);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("1 rejected"), "{out}");
    let rejected = out.split("rejected:").nth(1).unwrap();
    assert!(rejected.contains("default/missing-backend"), "{out}");
    assert!(rejected.contains("BackendNotFound"), "{out}");
    assert!(!rejected.contains("default/good"), "{out}");
}

/// A file the API server would refuse (here a field its CRD does not have) fails `validate`
/// with the API server's words; the other files are still compiled.
#[test]
fn validate_checks_objects_against_their_crd() {
    let dir = temp_dir("validate-schema");
    std::fs::write(dir.join("gateway.yaml"), gateway_yaml(8080)).unwrap();
    std::fs::write(dir.join("backend.yaml"), backend_yaml(9080)).unwrap();
    std::fs::write(dir.join("a.yaml"), route_yaml("good", "/a")).unwrap();
    let typo = route_yaml("typo", "/b")
        .replace("  - matches:", "  - timeoutz: {request: 1s}\n    matches:");
    assert_ne!(
        typo,
        route_yaml("typo", "/b"),
        "the fixture has no `  - matches:` line"
    );
    std::fs::write(dir.join("b.yaml"), typo).unwrap();
    let (code, out) = validate(&dir);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(
            "b.yaml: document 0 (HTTPRoute typo): unknown field \"spec.rules[0].timeoutz\""
        ),
        "{out}"
    );
    assert!(out.contains("HTTPRoute default/good"), "{out}");
}

#[test]
fn compile_writes_the_table_the_proxy_serves() {
    let out = temp_dir("compile-out");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["compile", "examples/quickstart", "--out"])
        .arg(&out)
        .current_dir(workspace())
        .output()
        .unwrap();
    assert!(status.status.success(), "{status:?}");
    let text = std::fs::read_to_string(out.join("default.quickstart.json")).unwrap();
    let table: tollgate_api::RouteTable = serde_json::from_str(&text).unwrap();
    assert_eq!(table.version, 1);
    assert_eq!(table.ports.len(), 1);
    assert_eq!(table.ports[0].port, 8080);
    assert_eq!(table.ports[0].address, "127.0.0.1");
    assert!(table.backends.contains_key("default/echo:80"), "{text}");
}

/// `tollgate demo-backend`: the echo backend alone (what examples/ run as a pod on a cluster),
/// with its DEMO introspection endpoint, ending cleanly on SIGTERM.
#[test]
fn demo_backend_serves_echo_and_introspection_and_stops_on_sigterm() {
    let logs = temp_dir("demo-backend");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut tg = Tollgate::start(
        &["demo-backend", "--listen", &listen, "--name", "pod-a"],
        &logs,
    );
    let echo = eventually(WAIT, || get(port, "example.test", "/hello?x=1"))
        .unwrap_or_else(|| panic!("demo backend never answered; log:\n{}", tg.log()));
    assert_eq!(echo.status, 200);
    let doc = echo.json();
    assert_eq!(doc["backend"], "pod-a");
    assert_eq!(doc["path"], "/hello?x=1");
    assert_eq!(doc["host"], "example.test");
    let introspected = post_h2c(
        port,
        "/introspect",
        &[
            // demo-client:demo-secret
            ("authorization", "Basic ZGVtby1jbGllbnQ6ZGVtby1zZWNyZXQ="),
            ("content-type", "application/x-www-form-urlencoded"),
        ],
        b"token=demo-token-alice",
    )
    .expect("POST /introspect");
    assert_eq!(introspected.status, 200);
    let doc = introspected.json();
    assert_eq!(doc["active"], true, "{doc}");
    assert_eq!(doc["sub"], "alice");
    let status = tg
        .terminate(Duration::from_secs(10))
        .unwrap_or_else(|| panic!("still running 10 s after SIGTERM; log:\n{}", tg.log()));
    assert!(status.success(), "{status:?}\n{}", tg.log());
}
