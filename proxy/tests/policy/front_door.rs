//! The front door (issue: one host, normalized paths, gateway-owned headers) against a policy
//! that an attacker wants to skip: every spelling of a guarded host or path meets the policy
//! or a 400, never the backend unauthenticated; the gateway's identity headers cannot be
//! named away by `Connection`, shadowed by `X_User`, or added after the head in a trailer.

use http::StatusCode;

use crate::common::*;
use crate::support::*;

/// The status code of a raw HTTP/1 answer.
fn status_of(answer: &str) -> u16 {
    answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {answer:?}"))
}

/// A raw request with a closing connection, so `raw` returns at the answer's end.
async fn raw_status(url: &str, head: &str) -> u16 {
    status_of(&raw(url, format!("{head}Connection: close\r\n\r\n").as_bytes()).await)
}

#[tokio::test]
async fn every_spelling_of_a_guarded_host_meets_the_policy_or_a_400() {
    let app = echo_backend("app").await;
    let mut a = api_key_auth();
    a.when = vec!["request.host == 'internal.test'".into()];
    let (_p, url) = proxy_with_policies(
        &app,
        vec![guarded("site", "/", "p")],
        vec![("p", only_auth(a))],
    )
    .await;
    for host in [
        "internal.test",
        "internal.test.",
        "INTERNAL.Test.",
        "internal.test.:20080",
        "internal.test:20080",
    ] {
        let got = raw_status(&url, &format!("GET / HTTP/1.1\r\nHost: {host}\r\n")).await;
        assert_eq!(got, 401, "Host: {host}");
    }
    for (what, head) in [
        (
            "a non-numeric port",
            "GET / HTTP/1.1\r\nHost: internal.test:abc\r\n",
        ),
        (
            "a port over 65535",
            "GET / HTTP/1.1\r\nHost: internal.test:65536\r\n",
        ),
        (
            "two Host fields",
            "GET / HTTP/1.1\r\nHost: public.test\r\nHost: internal.test\r\n",
        ),
        ("HTTP/1.1 without Host", "GET / HTTP/1.1\r\n"),
        (
            "an absolute-form target naming another host",
            "GET http://public.test/ HTTP/1.1\r\nHost: internal.test\r\n",
        ),
        ("userinfo", "GET / HTTP/1.1\r\nHost: x@internal.test\r\n"),
        (
            "an empty label",
            "GET / HTTP/1.1\r\nHost: internal..test\r\n",
        ),
    ] {
        assert_eq!(raw_status(&url, head).await, 400, "{what}");
    }
    assert_eq!(app.hits(), 0, "no spelling reached the backend");
    // The public host is served, and an absolute-form target agreeing with Host too.
    assert_eq!(
        raw_status(&url, "GET / HTTP/1.1\r\nHost: public.test\r\n").await,
        200
    );
    assert_eq!(
        raw_status(
            &url,
            "GET http://public.test/ HTTP/1.1\r\nHost: Public.Test.\r\n"
        )
        .await,
        200
    );
    // HTTP/1.0 may omit Host.
    assert_eq!(raw_status(&url, "GET / HTTP/1.0\r\n").await, 200);
}

#[tokio::test]
async fn the_backend_receives_the_host_that_was_matched() {
    let app = echo_backend("app").await;
    let (_p, url) = proxy_with(
        vec![route("site", "/", vec![wb("app", 1)])],
        vec![("app", backend_of(&[&app]))],
    )
    .await;
    let c = h1_client();
    let a = get_host(&c, &format!("{url}/x"), "Public.TEST.:8080").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(
        a.upstream_header("host").as_deref(),
        Some("public.test:8080")
    );
    assert_eq!(
        a.upstream_header("x-forwarded-host").as_deref(),
        Some("public.test:8080")
    );
}

/// A route under `/admin` guarded by an API key, everything else open: the shape of the
/// shipped api-key example.
async fn admin_guarded(app: &EchoBackend) -> (tollgate_proxy::Proxy, String) {
    proxy_with_policies(
        app,
        vec![
            guarded("admin", "/admin", "p"),
            route("site", "/", vec![wb("app", 1)]),
        ],
        vec![("p", only_auth(api_key_auth()))],
    )
    .await
}

