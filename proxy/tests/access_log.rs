//! The access log of the `tollgate-proxy` binary (one JSON line per request on stdout): a gRPC
//! call's line carries its `grpc_status`, wherever the status came from (the upstream's
//! trailers, the upstream's Trailers-Only head, or the gateway's own answer); other lines
//! have none; a gRPC-Web call's line has it too (from the trailers the gateway turned into its
//! last message) and `grpc_web: true`. A request whose body was cut as too slow carries why
//! (`client_timeout`), which the metrics count too. A request retried under its route's retry
//! rule names each retried attempt (`retried`). A request a shadow rate limit would have
//! refused names the limit (`shadow_limited`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::convert::Infallible;
use std::io::BufRead as _;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;
use tokio::net::TcpListener;
use tollgate_api::{Backend, BackendProtocol, LoadBalancer};

type Frames =
    StreamBody<futures_util::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>>;

/// A gRPC server (HTTP/2 only) that fails every call: `grpc-status: 5` in the trailers after
/// one message, or, for a method named `TrailersOnly`, `grpc-status: 7` in the response head
/// and no body.
async fn grpc_server() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let svc = service_fn(|req: Request<Incoming>| async move {
                    let trailers_only = req.uri().path().ends_with("/TrailersOnly");
                    let _ = req.into_body().collect().await;
                    let mut resp = Response::builder().header("content-type", "application/grpc");
                    let frames: Vec<Result<Frame<Bytes>, Infallible>> = if trailers_only {
                        resp = resp.header("grpc-status", "7");
                        vec![]
                    } else {
                        let mut t = HeaderMap::new();
                        t.insert("grpc-status", HeaderValue::from_static("5"));
                        t.insert("grpc-message", HeaderValue::from_static("no such thing"));
                        vec![
                            Ok(Frame::data(Bytes::from_static(&[0, 0, 0, 0, 0]))),
                            Ok(Frame::trailers(t)),
                        ]
                    };
                    let body: Frames = StreamBody::new(futures_util::stream::iter(frames));
                    Ok::<_, Infallible>(resp.body(body).unwrap())
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

/// Sends `req`, reads the answer to its end; the status and the `grpc-status` of the head or,
/// failing that, of the trailers.
async fn exchange(client: &TestClient, req: Request<Full<Bytes>>) -> (StatusCode, Option<String>) {
    let resp = tokio::time::timeout(Duration::from_secs(10), client.request(req))
        .await
        .unwrap()
        .unwrap();
    let status = resp.status();
    let head = resp.headers().get("grpc-status").cloned();
    let collected = resp.into_body().collect().await.unwrap();
    let grpc = head
        .or_else(|| {
            collected
                .trailers()
                .and_then(|t| t.get("grpc-status").cloned())
        })
        .map(|v| v.to_str().unwrap().to_owned());
    (status, grpc)
}

/// The next access log line for `path`, waiting at most 10 s (a bound, not a speed check).
fn line_for(lines: &mpsc::Receiver<String>, path: &str) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let line = lines
            .recv_timeout(left)
            .unwrap_or_else(|e| panic!("no access log line for {path}: {e}"));
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if v["path"] == path {
            return v;
        }
    }
}

