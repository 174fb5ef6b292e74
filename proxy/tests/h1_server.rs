//! The proxy's own HTTP/1.1 server (module `h1serve`), over raw sockets: pipelining, bodiless
//! requests around one with a body, `Connection: close`, HEAD, the `date` field, framing of
//! bodies of unknown length, and a client that leaves while its request is in flight (more
//! of it, bodies and upgrades, in `h1_bodies.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::raw_h1::*;
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Three requests in one write come back in order, each with a `date` field.
#[tokio::test]
async fn pipelined_requests_are_answered_in_order() {
    let (_b, _p, mut s) = echo_proxy().await;
    s.write_all(
        b"GET /api/1 HTTP/1.1\r\nHost: a\r\n\r\n\
          GET /nope HTTP/1.1\r\nHost: a\r\n\r\n\
          GET /api/3 HTTP/1.1\r\nHost: a\r\n\r\n",
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    let (h1, b1) = read_answer(&mut s, &mut buf).await;
    let (h2, _) = read_answer(&mut s, &mut buf).await;
    let (h3, b3) = read_answer(&mut s, &mut buf).await;
    assert!(h1.starts_with("HTTP/1.1 200 OK\r\n"), "{h1}");
    assert_eq!(json(&b1)["path"], "/api/1");
    assert!(h2.starts_with("HTTP/1.1 404 Not Found\r\n"), "{h2}");
    assert_eq!(json(&b3)["path"], "/api/3");
    for h in [&h1, &h2, &h3] {
        let date = h
            .lines()
            .find_map(|l| l.strip_prefix("date: "))
            .unwrap_or_else(|| panic!("no date: {h}"));
        // IMF-fixdate: `Wed, 02 Dec 2026 12:17:13 GMT`.
        assert_eq!(date.len(), 29, "{date}");
        assert!(
            date.ends_with(" GMT") && date.as_bytes()[3] == b',',
            "{date}"
        );
    }
    assert!(buf.is_empty());
}

/// Bodiless requests, then one with a body (streamed off the same read buffer), then
/// bodiless ones again: all answered on the one connection.
#[tokio::test]
async fn a_connection_goes_on_after_a_request_with_a_body() {
    let (b, _p, mut s) = echo_proxy().await;
    let mut buf = Vec::new();
    let (_, body) = ask(&mut s, &mut buf, b"GET /api/a HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(json(&body)["path"], "/api/a");
    // Its head pipelined behind a bodiless request, its body sent later.
    s.write_all(
        b"GET /api/b HTTP/1.1\r\nHost: a\r\n\r\n\
          POST /api/c HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhel",
    )
    .await
    .unwrap();
    let (_, body) = read_answer(&mut s, &mut buf).await;
    assert_eq!(json(&body)["path"], "/api/b");
    s.write_all(b"lo").await.unwrap();
    let (head, body) = read_answer(&mut s, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let v = json(&body);
    assert_eq!(
        (v["path"].as_str(), v["body"].as_str()),
        (Some("/api/c"), Some("hello"))
    );
    let (_, body) = ask(&mut s, &mut buf, b"GET /api/d HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(json(&body)["path"], "/api/d");
    assert_eq!(b.hits(), 4);
}

/// `Connection: close` is answered with `connection: close`, and the proxy closes; a
/// request pipelined behind it is not served.
#[tokio::test]
async fn a_request_that_asks_to_close_closes_the_connection() {
    let (b, _p, mut s) = echo_proxy().await;
    s.write_all(
        b"GET /api/x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n\
          GET /api/y HTTP/1.1\r\nHost: a\r\n\r\n",
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    let (head, body) = read_answer(&mut s, &mut buf).await;
    assert!(head.contains("\r\nconnection: close"), "{head}");
    assert_eq!(json(&body)["path"], "/api/x");
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest))
        .await
        .expect("closed within 5 s")
        .unwrap_or(0);
    assert_eq!((n, buf.len()), (0, 0), "{}", String::from_utf8_lossy(&rest));
    assert_eq!(b.hits(), 1);
}

/// A backend that answers with raw bytes it is given, once per request it reads.
async fn raw_backend(answer: &'static [u8]) -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut c, _)) = l.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.drain(..end + 4);
                        if c.write_all(answer).await.is_err() {
                            return;
                        }
                    }
                    match c.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    addr
}

async fn proxy_to(addr: std::net::SocketAddr) -> (tollgate_proxy::Proxy, TcpStream) {
    let (proxy, url) = proxy_with(
        vec![route("api", "/", vec![wb("b", 1)])],
        vec![("b", backend_at(addr))],
    )
    .await;
    let s = TcpStream::connect(url.trim_start_matches("http://"))
        .await
        .unwrap();
    (proxy, s)
}

/// A body of unknown length (the backend's is chunked) goes out chunked; the next request
/// on the connection is served after it.
#[tokio::test]
async fn a_body_of_unknown_length_goes_out_chunked() {
    let addr = raw_backend(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    )
    .await;
    let (_p, mut s) = proxy_to(addr).await;
    let mut buf = Vec::new();
    for _ in 0..2 {
        let (head, body) = ask(&mut s, &mut buf, b"GET /s HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert!(head.contains("\r\ntransfer-encoding: chunked"), "{head}");
        assert!(!head.contains("content-length"), "{head}");
        assert_eq!(body, b"hello world");
    }
}

/// HEAD: the backend's length is kept, no body follows, and the connection serves on.
#[tokio::test]
async fn a_head_answer_keeps_its_length_and_has_no_body() {
    let addr = raw_backend(b"HTTP/1.1 200 OK\r\ncontent-length: 1234\r\nx-head: 1\r\n\r\n").await;
    let (_p, mut s) = proxy_to(addr).await;
    let mut buf = Vec::new();
    for _ in 0..2 {
        let (head, body) = ask(&mut s, &mut buf, b"HEAD /h HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert!(head.contains("\r\ncontent-length: 1234"), "{head}");
        assert!(body.is_empty());
    }
    // Nothing else came: the next answer starts where the last head ended.
    let (head, _) = ask(&mut s, &mut buf, b"HEAD /h HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
}

/// A client that closes its side while its request waits on the backend cancels it: the
/// proxy drops the upstream connection (the backend reads its end) rather than waiting for
/// the answer nobody reads.
#[tokio::test]
async fn a_client_that_leaves_cancels_its_request_upstream() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut c, _) = l.accept().await.unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = c.read(&mut chunk).await.unwrap();
            buf.extend_from_slice(&chunk[..n]);
        }
        // Never answers; reports when the proxy closes the connection.
        let closed = matches!(c.read(&mut chunk).await, Ok(0) | Err(_));
        let _ = tx.send(closed);
    });
    let (_p, mut s) = proxy_to(addr).await;
    s.write_all(b"GET /wait HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.shutdown().await.unwrap();
    let closed = tokio::time::timeout(Duration::from_secs(5), rx)
        .await
        .expect("the upstream connection closed within 5 s")
        .unwrap();
    assert!(closed);
}

/// The second request on a connection carries its own fields only, none of the first
/// request's or its answer's.
#[tokio::test]
async fn a_request_carries_only_its_own_fields() {
    let (_b, _p, mut s) = echo_proxy().await;
    let mut buf = Vec::new();
    let (head, body) = ask(
        &mut s,
        &mut buf,
        b"GET /api/1 HTTP/1.1\r\nHost: a\r\nX-First: 1\r\n\r\n",
    )
    .await;
    assert!(head.contains("\r\nx-backend: b"), "{head}");
    assert_eq!(json(&body)["headers"]["x-first"], "1");
    let (_, body) = ask(
        &mut s,
        &mut buf,
        b"GET /api/2 HTTP/1.1\r\nHost: a\r\nX-Second: 2\r\n\r\n",
    )
    .await;
    let seen = &json(&body)["headers"];
    assert_eq!(seen["x-second"], "2");
    for name in [
        "x-first",
        "x-backend",
        "content-type",
        "content-length",
        "date",
    ] {
        assert!(seen.get(name).is_none(), "{name} leaked into: {seen}");
    }
}