#[tokio::test]
async fn every_spelling_of_a_guarded_path_meets_the_policy() {
    let app = echo_backend("app").await;
    let (_p, url) = admin_guarded(&app).await;
    for path in [
        "/admin",
        "/%61dmin",
        "//admin",
        "/./admin",
        "/x/../admin",
        "/public/%2e%2e/admin",
        "/public/%2E%2E/admin/",
        "/%2fx/..//admin",
    ] {
        let got = raw_status(&url, &format!("GET {path} HTTP/1.1\r\nHost: a\r\n")).await;
        assert_eq!(got, 401, "{path}");
    }
    assert_eq!(
        app.hits(),
        0,
        "no spelling reached the backend unauthenticated"
    );
}

#[tokio::test]
async fn the_backend_receives_the_path_that_was_matched() {
    let app = echo_backend("app").await;
    let (_p, url) = admin_guarded(&app).await;
    let c = h1_client();
    for (sent, forwarded) in [
        ("/a/../b", "/b"),
        ("/a/%2e%2e/b", "/b"),
        ("/a/./b", "/a/b"),
        ("/%2561", "/%2561"),
        ("/a%2fb", "/a%2Fb"),
        ("/a%2Fb/../c", "/c"),
        ("//b", "/b"),
        ("/%7Euser?q=/../x", "/~user?q=/../x"),
    ] {
        let a = get_with(&c, &format!("{url}{sent}"), &[]).await;
        assert_eq!(a.status, StatusCode::OK, "{sent}");
        let got = a.json();
        assert_eq!(got["path"], forwarded, "{sent}");
    }
    let with_key = get_with(
        &c,
        &format!("{url}/public/%2e%2e/admin/x"),
        &[("x-api-key", API_KEY)],
    )
    .await;
    assert_eq!(with_key.status, StatusCode::OK);
    assert_eq!(with_key.json()["path"], "/admin/x");
    // A raw `\`, which some backends read as `/`, arrives encoded.
    let back = raw(
        &url,
        b"GET /a\\b HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status_of(&back), 200, "a raw backslash: {back}");
    assert!(back.contains(r#""path":"/a%5Cb""#), "{back}");
}

#[tokio::test]
async fn a_path_climbing_above_the_root_or_badly_escaped_is_400() {
    let app = echo_backend("app").await;
    let (_p, url) = admin_guarded(&app).await;
    for path in [
        "/..",
        "/../admin",
        "/a/../../admin",
        "/%2e%2e/admin",
        "/a%zz",
        "/a%2",
    ] {
        let got = raw_status(&url, &format!("GET {path} HTTP/1.1\r\nHost: a\r\n")).await;
        assert_eq!(got, 400, "{path}");
    }
    assert_eq!(app.hits(), 0);
}

#[tokio::test]
async fn identity_headers_cannot_be_named_away_shadowed_or_trailed() {
    let app = echo_backend("app").await;
    let (_p, url) = admin_guarded(&app).await;
    let c = h1_client();
    // `Connection: x-user` once deleted the identity the policy had just set.
    let a = get_with(
        &c,
        &format!("{url}/admin"),
        &[
            ("x-api-key", API_KEY),
            ("connection", "x-user"),
            ("x_user", "root"),
            ("x_forwarded_for", "10.0.0.1"),
        ],
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.upstream_header("x-user").as_deref(), Some("alice"));
    assert_eq!(
        a.upstream_header("x_user"),
        None,
        "an underscore name reached the backend"
    );
    assert_eq!(a.upstream_header("x_forwarded_for"), None);
    // The client's own `X-User` never passes, even when the policy does not set one.
    let open = get_with(&c, &format!("{url}/"), &[("X_User", "root")]).await;
    assert_eq!(open.upstream_header("x_user"), None);
}

/// A backend that records every byte of one connection and answers `200 ok` once it has seen
/// the end of a chunked body.
async fn recording_backend() -> (
    std::net::SocketAddr,
    tokio::sync::oneshot::Receiver<Vec<u8>>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        // The body ends with its last chunk and the (possibly empty) trailer section.
        let body_done = |seen: &[u8]| {
            let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") else {
                return false;
            };
            let body = &seen[end + 4..];
            body.windows(3).any(|w| w == b"0\r\n") && body.ends_with(b"\r\n\r\n")
        };
        while !body_done(&seen) {
            let read = tokio::time::timeout(std::time::Duration::from_secs(5), s.read(&mut buf));
            match read.await {
                Ok(Ok(n)) if n > 0 => seen.extend_from_slice(&buf[..n]),
                _ => break,
            }
        }
        let _ = s
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
            .await;
        let _ = tx.send(seen);
    });
    (addr, rx)
}