/// Waits (at most 30 s: a bound, not a speed check) until the proxy answers `url`, and
/// asserts that the answer is a 200.
async fn until_served(client: &TestClient, url: &str) {
    for _ in 0..300 {
        let req = Request::get(url).body(Full::default()).unwrap();
        if let Ok(Ok(r)) = tokio::time::timeout(Duration::from_secs(2), client.request(req)).await {
            assert_eq!(r.status(), StatusCode::OK, "{url}");
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the proxy never answered {url}");
}

/// Writes `t` to `file` and starts the `tollgate-proxy` binary on it with the access log on,
/// the admin server on `admin` and `args`; the process (killed when dropped) and its stdout
/// lines.
fn start_binary(
    file: &std::path::Path,
    t: &tollgate_api::RouteTable,
    admin: u16,
    args: &[&str],
) -> (Killed, mpsc::Receiver<String>) {
    std::fs::write(file, serde_json::to_string(t).unwrap()).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate-proxy"))
        .arg("--table")
        .arg(file)
        .arg("--admin")
        .arg(format!("127.0.0.1:{admin}"))
        .args(["--access-log", "true"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    (Killed(child), lines)
}

#[tokio::test]
async fn access_log_lines_of_grpc_calls_carry_their_grpc_status() {
    let grpc = grpc_server().await;
    let echo = echo_backend("plain").await;
    let port = free_port();
    let admin = free_port();
    let dir = std::env::temp_dir().join(format!(
        "tollgate-proxy-access-log-{}-{port}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("table.json");
    let grpc_backend = Backend {
        tls: None,
        protocol: BackendProtocol::H2c,
        load_balancer: LoadBalancer::default(),
        settings: Default::default(),
        endpoints: vec![tollgate_api::Endpoint {
            ip: "127.0.0.1".into(),
            port: grpc.port(),
        }],
    };
    let t = table(
        1,
        vec![http_port(
            port,
            vec![
                // A GRPCRoute's: gRPC-Web calls are translated.
                tollgate_api::Route {
                    grpc_web: true,
                    ..route("grpc", "/svc.Up/", vec![wb("grpc", 1)])
                },
                route("plain", "/plain", vec![wb("plain", 1)]),
            ],
        )],
        vec![("grpc", grpc_backend), ("plain", backend_of(&[&echo]))],
    );
    let (_proxy, lines) = start_binary(&file, &t, admin, &[]);

    let h1 = h1_client();
    let h2 = h2c_client();
    let base = format!("http://127.0.0.1:{port}");
    until_served(&h1, &format!("{base}/plain/ready")).await;

    // (what, client, request, answer: HTTP status and grpc-status, line: status and grpc_status)
    let grpc = |path: &str, ct: &str| grpc_call(&format!("{base}{path}"), ct);
    let cases = [
        (
            "the upstream's status in its trailers",
            &h2,
            grpc("/svc.Up/Get", "application/grpc"),
            (StatusCode::OK, Some("5")),
            (200, Some(5)),
        ),
        (
            "the upstream's Trailers-Only answer",
            &h2,
            grpc("/svc.Up/TrailersOnly", "application/grpc+proto"),
            (StatusCode::OK, Some("7")),
            (200, Some(7)),
        ),
        (
            "the gateway's own answer: no route is UNIMPLEMENTED, the line keeps the HTTP meaning",
            &h2,
            grpc("/other.Svc/Call", "application/grpc"),
            (StatusCode::OK, Some("12")),
            (404, Some(12)),
        ),
        (
            "a gRPC call whose answer carries no grpc-status: no field",
            &h1,
            grpc("/plain/grpc", "application/grpc"),
            (StatusCode::OK, None),
            (200, None),
        ),
        (
            "a gRPC-Web call: the status of the trailers it got as its last message",
            &h1,
            grpc("/svc.Up/WebGet", "application/grpc-web"),
            (StatusCode::OK, None),
            (200, Some(5)),
        ),
        (
            "a gRPC-Web call answered Trailers-Only",
            &h1,
            grpc("/svc.Up/web/TrailersOnly", "application/grpc-web+proto"),
            (StatusCode::OK, Some("7")),
            (200, Some(7)),
        ),
        (
            "not a gRPC call: no field",
            &h1,
            Request::get(format!("{base}/plain/x"))
                .body(Full::default())
                .unwrap(),
            (StatusCode::OK, None),
            (200, None),
        ),
        (
            "not a gRPC call, though the answer has trailers with a grpc-status: no field",
            &h2,
            grpc("/svc.Up/Json", "application/json"),
            (StatusCode::OK, Some("5")),
            (200, None),
        ),
    ];
    for (what, client, req, answer, line) in cases {
        let path = req.uri().path().to_owned();
        let web = req
            .headers()
            .get("content-type")
            .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc-web"));
        let got = exchange(client, req).await;
        assert_eq!(got, (answer.0, answer.1.map(str::to_owned)), "{what}");
        let l = line_for(&lines, &path);
        assert_eq!(l["status"], line.0, "{what}: {l}");
        match line.1 {
            Some(code) => assert_eq!(l["grpc_status"], code, "{what}: {l}"),
            None => assert!(l.get("grpc_status").is_none(), "{what}: {l}"),
        }
        match web {
            true => assert_eq!(l["grpc_web"], true, "{what}: {l}"),
            false => assert!(l.get("grpc_web").is_none(), "{what}: {l}"),
        }
    }

    let _ = std::fs::remove_dir_all(&dir);
}

/// Started with `--request-body-timeout-secs 1`, the binary cuts a body that stalls: the
/// client gets 408, the line says `client_timeout: body_deadline` (a request with no body
/// has no such field), and `/metrics` counts it.
#[tokio::test]
async fn a_body_cut_as_too_slow_is_logged_and_counted_with_its_reason() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let echo = echo_backend("plain").await;
    let port = free_port();
    let admin = free_port();
    let dir = std::env::temp_dir().join(format!(
        "tollgate-proxy-slow-body-log-{}-{port}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let t = table(
        1,
        vec![http_port(
            port,
            vec![route("plain", "/", vec![wb("plain", 1)])],
        )],
        vec![("plain", backend_of(&[&echo]))],
    );
    let (_proxy, lines) = start_binary(
        &dir.join("table.json"),
        &t,
        admin,
        &["--request-body-timeout-secs", "1"],
    );
    let base = format!("http://127.0.0.1:{port}");
    let h1 = h1_client();
    until_served(&h1, &format!("{base}/ready")).await;
    let ready = line_for(&lines, "/ready");
    assert!(ready.get("client_timeout").is_none(), "{ready}");

    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(b"POST /upload HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\nfirst")
        .await
        .unwrap();
    let mut out = vec![0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut out))
        .await
        .expect("no answer to the stalled body")
        .unwrap();
    let answer = String::from_utf8_lossy(&out[..n]).into_owned();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    let line = line_for(&lines, "/upload");
    assert_eq!(line["status"], 408, "{line}");
    assert_eq!(line["client_timeout"], "body_deadline", "{line}");

    let metrics = get(&h1, &format!("http://127.0.0.1:{admin}/metrics")).await;
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(
        text.contains(r#"tollgate_client_timeouts_total{kind="body_deadline"} 1"#),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A GET whose first endpoint refuses the connection, retried on the second: the line says
/// which endpoint failed and how (`retried`), and `upstream` is the one that answered; a
/// line of a request not retried has no such field.
#[tokio::test]
async fn a_retried_request_names_each_failed_attempt() {
    let live = echo_backend("live").await;
    let gone: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let port = free_port();
    let dir = std::env::temp_dir().join(format!(
        "tollgate-proxy-retry-log-{}-{port}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let ep = |a: std::net::SocketAddr| tollgate_api::Endpoint {
        ip: a.ip().to_string(),
        port: a.port(),
    };
    let backend = Backend {
        tls: None,
        protocol: BackendProtocol::Http1,
        load_balancer: LoadBalancer::RoundRobin,
        settings: Default::default(),
        endpoints: vec![ep(gone), ep(live.addr)],
    };
    let mut r = route("r", "/", vec![wb("b", 1)]);
    r.retry = Some(tollgate_api::Retry {
        attempts: 2,
        backoff_ms: 1,
        codes: vec![],
    });
    let plain = route("plain", "/plain", vec![wb("l", 1)]);
    let t = table(
        1,
        vec![http_port(port, vec![plain, r])],
        vec![("b", backend), ("l", backend_of(&[&live]))],
    );
    let (_proxy, lines) = start_binary(&dir.join("table.json"), &t, free_port(), &[]);
    let c = h1_client();
    let base = format!("http://127.0.0.1:{port}");
    until_served(&c, &format!("{base}/first")).await;
    let l = line_for(&lines, "/first");
    assert_eq!(
        l["retried"],
        serde_json::json!([format!("{gone} connect")]),
        "{l}"
    );
    assert_eq!(l["upstream"], live.addr.to_string(), "{l}");
    // A route without retries: no field.
    assert_eq!(
        get(&c, &format!("{base}/plain")).await.status,
        StatusCode::OK
    );
    let l = line_for(&lines, "/plain");
    assert!(l.get("retried").is_none(), "{l}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_request_a_shadow_limit_would_have_refused_names_the_limit() {
    let echo = echo_backend("app").await;
    let port = free_port();
    let dir = std::env::temp_dir().join(format!(
        "tollgate-proxy-shadow-log-{}-{port}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let mut r = route("r", "/", vec![wb("app", 1)]);
    r.policy = Some("p".into());
    let mut t = table(
        1,
        vec![http_port(port, vec![r])],
        vec![("app", backend_of(&[&echo]))],
    );
    // One request a minute on /limited, in shadow mode.
    let limit = tollgate_api::policy::RateLimit {
        id: "default/limits/try".into(),
        rates: vec![tollgate_api::policy::Rate {
            limit: 1,
            window_ms: 60_000,
        }],
        algorithm: Default::default(),
        counters: vec![],
        when: vec!["request.url_path.startsWith('/limited')".into()],
        cost: None,
        cost_max_body_bytes: None,
        mode: tollgate_api::policy::LimitMode::Shadow,
    };
    t.policies.insert(
        "p".into(),
        tollgate_api::PolicySet {
            auth: None,
            rate_limits: vec![limit],
        },
    );
    let (_proxy, lines) = start_binary(&dir.join("table.json"), &t, free_port(), &[]);
    let c = h1_client();
    let base = format!("http://127.0.0.1:{port}");
    until_served(&c, &format!("{base}/ready")).await;
    for (path, shadow_limited) in [
        ("/limited/1", None),
        (
            "/limited/2",
            Some(serde_json::json!(["default/limits/try"])),
        ),
    ] {
        assert_eq!(
            get(&c, &format!("{base}{path}")).await.status,
            StatusCode::OK,
            "shadow limits never refuse"
        );
        let l = line_for(&lines, path);
        assert_eq!(l.get("shadow_limited").cloned(), shadow_limited, "{l}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--access-log-format logfmt`, `--access-log-fields` and `--access-log-filter` on the binary:
/// only the requests the filter keeps are written, with only the chosen fields, as logfmt; and
/// `--access-log-file` writes them to a file instead of stdout. A filter that does not compile
/// stops the binary before it serves.
#[tokio::test]
async fn the_access_log_writes_the_chosen_requests_fields_and_format() {
    let echo = echo_backend("e").await;
    let port = free_port();
    let dir = std::env::temp_dir().join(format!(
        "tollgate-proxy-log-flags-{}-{port}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let t = table(
        1,
        vec![http_port(port, vec![route("r", "/app", vec![wb("e", 1)])])],
        vec![("e", backend_of(&[&echo]))],
    );
    let log_file = dir.join("access.log");
    let (_proxy, stdout) = start_binary(
        &dir.join("table.json"),
        &t,
        free_port(),
        &[
            "--access-log-format",
            "logfmt",
            "--access-log-fields",
            "status,path,method",
            "--access-log-filter",
            "response.code >= 400 && request.path != '/ignored'",
            "--access-log-file",
            log_file.to_str().unwrap(),
        ],
    );
    let c = h1_client();
    let base = format!("http://127.0.0.1:{port}");
    until_served(&c, &format!("{base}/app/ok")).await;
    for path in [
        "/app/fine",
        "/missing",
        "/ignored",
        "/app/also-fine",
        "/gone",
    ] {
        get(&c, &format!("{base}{path}")).await;
    }
    // Bounded wait for the writer (it writes every 50 ms): the two 404s it keeps.
    let want = "method=GET path=/missing status=404\nmethod=GET path=/gone status=404\n";
    let mut text = String::new();
    for _ in 0..200 {
        text = std::fs::read_to_string(&log_file).unwrap_or_default();
        if text.len() >= want.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(text, want);
    assert!(
        stdout.try_recv().is_err(),
        "a line went to stdout despite --access-log-file"
    );

    let bad = Command::new(env!("CARGO_BIN_EXE_tollgate-proxy"))
        .arg("--table")
        .arg(dir.join("table.json"))
        .args(["--admin", &format!("127.0.0.1:{}", free_port())])
        .args(["--access-log-filter", "auth.identity.sub == 'x'"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("--access-log-filter"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
