//! Socket tests of the request path over plain HTTP: routing, filters, header hygiene,
//! limits, and the status each failure maps to.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::Full;
use tollgate_api::{
    Cors, Filter, HeaderModifier, PathModifier, Redirect, Timeouts, UrlRewrite, WeightedBackend,
};
use tollgate_proxy::ProxyOptions;

#[tokio::test]
async fn routes_by_path_and_answers_404_without_a_match() {
    let api = echo_backend("api").await;
    let (_p, url) = proxy_with(
        vec![route("api", "/api", vec![wb("api", 1)])],
        vec![("api", backend_of(&[&api]))],
    )
    .await;
    let c = h1_client();
    let ok = get(&c, &format!("{url}/api/items?x=1")).await;
    assert_eq!(ok.status, StatusCode::OK);
    assert_eq!(ok.json()["path"], "/api/items?x=1");
    assert_eq!(ok.json()["method"], "GET");
    assert_eq!(
        get(&c, &format!("{url}/other")).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get(&c, &format!("{url}/apix")).await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn serves_http2_with_prior_knowledge() {
    let b = echo_backend("b").await;
    let (_p, url) = proxy_with(
        vec![route("r", "/", vec![wb("b", 1)])],
        vec![("b", backend_of(&[&b]))],
    )
    .await;
    let c = h2c_client();
    let a = get(&c, &format!("{url}/h2")).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.json()["path"], "/h2");
    // HTTP/2 clients send :authority, not Host; the HTTP/1.1 upstream still gets a Host.
    assert!(a.upstream_header("host").unwrap().starts_with("127.0.0.1:"));
}

#[tokio::test]
async fn header_modifiers_edit_both_directions() {
    let b = echo_backend("b").await;
    let req_mod = HeaderModifier {
        set: vec![("x-set".into(), "s".into())],
        add: vec![("x-add".into(), "a".into())],
        remove: vec!["x-drop".into()],
    };
    let resp_mod = HeaderModifier {
        set: vec![("x-resp".into(), "r".into())],
        add: vec![],
        remove: vec!["x-backend".into()],
    };
    let r = with_filters(
        route("r", "/", vec![wb("b", 1)]),
        vec![
            Filter::RequestHeaderModifier(req_mod),
            Filter::ResponseHeaderModifier(resp_mod),
        ],
    );
    let (_p, url) = proxy_with(vec![r], vec![("b", backend_of(&[&b]))]).await;
    let req = Request::get(format!("{url}/"))
        .header("x-set", "old")
        .header("x-add", "first")
        .header("x-drop", "gone")
        .body(Full::default())
        .unwrap();
    let a = send(&h1_client(), req).await;
    assert_eq!(a.upstream_header("x-set").as_deref(), Some("s"));
    assert_eq!(a.upstream_header("x-add").as_deref(), Some("first, a"));
    assert_eq!(a.upstream_header("x-drop"), None);
    assert_eq!(a.headers["x-resp"], "r");
    assert!(!a.headers.contains_key("x-backend"));
}

#[tokio::test]
async fn redirect_answers_without_forwarding() {
    let b = echo_backend("b").await;
    let r = with_filters(
        route("r", "/old", vec![wb("b", 1)]),
        vec![Filter::RequestRedirect(Redirect {
            scheme: Some("https".into()),
            hostname: Some("new.example".into()),
            port: None,
            path: Some(PathModifier::ReplacePrefixMatch("/new".into())),
            status_code: 301,
        })],
    );
    let (_p, url) = proxy_with(vec![r], vec![("b", backend_of(&[&b]))]).await;
    let a = get_host(&h1_client(), &format!("{url}/old/page?q=1"), "shop.example").await;
    assert_eq!(a.status, StatusCode::MOVED_PERMANENTLY);
    assert_eq!(a.headers["location"], "https://new.example/new/page?q=1");
    assert!(a.headers.contains_key("x-request-id"));
    assert_eq!(b.hits(), 0);
}

#[tokio::test]
async fn url_rewrite_changes_path_and_host() {
    let b = echo_backend("b").await;
    let r = with_filters(
        route("r", "/v1", vec![wb("b", 1)]),
        vec![Filter::UrlRewrite(UrlRewrite {
            hostname: Some("internal.svc".into()),
            path: Some(PathModifier::ReplacePrefixMatch("/api/v1".into())),
        })],
    );
    let (_p, url) = proxy_with(vec![r], vec![("b", backend_of(&[&b]))]).await;
    let a = get_host(
        &h1_client(),
        &format!("{url}/v1/users?id=7"),
        "public.example",
    )
    .await;
    assert_eq!(a.json()["path"], "/api/v1/users?id=7");
    assert_eq!(a.upstream_header("host").as_deref(), Some("internal.svc"));
    assert_eq!(
        a.upstream_header("x-forwarded-host").as_deref(),
        Some("public.example")
    );
}

#[tokio::test]
async fn cors_preflight_is_answered_and_responses_decorated() {
    let b = echo_backend("b").await;
    let cors = Cors {
        allow_origins: vec!["https://app.example".into()],
        allow_methods: vec!["GET".into(), "PUT".into()],
        allow_headers: vec!["x-token".into()],
        max_age: 600,
        ..Cors::default()
    };
    let r = with_filters(route("r", "/", vec![wb("b", 1)]), vec![Filter::Cors(cors)]);
    let (_p, url) = proxy_with(vec![r], vec![("b", backend_of(&[&b]))]).await;
    let c = h1_client();
    let pre = Request::options(format!("{url}/x"))
        .header("origin", "https://app.example")
        .header("access-control-request-method", "PUT")
        .body(Full::default())
        .unwrap();
    let a = send(&c, pre).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(
        a.headers["access-control-allow-origin"],
        "https://app.example"
    );
    assert!(a.headers.contains_key("access-control-allow-methods"));
    assert_eq!(b.hits(), 0, "preflight must not reach the backend");
    let actual = Request::get(format!("{url}/x"))
        .header("origin", "https://app.example")
        .body(Full::default())
        .unwrap();
    let a = send(&c, actual).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(
        a.headers["access-control-allow-origin"],
        "https://app.example"
    );
    assert_eq!(b.hits(), 1);
}

#[tokio::test]
async fn sets_forwarded_headers_and_request_id() {
    let b = echo_backend("b").await;
    let (_p, url) = proxy_with(
        vec![route("r", "/", vec![wb("b", 1)])],
        vec![("b", backend_of(&[&b]))],
    )
    .await;
    let c = h1_client();
    let req = Request::get(format!("{url}/"))
        .header("host", "shop.example:8080")
        .header("x-forwarded-for", "203.0.113.9")
        .header("x-forwarded-proto", "https")
        .body(Full::default())
        .unwrap();
    let a = send(&c, req).await;
    assert_eq!(
        a.upstream_header("x-forwarded-for").as_deref(),
        Some("203.0.113.9, 127.0.0.1")
    );
    assert_eq!(
        a.upstream_header("x-forwarded-proto").as_deref(),
        Some("http")
    );
    assert_eq!(
        a.upstream_header("x-forwarded-host").as_deref(),
        Some("shop.example:8080")
    );
    assert_eq!(
        a.upstream_header("host").as_deref(),
        Some("shop.example:8080")
    );
    let generated = a.upstream_header("x-request-id").unwrap();
    assert_eq!(generated.len(), 32);
    assert!(generated.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(a.headers["x-request-id"], generated.as_str());

    // A client's sane id passes both ways; a Connection header naming it does not lose it
    // (it was read on arrival).
    for (connection, id) in [
        ("keep-alive", "client-id-42"),
        ("x-request-id", "client-id-43"),
    ] {
        let req = Request::get(format!("{url}/"))
            .header("connection", connection)
            .header("x-request-id", id)
            .body(Full::default())
            .unwrap();
        let a = send(&c, req).await;
        assert_eq!(a.upstream_header("x-request-id").as_deref(), Some(id));
        assert_eq!(a.headers["x-request-id"], id);
    }
}

#[tokio::test]
async fn strips_hop_by_hop_headers_both_ways() {
    let b = echo_backend("b").await;
    let (_p, url) = proxy_with(
        vec![route("r", "/", vec![wb("b", 1)])],
        vec![("b", backend_of(&[&b]))],
    )
    .await;
    let req = Request::get(format!("{url}/"))
        .header("connection", "keep-alive, x-private")
        .header("x-private", "1")
        .header("keep-alive", "timeout=5")
        .header("proxy-connection", "keep-alive")
        .header("te", "trailers")
        .header("upgrade", "h2c")
        .header("x-end-to-end", "kept")
        .body(Full::default())
        .unwrap();
    let a = send(&h1_client(), req).await;
    for gone in [
        "x-private",
        "keep-alive",
        "proxy-connection",
        "upgrade",
        "transfer-encoding",
    ] {
        assert_eq!(a.upstream_header(gone), None, "{gone} reached the backend");
    }
    assert_eq!(a.upstream_header("te").as_deref(), Some("trailers"));
    assert_eq!(a.upstream_header("x-end-to-end").as_deref(), Some("kept"));
    // The backend answers with `Connection: x-hop`, `X-Hop` and `Keep-Alive`.
    assert!(!a.headers.contains_key("x-hop"));
    assert!(!a.headers.contains_key("keep-alive"));
    assert_eq!(a.headers["x-backend"], "b");
}

/// An echo backend behind a proxy whose request body idle timeout is 1 s.
async fn proxy_with_a_1s_body_idle_timeout() -> (EchoBackend, tollgate_proxy::Proxy, String) {
    let b = echo_backend("b").await;
    let opts = ProxyOptions {
        request_body_idle_timeout: std::time::Duration::from_secs(1),
        ..ProxyOptions::default()
    };
    let (p, url) = proxy_with_options(
        opts,
        vec![route("r", "/", vec![wb("b", 1)])],
        vec![("b", backend_of(&[&b]))],
    )
    .await;
    (b, p, url)
}

/// A client that stops sending a request body it announced (1 s idle timeout here) gets 408
/// and the upstream request is abandoned; one that sends slowly but steadily (every 300 ms,
/// for longer than the timeout in all) is served.
#[tokio::test]
async fn a_stalled_request_body_gets_408_and_a_slow_one_is_served() {
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (_b, _p, url) = proxy_with_a_1s_body_idle_timeout().await;
    let addr = url.trim_start_matches("http://").to_owned();

    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    s.write_all(b"POST /stall HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\nhello")
        .await
        .unwrap();
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut out)).await;
    let out = String::from_utf8_lossy(&out);
    assert!(read.is_ok(), "no answer 20 s into the stall: {out:?}");
    assert!(out.starts_with("HTTP/1.1 408"), "{out}");

    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    s.write_all(
        b"POST /slow HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: 8\r\n\r\n",
    )
    .await
    .unwrap();
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        s.write_all(b"z").await.unwrap();
    }
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.contains("zzzzzzzz"), "{out}");
}