#[tokio::test]
async fn request_trailers_are_not_forwarded() {
    let (addr, seen) = recording_backend().await;
    let (_p, url) = proxy_with(
        vec![route("site", "/", vec![wb("raw", 1)])],
        vec![("raw", backend_at(addr))],
    )
    .await;
    let answer = raw(
        &url,
        b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTrailer: X-User\r\nTE: trailers\r\n\
          Connection: close\r\n\r\n\
          3\r\nabc\r\n0\r\nX-User: root\r\n\r\n",
    )
    .await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    let seen = String::from_utf8_lossy(&seen.await.unwrap()).to_ascii_lowercase();
    assert!(seen.contains("abc"), "the body reached the backend: {seen}");
    assert!(
        !seen.contains("root"),
        "a request trailer reached the backend: {seen}"
    );
}

/// A route with `request_trailers` (HTTPRoute annotation `tollgate.dev/request-trailers:
/// forward`) sends request trailers on after the last chunk, without the fields the head
/// carries (`X-User`, which the route's filter set), names with `_`, and fields the gateway
/// owns or RFC 9110 keeps out of trailers.
#[tokio::test]
async fn request_trailers_go_on_filtered_where_a_route_forwards_them() {
    use tollgate_api::{Filter, HeaderModifier};
    let (addr, seen) = recording_backend().await;
    let mut r = with_filters(
        route("site", "/", vec![wb("raw", 1)]),
        vec![Filter::RequestHeaderModifier(HeaderModifier {
            set: vec![("x-user".into(), "alice".into())],
            ..HeaderModifier::default()
        })],
    );
    r.request_trailers = true;
    let (_p, url) = proxy_with(vec![r], vec![("raw", backend_at(addr))]).await;
    let answer = raw(
        &url,
        b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
          3\r\nabc\r\n0\r\nX-Checksum: 7\r\nX-User: root\r\nX_Role: admin\r\nHost: evil\r\n\
          X-Forwarded-For: 10.0.0.1\r\nContent-Length: 99\r\n\r\n",
    )
    .await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    let seen = String::from_utf8_lossy(&seen.await.unwrap()).to_ascii_lowercase();
    assert!(
        seen.ends_with("\r\n\r\n3\r\nabc\r\n0\r\nx-checksum: 7\r\n\r\n"),
        "the backend got: {seen:?}"
    );
    assert!(seen.contains("\r\nx-user: alice\r\n"), "{seen:?}");
    // (Not a bare "99": the generated request id is hex and may hold it.)
    for forged in ["root", "admin", "evil", "10.0.0.1", "content-length: 99"] {
        assert!(
            !seen.contains(forged),
            "{forged} reached the backend: {seen:?}"
        );
    }
}

/// The same over HTTP/2 from the client: its trailers frame goes upstream as HTTP/1.1
/// trailers after the last chunk, filtered the same way.
#[tokio::test]
async fn http2_request_trailers_go_on_filtered_where_a_route_forwards_them() {
    use bytes::Bytes;
    use http_body_util::StreamBody;
    use hyper::body::Frame;
    let (addr, seen) = recording_backend().await;
    let mut r = route("site", "/", vec![wb("raw", 1)]);
    r.request_trailers = true;
    let (_p, url) = proxy_with(vec![r], vec![("raw", backend_at(addr))]).await;
    let mut sender = h2_connection(&url).await;
    let mut trailers = http::HeaderMap::new();
    trailers.insert("x-checksum", http::HeaderValue::from_static("7"));
    trailers.insert("x-request-id", http::HeaderValue::from_static("forged"));
    let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = vec![
        Ok(Frame::data(Bytes::from_static(b"abc"))),
        Ok(Frame::trailers(trailers)),
    ];
    let req = http::Request::post(format!("{url}/x"))
        .body(StreamBody::new(futures_util::stream::iter(frames)))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let seen = String::from_utf8_lossy(&seen.await.unwrap()).to_ascii_lowercase();
    assert!(
        seen.ends_with("\r\n\r\n3\r\nabc\r\n0\r\nx-checksum: 7\r\n\r\n"),
        "the backend got: {seen:?}"
    );
    assert!(!seen.contains("forged"), "{seen:?}");
}

