//! Our HTTP/1 server (module `h1serve`) with what hyper's server used to take, over raw
//! sockets: request bodies by length and by chunks (trailers dropped), `Expect:
//! 100-continue`, HTTP/1.0 keep-alive, pipelined requests with bodies, a WebSocket upgrade
//! spliced both ways, HTTP/2 by prior knowledge on a plain port, and a 4 MiB body streamed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::raw_h1::*;
use common::*;
use http::Version;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Reads until the proxy closes the connection (within 5 s): what came after `buf`.
async fn read_to_close(s: &mut TcpStream) -> Vec<u8> {
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest))
        .await
        .expect("closed within 5 s")
        .unwrap();
    rest
}

/// A body by length, then one in chunks with a trailer, then a bodiless request: each body
/// reaches the backend whole, the trailer does not, and the connection serves all three.
#[tokio::test]
async fn bodies_by_length_and_by_chunks_reach_the_backend() {
    let (b, _p, mut s) = echo_proxy().await;
    let mut buf = Vec::new();
    s.write_all(b"POST /api/a HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello")
        .await
        .unwrap();
    let (head, body) = read_answer(&mut s, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert_eq!(json(&body)["body"], "hello");
    // The chunks in separate writes: the body is read across reads.
    s.write_all(
        b"POST /api/b HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n",
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    s.write_all(b"2;ext=1\r\nde\r\n0\r\nx-trailer: t\r\n\r\n")
        .await
        .unwrap();
    let (head, body) = read_answer(&mut s, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    let seen = json(&body);
    assert_eq!(seen["body"], "abcde");
    assert!(seen["headers"].get("x-trailer").is_none(), "{seen}");
    s.write_all(b"GET /api/c HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let (_, body) = read_answer(&mut s, &mut buf).await;
    assert_eq!(json(&body)["path"], "/api/c");
    assert_eq!(b.hits(), 3);
    assert!(buf.is_empty());
}

/// `Expect: 100-continue`: the interim answer comes once the body is wanted (a routed
/// request), and then the final one; another expectation is ignored; a request answered
/// without its body (no route) gets no `100`, only its answer, and the connection closes
/// (its body never came).
#[tokio::test]
async fn expect_100_continue_is_answered_only_when_the_body_is_wanted() {
    let (b, _p, mut s) = echo_proxy().await;
    let mut buf = Vec::new();
    s.write_all(
        b"PUT /api/e HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n",
    )
    .await
    .unwrap();
    let (head, _) = read_answer(&mut s, &mut buf).await;
    assert_eq!(head, "HTTP/1.1 100 Continue");
    s.write_all(b"hello").await.unwrap();
    let (head, body) = read_answer(&mut s, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert_eq!(json(&body)["body"], "hello");
    assert_eq!(b.hits(), 1);
    // Another expectation is ignored, as hyper's server did: no 100, the body is read.
    s.write_all(b"PUT /api/f HTTP/1.1\r\nHost: a\r\nExpect: later\r\nContent-Length: 2\r\n\r\nok")
        .await
        .unwrap();
    let (head, body) = read_answer(&mut s, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert_eq!(json(&body)["body"], "ok");
    assert_eq!(b.hits(), 2);

    s.write_all(
        b"PUT /nope HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n",
    )
    .await
    .unwrap();
    let (head, _) = read_answer(&mut s, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 404 "), "no 100 first: {head}");
    assert_eq!(
        field(&head, "connection").as_deref(),
        Some("close"),
        "{head}"
    );
    assert_eq!(read_to_close(&mut s).await, b"");
    assert!(buf.is_empty(), "{}", String::from_utf8_lossy(&buf));
    assert_eq!(b.hits(), 2);
}

/// A backend whose every answer has a body of unknown length (chunked), and counts requests.
async fn chunked_backend() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            let hits = counted.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.drain(..end + 4);
                        hits.fetch_add(1, Ordering::SeqCst);
                        let answer = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
                                       5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
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
    (addr, hits)
}

/// HTTP/1.0: kept alive only when it asks (and told so), closed otherwise; a body of
/// unknown length goes to it unchunked, ended by the close.
#[tokio::test]
async fn http10_keeps_alive_only_when_asked_and_gets_no_chunks() {
    let (b, _p, mut s) = echo_proxy().await;
    let mut buf = Vec::new();
    for path in ["/api/1", "/api/2"] {
        let req = format!("GET {path} HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let (head, body) = read_answer(&mut s, &mut buf).await;
        assert_eq!(
            field(&head, "connection").as_deref(),
            Some("keep-alive"),
            "{head}"
        );
        assert!(field(&head, "content-length").is_some(), "{head}");
        assert_eq!(json(&body)["path"], path);
    }
    s.write_all(b"GET /api/3 HTTP/1.0\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let (head, _) = read_answer(&mut s, &mut buf).await;
    assert_eq!(
        field(&head, "connection").as_deref(),
        Some("close"),
        "{head}"
    );
    assert_eq!(read_to_close(&mut s).await, b"");
    assert_eq!(b.hits(), 3);

    let (addr, hits) = chunked_backend().await;
    let (_p2, url) = proxy_with(
        vec![route("r", "/", vec![wb("c", 1)])],
        vec![("c", backend_at(addr))],
    )
    .await;
    let mut s = TcpStream::connect(url.trim_start_matches("http://"))
        .await
        .unwrap();
    s.write_all(b"GET /x HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\n\r\n")
        .await
        .unwrap();
    let out = String::from_utf8(read_to_close(&mut s).await).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
    assert_eq!(field(head, "transfer-encoding"), None, "{out}");
    assert_eq!(field(head, "connection").as_deref(), Some("close"), "{out}");
    assert_eq!(body, "hello world");
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}

/// Requests with bodies (by length, in chunks) and without, in one write: answered in
/// order, each with its own body.
#[tokio::test]
async fn pipelined_requests_with_bodies_are_answered_in_order() {
    let (b, _p, mut s) = echo_proxy().await;
    s.write_all(
        b"POST /api/1 HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\none\
          POST /api/2 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\ntwo\r\n0\r\n\r\n\
          GET /api/3 HTTP/1.1\r\nHost: a\r\n\r\n\
          PUT /api/4 HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n\r\nfour",
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    for (path, want) in [
        ("/api/1", "one"),
        ("/api/2", "two"),
        ("/api/3", ""),
        ("/api/4", "four"),
    ] {
        let (head, body) = read_answer(&mut s, &mut buf).await;
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        let seen = json(&body);
        assert_eq!(seen["path"], path);
        assert_eq!(seen["body"], want, "{path}");
    }
    assert_eq!(b.hits(), 4);
    assert!(buf.is_empty());
}

/// A backend that switches protocols on the first request, says `ready` and then echoes
/// every read back with `echo:` before it.
async fn upgrading_backend() -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let end = loop {
                    if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break end;
                    }
                    match c.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                };
                let mut early = buf.split_off(end + 4);
                let answer = b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: test\r\n\r\nready";
                if c.write_all(answer).await.is_err() {
                    return;
                }
                loop {
                    if !early.is_empty() {
                        let out = [&b"echo:"[..], &early].concat();
                        if c.write_all(&out).await.is_err() {
                            return;
                        }
                        early.clear();
                    }
                    match c.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => early.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    addr
}

/// Reads from `s` until `buf` holds `want`.
async fn read_until(s: &mut TcpStream, buf: &mut Vec<u8>, want: &[u8]) {
    while !buf.windows(want.len()).any(|w| w == want) {
        read_some(s, buf).await;
    }
}

/// An upgrade: the 101 goes to the client, then bytes flow both ways, the client's sent
/// right behind its head included.
#[tokio::test]
async fn an_upgrade_is_spliced_both_ways() {
    let addr = upgrading_backend().await;
    let (_p, url) = proxy_with(
        vec![route("r", "/", vec![wb("u", 1)])],
        vec![("u", backend_at(addr))],
    )
    .await;
    let mut s = TcpStream::connect(url.trim_start_matches("http://"))
        .await
        .unwrap();
    s.write_all(b"GET /chat HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: test\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    read_until(&mut s, &mut buf, b"ready").await;
    let text = String::from_utf8_lossy(&buf).into_owned();
    assert!(
        text.starts_with("HTTP/1.1 101 Switching Protocols\r\n"),
        "{text}"
    );
    assert!(text.ends_with("\r\n\r\nready"), "{text}");
    buf.clear();
    for word in ["ping", "pong"] {
        s.write_all(word.as_bytes()).await.unwrap();
        let want = format!("echo:{word}");
        read_until(&mut s, &mut buf, want.as_bytes()).await;
        assert_eq!(buf, want.as_bytes());
        buf.clear();
    }
}

/// HTTP/2 by prior knowledge on a plain port (h2c) still goes to hyper's HTTP/2 server.
#[tokio::test]
async fn h2c_prior_knowledge_is_served() {
    let b = echo_backend("b").await;
    let (_p, url) = proxy_with(
        vec![route("api", "/api", vec![wb("b", 1)])],
        vec![("b", backend_of(&[&b]))],
    )
    .await;
    let c = h2c_client();
    for path in ["/api/1", "/api/2"] {
        let resp = c
            .request(
                http::Request::get(format!("{url}{path}"))
                    .body(Default::default())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(resp.version(), Version::HTTP_2);
        assert_eq!(resp.status(), 200);
    }
    assert_eq!(b.hits(), 2);
}

/// A backend that reads one request with a `Content-Length` body, reports each count of
/// body bytes received, and answers with the count.
async fn counting_backend() -> (std::net::SocketAddr, tokio::sync::watch::Receiver<usize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = tokio::sync::watch::channel(0);
    tokio::spawn(async move {
        let Ok((mut c, _)) = l.accept().await else {
            return;
        };
        let mut buf = Vec::new();
        let mut chunk = vec![0u8; 64 * 1024];
        let end = loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break end;
            }
            let n = c.read(&mut chunk).await.unwrap();
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        let len: usize = field(&format!("\r\n{head}"), "content-length")
            .expect("a length upstream")
            .parse()
            .unwrap();
        let mut got = buf.len() - end - 4;
        let mut sum: u64 = buf[end + 4..].iter().map(|&b| u64::from(b)).sum();
        while got < len {
            let _ = tx.send(got);
            let n = c.read(&mut chunk).await.unwrap();
            assert!(n > 0);
            got += n;
            sum += chunk[..n].iter().map(|&b| u64::from(b)).sum::<u64>();
        }
        let _ = tx.send(got);
        let text = format!("{got} {sum}");
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{text}",
            text.len()
        );
        let _ = c.write_all(answer.as_bytes()).await;
    });
    (addr, rx)
}

/// A 4 MiB body streams: the backend has its first part before the client sends the rest,
/// and gets every byte.
#[tokio::test]
async fn a_large_body_streams_to_the_backend() {
    const SIZE: usize = 4 * 1024 * 1024;
    let (addr, mut got) = counting_backend().await;
    let (_p, url) = proxy_with(
        vec![route("r", "/", vec![wb("c", 1)])],
        vec![("c", backend_at(addr))],
    )
    .await;
    let mut s = TcpStream::connect(url.trim_start_matches("http://"))
        .await
        .unwrap();
    let body: Vec<u8> = (0..SIZE).map(|i| (i % 251) as u8).collect();
    let sum: u64 = body.iter().map(|&b| u64::from(b)).sum();
    let head = format!("POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: {SIZE}\r\n\r\n");
    s.write_all(head.as_bytes()).await.unwrap();
    let (first, rest) = body.split_at(SIZE / 4);
    s.write_all(first).await.unwrap();
    // The first quarter reaches the backend while the rest is not sent yet.
    tokio::time::timeout(Duration::from_secs(5), got.wait_for(|&n| n > 0))
        .await
        .expect("body bytes upstream before the body ends")
        .unwrap();
    s.write_all(rest).await.unwrap();
    let mut buf = Vec::new();
    let (head, answer) = read_answer(&mut s, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert_eq!(String::from_utf8(answer).unwrap(), format!("{SIZE} {sum}"));
}