/// An HTTP/2 request body (a gRPC stream) may pause longer than the idle timeout: it is
/// not cut off.
#[tokio::test]
async fn an_http2_request_body_may_pause() {
    use std::time::Duration;
    let (_b, _p, url) = proxy_with_a_1s_body_idle_timeout().await;
    let mut sender = h2_connection(&url).await;
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(1);
    let frames = futures_util::stream::unfold(rx, |mut rx| async move {
        let data = rx.recv().await?;
        Some((
            Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(data)),
            rx,
        ))
    });
    let body = http_body_util::StreamBody::new(Box::pin(frames));
    let req = Request::post(format!("{url}/stream")).body(body).unwrap();
    let answer = tokio::spawn(async move { sender.send_request(req).await });
    tx.send(Bytes::from_static(b"a")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    tx.send(Bytes::from_static(b"b")).await.unwrap();
    drop(tx);
    let resp = answer.await.unwrap().unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["body"], "ab");
}

#[tokio::test]
async fn oversized_headers_get_431_and_bodies_413() {
    let b = echo_backend("b").await;
    let opts = ProxyOptions {
        max_header_bytes: 16 * 1024,
        max_body_bytes: 1024,
        ..ProxyOptions::default()
    };
    let (_p, url) = proxy_with_options(
        opts,
        vec![route("r", "/", vec![wb("b", 1)])],
        vec![("b", backend_of(&[&b]))],
    )
    .await;
    let c = h1_client();
    let big = "v".repeat(20 * 1024);
    let req = Request::get(format!("{url}/"))
        .header("x-big", big.as_str())
        .body(Full::default());
    assert_eq!(
        send(&c, req.unwrap()).await.status,
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
    );
    // Just over the configured limit: 431 too (the server stops reading the head there).
    let mid = "v".repeat(16 * 1024);
    let req = Request::get(format!("{url}/"))
        .header("x-mid", mid.as_str())
        .body(Full::default());
    let a = send(&h1_client(), req.unwrap()).await;
    assert_eq!(a.status, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);

    let body = Bytes::from(vec![b'x'; 4096]);
    let req = Request::post(format!("{url}/"))
        .body(Full::new(body.clone()))
        .unwrap();
    assert_eq!(
        send(&h1_client(), req).await.status,
        StatusCode::PAYLOAD_TOO_LARGE
    );
    // Chunked: no Content-Length, the limit trips while streaming.
    let raw_req = format!(
        "POST / HTTP/1.1\r\nhost: x\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n1000\r\n{}\r\n0\r\n\r\n",
        "y".repeat(4096)
    );
    let out = raw(&url, raw_req.as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 413"), "{out}");
    // A chunked body under the limit streams through (re-framed by the upstream client).
    let out = raw(
        &url,
        b"POST / HTTP/1.1\r\nhost: x\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.contains(r#""body":"abcde""#), "{out}");
    let ok = Request::post(format!("{url}/")).body(Full::new(Bytes::from_static(b"small")));
    let a = send(&h1_client(), ok.unwrap()).await;
    assert_eq!(a.json()["body"], "small");
    assert_eq!(
        b.seen.lock().unwrap().len(),
        2,
        "oversized bodies never reached the backend"
    );
}

#[tokio::test]
async fn malformed_requests_get_4xx() {
    let b = echo_backend("b").await;
    let (_p, url) = proxy_with(
        vec![route("r", "/", vec![wb("b", 1)])],
        vec![("b", backend_of(&[&b]))],
    )
    .await;
    let out = raw(
        &url,
        b"GET / HTTP/1.1\r\nhost: x\r\ncontent-length: nope\r\n\r\n",
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 400"), "{out}");
    let out = raw(&url, b"\x16\x03\x01garbage\r\n\r\n").await;
    assert!(out.is_empty() || out.starts_with("HTTP/1.1 400"), "{out}");
    // The proxy is still serving.
    assert_eq!(
        get(&h1_client(), &format!("{url}/")).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn unresolved_backend_share_gets_500() {
    let unresolved = WeightedBackend {
        backend: None,
        weight: 1,
        filters: vec![],
    };
    let (_p, url) = proxy_with(vec![route("r", "/", vec![unresolved])], vec![]).await;
    let a = get(&h1_client(), &format!("{url}/")).await;
    assert_eq!(a.status, StatusCode::INTERNAL_SERVER_ERROR);
}

#[tokio::test]
async fn no_endpoints_gets_503() {
    let (_p, url) = proxy_with(
        vec![route("r", "/", vec![wb("b", 1)])],
        vec![("b", backend_of(&[]))],
    )
    .await;
    let a = get(&h1_client(), &format!("{url}/")).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn dead_upstream_gets_502() {
    let port = free_port();
    let dead = backend_at(([127, 0, 0, 1], port).into());
    let (p, url) = proxy_with(vec![route("r", "/", vec![wb("b", 1)])], vec![("b", dead)]).await;
    let a = get(&h1_client(), &format!("{url}/")).await;
    assert_eq!(a.status, StatusCode::BAD_GATEWAY);
    drop(p);
}

#[tokio::test]
async fn backend_timeout_and_request_timeout_get_504() {
    let b = echo_backend("b").await;
    let mut per_try = route("try", "/try", vec![wb("b", 1)]);
    per_try.timeouts = Timeouts {
        request_ms: None,
        backend_request_ms: Some(50),
    };
    let mut whole = route("whole", "/whole", vec![wb("b", 1)]);
    whole.timeouts = Timeouts {
        request_ms: Some(50),
        backend_request_ms: None,
    };
    let mut fast = route("fast", "/fast", vec![wb("b", 1)]);
    fast.timeouts = Timeouts {
        request_ms: Some(5000),
        backend_request_ms: Some(5000),
    };
    let (_p, url) = proxy_with(vec![per_try, whole, fast], vec![("b", backend_of(&[&b]))]).await;
    let c = h1_client();
    let slow = |path: &str| {
        Request::get(format!("{url}{path}"))
            .header("x-delay-ms", "300")
            .body(Full::default())
            .unwrap()
    };
    assert_eq!(
        send(&c, slow("/try")).await.status,
        StatusCode::GATEWAY_TIMEOUT
    );
    assert_eq!(
        send(&c, slow("/whole")).await.status,
        StatusCode::GATEWAY_TIMEOUT
    );
    assert_eq!(send(&c, slow("/fast")).await.status, StatusCode::OK);
}

#[tokio::test]
async fn oversized_headers_over_http2_get_431() {
    let b = echo_backend("b").await;
    let opts = ProxyOptions {
        max_header_bytes: 16 * 1024,
        ..ProxyOptions::default()
    };
    let (_p, url) = proxy_with_options(
        opts,
        vec![route("r", "/", vec![wb("b", 1)])],
        vec![("b", backend_of(&[&b]))],
    )
    .await;
    let c = h2c_client();
    let big = "v".repeat(20 * 1024);
    let req = Request::get(format!("{url}/"))
        .header("x-big", big.as_str())
        .body(Full::default())
        .unwrap();
    // hyper's h2 server (max_header_list_size) answers the stream with 431.
    let a = send(&c, req).await;
    assert_eq!(a.status, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    assert_eq!(b.hits(), 0);
    assert_eq!(get(&c, &format!("{url}/")).await.status, StatusCode::OK);
}

#[tokio::test]
async fn upstream_that_resets_gets_502() {
    // Accepts, reads the request, and hangs up without answering.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let mut buf = [0u8; 1024];
            let _ = tokio::io::AsyncReadExt::read(&mut s, &mut buf).await;
            drop(s);
        }
    });
    let rude = backend_at(addr);
    let metrics = metrics();
    let opts = ProxyOptions {
        metrics: metrics.clone(),
        ..ProxyOptions::default()
    };
    let (_p, url) = proxy_with_options(
        opts,
        vec![route("r", "/", vec![wb("b", 1)])],
        vec![("b", rude)],
    )
    .await;
    let a = get(&h1_client(), &format!("{url}/")).await;
    assert_eq!(a.status, StatusCode::BAD_GATEWAY);
    assert!(
        metrics
            .encode()
            .contains(r#"tollgate_upstream_errors_total{kind="reset"} 1"#)
    );
}

#[tokio::test]
async fn backend_filters_apply_only_to_the_picked_backend() {
    let (a, b) = (echo_backend("a").await, echo_backend("b").await);
    let mut to_a = wb("a", 1);
    to_a.filters = vec![Filter::RequestHeaderModifier(HeaderModifier {
        set: vec![("x-picked".into(), "a".into())],
        ..HeaderModifier::default()
    })];
    let (_p, url) = proxy_with(
        vec![route("r", "/", vec![to_a, wb("b", 1)])],
        vec![("a", backend_of(&[&a])), ("b", backend_of(&[&b]))],
    )
    .await;
    let c = h1_client();
    for _ in 0..40 {
        let ans = get(&c, &format!("{url}/")).await;
        let expected = (ans.json()["backend"] == "a").then_some("a");
        assert_eq!(ans.upstream_header("x-picked").as_deref(), expected);
    }
    assert!(a.hits() > 0 && b.hits() > 0);
}

/// Reads from `s` until `buf` holds a whole response head plus a `Content-Length` body (or
/// the connection closes); returns the head.
async fn read_response(s: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let len: usize = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse().unwrap())
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                return text[..end].to_owned();
            }
        }
        match s.read(&mut chunk).await.unwrap() {
            0 => return text,
            n => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A client that stalls in the middle of a request head is disconnected (a header read
/// timeout is answered with a close, no status, as hyper did) once the timeout (30 s) has passed since the
/// previous answer, not earlier, although the connection's timer was armed, while the
/// previous head was awaited, for an earlier deadline. Paused time: the runtime skips ahead
/// whenever every task waits, so the test takes no 30 s.
#[tokio::test(start_paused = true)]
async fn a_stalled_request_head_is_closed_after_the_header_read_timeout() {
    use tokio::io::AsyncWriteExt;
    let (_p, _b, mut s) = proxy_and_connection_after_a_404_request().await;
    assert!(read_response(&mut s).await.starts_with("HTTP/1.1 404"));
    // The proxy now awaits the second head (timer armed for 30 s from here); it comes 10 s in.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    tokio::time::advance(std::time::Duration::from_secs(10)).await;
    s.write_all(NOPE_REQUEST).await.unwrap();
    assert!(read_response(&mut s).await.starts_with("HTTP/1.1 404"));
    let answered = tokio::time::Instant::now();
    s.write_all(b"GET /nope HTTP/1.1\r\nHost:").await.unwrap();
    let rest = read_response(&mut s).await;
    assert!(rest.is_empty(), "{rest}");
    assert!(answered.elapsed() >= std::time::Duration::from_secs(30));
}
