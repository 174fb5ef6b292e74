//! Socket tests of the gateway's own answers to gRPC clients: a request whose Content-Type is
//! `application/grpc` that the gateway answers itself (no route, no valid backend, no
//! endpoint, an upstream that cannot be reached) gets a gRPC Trailers-Only answer (HTTP 200,
//! `grpc-status`, `grpc-message`, the stream ended by its HEADERS frame); other clients, and
//! answers that come from an upstream, are left as they are.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use bytes::Bytes;
use common::*;
use http::StatusCode;
use http_body_util::Full;
use hyper::body::Body as _;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tollgate_api::{Endpoint, WeightedBackend};

fn grpc_status(a: &Answer) -> (StatusCode, Option<&str>, Option<&str>) {
    let h = |n: &str| a.headers.get(n).and_then(|v| v.to_str().ok());
    (a.status, h("grpc-status"), h("grpc-message"))
}

/// A port nothing listens on (bound, then closed).
fn closed_endpoint() -> Endpoint {
    Endpoint {
        ip: "127.0.0.1".into(),
        port: free_port(),
    }
}

#[tokio::test]
async fn the_gateways_own_answers_to_grpc_clients_are_grpc_statuses() {
    let b = echo_backend("b").await;
    let mut unreachable = backend_of(&[]);
    unreachable.endpoints.push(closed_endpoint());
    let unresolved = WeightedBackend {
        backend: None,
        weight: 1,
        filters: vec![],
    };
    let (_p, url, metrics) = proxy_with_metrics(
        vec![
            route("ok", "/svc.Ok/", vec![wb("b", 1)]),
            route("invalid", "/svc.Invalid/", vec![unresolved]),
            route("empty", "/svc.Empty/", vec![wb("none", 1)]),
            route("down", "/svc.Down/", vec![wb("down", 1)]),
        ],
        vec![
            ("b", backend_of(&[&b])),
            ("none", backend_of(&[])),
            ("down", unreachable),
        ],
    )
    .await;
    let c = h2c_client();
    let cases = [
        ("/other.Svc/Call", "12", "Not Found", StatusCode::NOT_FOUND),
        (
            "/svc.Invalid/Call",
            "14",
            "no valid backend",
            StatusCode::INTERNAL_SERVER_ERROR,
        ),
        (
            "/svc.Empty/Call",
            "14",
            "Service Unavailable",
            StatusCode::SERVICE_UNAVAILABLE,
        ),
        (
            "/svc.Down/Call",
            "14",
            "Bad Gateway",
            StatusCode::BAD_GATEWAY,
        ),
    ];
    for (path, code, message, http_status) in cases {
        let a = send(&c, grpc_call(&format!("{url}{path}"), "application/grpc")).await;
        assert_eq!(
            grpc_status(&a),
            (StatusCode::OK, Some(code), Some(message)),
            "{path}: {a:?}"
        );
        assert_eq!(a.headers["content-type"], "application/grpc", "{path}");
        assert!(a.body.is_empty(), "{path}: {a:?}");
        assert!(a.headers.contains_key("x-request-id"), "{path}");
        // Any gRPC content type; a plain client keeps the HTTP answer.
        let a = send(
            &c,
            grpc_call(&format!("{url}{path}"), "application/grpc+proto"),
        )
        .await;
        assert_eq!(a.headers["grpc-status"], code, "{path}");
        let a = send(&c, grpc_call(&format!("{url}{path}"), "application/json")).await;
        assert_eq!(grpc_status(&a), (http_status, None, None), "{path}");
        assert_eq!(a.headers["content-type"], "text/plain; charset=utf-8");
    }
    // Only a POST is a gRPC call (a CONNECT must keep its non-2xx answer).
    let mut get = grpc_call(&format!("{url}/other.Svc/Call"), "application/grpc");
    *get.method_mut() = http::Method::GET;
    let a = send(&c, get).await;
    assert_eq!(grpc_status(&a), (StatusCode::NOT_FOUND, None, None));
    // gRPC-Web clients read the status in the head too, in their own content type
    // (tests/grpc_web.rs has the rest of gRPC-Web).
    let a = send(
        &c,
        grpc_call(
            &format!("{url}/other.Svc/Call"),
            "application/grpc-web+proto",
        ),
    )
    .await;
    assert_eq!(
        grpc_status(&a),
        (StatusCode::OK, Some("12"), Some("Not Found"))
    );
    assert_eq!(a.headers["content-type"], "application/grpc-web+proto");
    // A routed call reaches the upstream, whose answer passes untouched.
    let a = send(
        &c,
        grpc_call(&format!("{url}/svc.Ok/Call"), "application/grpc"),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.json()["path"], "/svc.Ok/Call");
    assert!(a.headers.get("grpc-status").is_none(), "{a:?}");
    // Metrics count each answer by what it means, not by the 200 it went out as.
    let text = metrics.encode();
    for line in [
        // Per path two gRPC calls and a JSON one; the GET and the gRPC-Web call.
        r#"tollgate_requests_total{route="none",code_class="4xx"} 5"#,
        r#"tollgate_requests_total{route="default/invalid",code_class="5xx"} 3"#,
        r#"tollgate_requests_total{route="default/ok",code_class="2xx"} 1"#,
    ] {
        assert!(
            eventually(|| metrics.encode().contains(line)).await,
            "{line} in:\n{text}"
        );
    }
}

