//! gRPC-Web through the `tollgate` binary: `run` on examples/grpc as its header comment says
//! (a gRPC-Web call over HTTP/1.1 reaches the backend as gRPC over HTTP/2, the annotation's
//! origin gets its preflight answered and another origin does not), `run` translating a real
//! gRPC answer back (trailers as the last message), and `validate` failing on a CORS
//! annotation it cannot read.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::convert::Infallible;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use support::{
    Tollgate, eventually, free_port, gateway_yaml, post_h2c, send_with, temp_dir, workspace,
};

const WAIT: Duration = Duration::from_secs(60);

/// A gRPC-Web call over HTTP/1.1 (as a browser sends it) with a raw body.
fn web_call(port: u16, path: &str, content_type: &str, body: &[u8]) -> Option<support::Resp> {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\
         content-type: {content_type}\r\nx-grpc-web: 1\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).ok()?;
    s.write_all(body).ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    support::parse_raw(&raw)
}

#[test]
fn run_serves_the_grpc_example_to_browsers() {
    let logs = temp_dir("grpc-web-example");
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
    let path = "/helloworld.Greeter/SayHello";
    let r = eventually(WAIT, || {
        web_call(8083, path, "application/grpc-web-text", b"AAAAAAA=").filter(|r| r.status == 200)
    })
    .unwrap_or_else(|| panic!("gRPC-Web never served; log:\n{}", tg.log()));
    // The demo backend describes what it received: a gRPC call over HTTP/2, the message
    // decoded (5 bytes from 8 of base64).
    let doc = r.json();
    assert_eq!(doc["protocol"], "HTTP/2.0", "{doc}");
    assert_eq!(doc["headers"]["content-type"], "application/grpc", "{doc}");
    assert_eq!(doc["headers"]["te"], "trailers", "{doc}");
    assert_eq!(doc["bodyBytes"], 5, "{doc}");

    let preflight = |origin: &str| {
        send_with(
            8083,
            "OPTIONS",
            "127.0.0.1",
            path,
            &[
                ("origin", origin),
                ("access-control-request-method", "POST"),
                ("access-control-request-headers", "content-type,x-grpc-web"),
            ],
        )
        .unwrap()
    };
    let ok = preflight("http://localhost:3000");
    assert_eq!(ok.status, 200, "{ok:?}");
    assert_eq!(
        ok.header("access-control-allow-origin"),
        Some("http://localhost:3000")
    );
    assert_eq!(ok.header("access-control-allow-methods"), Some("POST"));
    let refused = preflight("https://elsewhere.example");
    assert_eq!(refused.status, 200, "{refused:?}");
    assert_eq!(refused.header("access-control-allow-origin"), None);
}

/// An h2c upstream answering like a gRPC server: one message `ok`, then `grpc-status: 0` in
/// the trailers.
fn grpc_upstream(rt: &tokio::runtime::Runtime) -> u16 {
    use http_body_util::StreamBody;
    use hyper::body::Frame;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    rt.spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let svc = hyper::service::service_fn(|_req| async {
                let mut trailers = http::HeaderMap::new();
                trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                let frames = vec![
                    Ok::<_, Infallible>(Frame::data(bytes::Bytes::from_static(b"\0\0\0\0\x02ok"))),
                    Ok(Frame::trailers(trailers)),
                ];
                let body = StreamBody::new(futures_util::stream::iter(frames));
                let resp = http::Response::builder()
                    .header("content-type", "application/grpc")
                    .body(body)
                    .unwrap();
                Ok::<_, Infallible>(resp)
            });
            tokio::spawn(
                hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc),
            );
        }
    });
    port
}

fn files(dir: &std::path::Path, gw_port: u16, upstream: u16, annotation: &str) {
    let yaml = format!(
        r#"{gateway}---
apiVersion: v1
kind: Service
metadata: {{name: greeter, namespace: default}}
spec:
  ports: [{{name: grpc, port: 80, appProtocol: grpc}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: greeter-1
  namespace: default
  labels: {{kubernetes.io/service-name: greeter}}
addressType: IPv4
ports: [{{name: grpc, port: {upstream}}}]
endpoints:
- addresses: ["127.0.0.1"]
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata:
  name: greeter
  namespace: default
  annotations: {{tollgate.dev/cors: '{annotation}'}}
spec:
  parentRefs: [{{name: gw}}]
  rules:
  - backendRefs: [{{name: greeter, port: 80}}]
"#,
        gateway = gateway_yaml(gw_port),
    );
    std::fs::write(dir.join("all.yaml"), yaml).unwrap();
}

/// A real gRPC answer comes back as gRPC-Web through `tollgate run`, over HTTP/2 too: the
/// message, then the trailers as a message flagged 0x80.
#[test]
fn run_translates_a_grpc_answer_to_grpc_web() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let upstream = grpc_upstream(&rt);
    let dir = temp_dir("grpc-web-run");
    let logs = temp_dir("grpc-web-run-logs");
    let gw_port = free_port();
    files(&dir, gw_port, upstream, r#"{"allowOrigins": ["*"]}"#);
    let tg = Tollgate::start(&["run", dir.to_str().unwrap(), "--admin", "off"], &logs);
    let headers = [("content-type", "application/grpc-web-text+proto")];
    let body = STANDARD.encode(b"\0\0\0\0\0");
    let r = eventually(WAIT, || {
        post_h2c(gw_port, "/pkg.Svc/Call", &headers, body.as_bytes()).filter(|r| r.status == 200)
    })
    .unwrap_or_else(|| panic!("gRPC-Web never served; log:\n{}", tg.log()));
    assert_eq!(
        r.header("content-type"),
        Some("application/grpc-web-text+proto")
    );
    assert!(r.trailers.is_empty(), "{r:?}");
    // Two pieces, each base64 on its own: the message, then the trailer frame.
    let trailer = b"\x80\0\0\0\x10grpc-status: 0\r\n";
    let want = format!(
        "{}{}",
        STANDARD.encode(b"\0\0\0\0\x02ok"),
        STANDARD.encode(trailer)
    );
    assert_eq!(r.body, want, "{r:?}");
    drop(rt);
}

#[test]
fn validate_fails_on_a_cors_annotation_it_cannot_read() {
    let dir = temp_dir("grpc-web-validate");
    files(&dir, 8080, 9080, r#"{"allowOrigin": ["*"]}"#);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("validate")
        .arg(&dir)
        .current_dir(workspace())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("default/greeter"), "{stdout}");
    assert!(stdout.contains("UnsupportedValue"), "{stdout}");
    assert!(stdout.contains("tollgate.dev/cors"), "{stdout}");
}