#[tokio::test]
async fn url_rewrite_works_on_the_normalized_path() {
    use tollgate_api::{Filter, PathModifier, UrlRewrite};
    let api = echo_backend("api").await;
    let site = echo_backend("site").await;
    let rewrite = with_filters(
        route("api", "/api", vec![wb("api", 1)]),
        vec![Filter::UrlRewrite(UrlRewrite {
            hostname: None,
            path: Some(PathModifier::ReplacePrefixMatch("/v1".into())),
        })],
    );
    let (_p, url) = proxy_with(
        vec![rewrite, route("site", "/", vec![wb("site", 1)])],
        vec![("api", backend_of(&[&api])), ("site", backend_of(&[&site]))],
    )
    .await;
    let c = h1_client();
    // (sent, backend that must answer, path it must receive)
    for (sent, backend, forwarded) in [
        ("/api/../admin", "site", "/admin"),
        ("/api/%2e%2e/admin", "site", "/admin"),
        ("/api/./x", "api", "/v1/x"),
        ("/%61pi/x", "api", "/v1/x"),
        ("//api//x", "api", "/v1/x"),
        ("/api/x/../y", "api", "/v1/y"),
        ("/api%2fx", "site", "/api%2Fx"),
        ("/api/a%2fb", "api", "/v1/a%2Fb"),
        ("/api/%2561", "api", "/v1/%2561"),
    ] {
        let a = get_with(&c, &format!("{url}{sent}"), &[]).await;
        assert_eq!(a.status, StatusCode::OK, "{sent}");
        let got = a.json();
        assert_eq!(got["backend"], backend, "{sent}");
        assert_eq!(got["path"], forwarded, "{sent}");
    }
    assert_eq!(
        raw_status(&url, "GET /api/../../x HTTP/1.1\r\nHost: a\r\n").await,
        400
    );
}

/// Sends `req` on a fresh HTTP/2 (prior knowledge) connection to `addr`, whatever its
/// `:authority` names; returns the status and the body.
async fn h2_send(
    addr: &str,
    req: http::Request<http_body_util::Full<bytes::Bytes>>,
) -> (u16, String) {
    use http_body_util::BodyExt;
    let tcp = tokio::net::TcpStream::connect(addr.trim_start_matches("http://"))
        .await
        .unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let resp = send.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn http2_authority_and_host_must_agree() {
    let app = echo_backend("app").await;
    let (_p, url) = proxy_with(
        vec![route("site", "/", vec![wb("app", 1)])],
        vec![("app", backend_of(&[&app]))],
    )
    .await;
    let req = |host: Option<&str>| {
        let mut b = http::Request::get("http://Public.Test.:8443/x");
        if let Some(h) = host {
            b = b.header("host", h);
        }
        b.body(http_body_util::Full::default()).unwrap()
    };
    // `:authority` alone, in another case and with a trailing dot: normalized.
    let (status, body) = h2_send(&url, req(None)).await;
    assert_eq!(status, 200, "{body}");
    let seen: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(seen["headers"]["host"], "public.test:8443");
    // The same entity in Host: served.
    assert_eq!(h2_send(&url, req(Some("public.test:8443"))).await.0, 200);
    // A Host naming another entity than `:authority`.
    assert_eq!(h2_send(&url, req(Some("internal.test"))).await.0, 400);
    assert_eq!(h2_send(&url, req(Some("public.test"))).await.0, 400);
    assert_eq!(app.hits(), 2, "a mismatched request reached the backend");
}