/// A Trailers-Only answer is one HEADERS frame that ends the stream: the response arrives
/// with its body already at its end (a DATA frame after it would make gRPC clients read
/// `grpc-status` as initial metadata and fail the call for want of trailers).
#[tokio::test]
async fn a_grpc_status_answer_ends_the_stream_with_its_headers() {
    let (_p, url) = proxy_with(vec![], vec![]).await;
    let addr = url.trim_start_matches("http://").to_owned();
    let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let resp = sender
        .send_request(grpc_call(&format!("{url}/svc.A/B"), "application/grpc"))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["grpc-status"], "12");
    assert!(resp.body().is_end_stream(), "{resp:?}");
}

/// An upstream's own error answer to a gRPC call is its business: not rewritten.
#[tokio::test]
async fn an_upstreams_error_answer_to_a_grpc_call_passes_untouched() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|_req| async {
                    let mut r = http::Response::new(Full::new(Bytes::from_static(b"busy")));
                    *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                    Ok::<_, std::convert::Infallible>(r)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    let busy = backend_at(addr);
    let (_p, url) = proxy_with(
        vec![route("busy", "/", vec![wb("busy", 1)])],
        vec![("busy", busy)],
    )
    .await;
    let a = send(
        &h2c_client(),
        grpc_call(&format!("{url}/svc.A/B"), "application/grpc"),
    )
    .await;
    assert_eq!(
        grpc_status(&a),
        (StatusCode::SERVICE_UNAVAILABLE, None, None)
    );
    assert_eq!(&a.body[..], b"busy");
}

/// The gateway's timeouts are deadlines: `DEADLINE_EXCEEDED`, over HTTP/1.1 as over HTTP/2.
#[tokio::test]
async fn a_gateway_timeout_is_deadline_exceeded_over_either_http_version() {
    let b = slow_backend("b", 300).await;
    let mut r = route("slow", "/", vec![wb("b", 1)]);
    r.timeouts = tollgate_api::Timeouts {
        request_ms: Some(50),
        backend_request_ms: None,
    };
    let (_p, url) = proxy_with(vec![r], vec![("b", backend_of(&[&b]))]).await;
    for c in [h2c_client(), h1_client()] {
        let a = send(
            &c,
            grpc_call(&format!("{url}/svc.Slow/Call"), "application/grpc"),
        )
        .await;
        assert_eq!(
            grpc_status(&a),
            (StatusCode::OK, Some("4"), Some("Gateway Timeout")),
            "{a:?}"
        );
        assert!(a.body.is_empty());
    }
}
