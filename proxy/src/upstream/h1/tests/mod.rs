//! Socket tests of the upstream HTTP/1.1 exchange: a raw backend answers from a script and
//! records the request heads it read.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Method, Request, StatusCode};
use http_body_util::BodyExt as _;
use hyper::body::Body as _;
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpListener;

use http::HeaderMap;
use http::header::CONTENT_LENGTH;

use super::*;
use crate::lifecycle::body::{ProxyBody, empty};
use crate::upstream::pool::{EndpointPool, PooledBody, Pools, UpstreamError};

/// One answer, written in pieces (each its own write, a few ms apart, so the proxy reads
/// them separately), and whether the backend closes the connection after it.
struct Answer {
    pieces: Vec<&'static [u8]>,
    close: bool,
}

fn answer(pieces: &[&'static [u8]]) -> Answer {
    Answer {
        pieces: pieces.to_vec(),
        close: false,
    }
}

/// A backend that answers each request head it reads with the next answer of `script`,
/// on whichever connection it came; records the request heads and counts connections.
struct Backend {
    addr: SocketAddr,
    heads: Arc<Mutex<Vec<String>>>,
    conns: Arc<std::sync::atomic::AtomicUsize>,
}

async fn backend(script: Vec<Answer>) -> Backend {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let conns = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let script = Arc::new(Mutex::new(script.into_iter()));
    let (h, c) = (heads.clone(), conns.clone());
    tokio::spawn(async move {
        loop {
            let (mut s, _) = l.accept().await.unwrap();
            c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let (h, script) = (h.clone(), script.clone());
            tokio::spawn(async move {
                let mut got = BytesMut::new();
                loop {
                    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read_buf(&mut got).await {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {}
                        }
                    }
                    let end = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                    let head = got.split_to(end);
                    h.lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&head).into_owned());
                    let Some(a) = script.lock().unwrap().next() else {
                        return;
                    };
                    for p in a.pieces {
                        if s.write_all(p).await.is_err() {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    if a.close {
                        return;
                    }
                }
            });
        }
    });
    Backend { addr, heads, conns }
}

fn request(method: Method) -> Request<ProxyBody> {
    Request::builder()
        .method(method)
        .uri("/p?q=1")
        .header("host", "example.test")
        .header("x-a", "1")
        .body(empty())
        .unwrap()
}

/// The whole answer: status, body, trailers; or the error that ended it.
async fn exchange(
    pool: &Arc<EndpointPool>,
    method: Method,
) -> Result<(StatusCode, Bytes, Option<HeaderMap>), String> {
    let resp = pool
        .send(request(method), &Added::default())
        .await
        .map_err(|e: UpstreamError| format!("send: {e}"))?;
    let status = resp.status();
    let body: PooledBody = resp.into_body();
    let collected = body.collect().await.map_err(|e| format!("body: {e}"))?;
    let trailers = collected.trailers().cloned();
    Ok((status, collected.to_bytes(), trailers))
}

#[tokio::test]
async fn answers_are_framed_and_connections_reused_only_when_clean() {
    struct Case {
        name: &'static str,
        method: Method,
        answer: Answer,
        status: u16,
        body: &'static [u8],
        trailer: Option<(&'static str, &'static str)>,
        reused: bool,
    }
    let case = |name, pieces: &[&'static [u8]], status, body, reused| Case {
        name,
        method: Method::GET,
        answer: answer(pieces),
        status,
        body,
        trailer: None,
        reused,
    };
    let cases = vec![
        case(
            "content-length, body in two reads",
            &[
                b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n01234",
                b"56789",
            ],
            200,
            b"0123456789",
            true,
        ),
        case(
            "head split inside a field",
            &[b"HTTP/1.1 201 Created\r\nconte", b"nt-length: 2\r\n\r\nok"],
            201,
            b"ok",
            true,
        ),
        Case {
            trailer: Some(("grpc-status", "0")),
            ..case(
                "chunked with an extension and trailers, split mid-chunk",
                &[
                    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;ext=1\r\nhel",
                    b"lo\r\n6\r\n world\r\n0\r\ngrpc-status: 0\r\n\r\n",
                ],
                200,
                b"hello world",
                true,
            )
        },
        case(
            "chunked, the last chunk in its own read",
            &[
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n",
                b"0\r\n",
                b"\r\n",
            ],
            200,
            b"abc",
            true,
        ),
        case(
            "interim 100 and 103 are skipped",
            &[
                b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n",
                b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nx",
            ],
            200,
            b"x",
            true,
        ),
        case(
            "204 has no body",
            &[b"HTTP/1.1 204 No Content\r\n\r\n"],
            204,
            b"",
            true,
        ),
        case(
            "304 has no body, whatever its length says",
            &[b"HTTP/1.1 304 Not Modified\r\ncontent-length: 5\r\n\r\n"],
            304,
            b"",
            true,
        ),
        Case {
            method: Method::HEAD,
            ..case(
                "HEAD: the length describes a body that is not sent",
                &[b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"],
                200,
                b"",
                true,
            )
        },
        case(
            "connection: close",
            &[b"HTTP/1.1 200 OK\r\nconnection: keep-alive, close\r\ncontent-length: 2\r\n\r\nok"],
            200,
            b"ok",
            false,
        ),
        case(
            "HTTP/1.0",
            &[b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok"],
            200,
            b"ok",
            false,
        ),
        case(
            "repeated equal lengths",
            &[b"HTTP/1.1 200 OK\r\ncontent-length: 2, 2\r\ncontent-length: 2\r\n\r\nok"],
            200,
            b"ok",
            true,
        ),
        case(
            "bytes after the answer: not reused",
            &[b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokEXTRA"],
            200,
            b"ok",
            false,
        ),
    ];
    for c in cases {
        let be = backend(vec![c.answer]).await;
        let pool = Pools::default().pool_for(be.addr, &Default::default());
        let (status, body, trailers) = exchange(&pool, c.method)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", c.name));
        assert_eq!(status, c.status, "{}", c.name);
        assert_eq!(&body[..], c.body, "{}", c.name);
        let trailer = trailers.as_ref().and_then(|t| {
            let (k, v) = t.iter().next()?;
            Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned()))
        });
        assert_eq!(
            trailer,
            c.trailer.map(|(k, v)| (k.to_owned(), v.to_owned())),
            "{}",
            c.name
        );
        assert_eq!(pool.idle_len(), usize::from(c.reused), "{}", c.name);
    }
}

/// An answer whose head, once `Connection: keep-alive` is left out, has no hop-by-hop
/// field says so, and the service skips its search for them; any hop-by-hop field (or a
/// `Connection` list) leaves the search to the service.
#[tokio::test]
async fn answers_say_whether_their_head_needs_hop_by_hop_stripping() {
    let cases: [(&[u8], bool); 8] = [
        (
            b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\ncontent-length: 2\r\n\r\nok",
            true,
        ),
        (
            b"HTTP/1.1 200 OK\r\nServer: s\r\nX-Other: 1\r\ncontent-length: 2\r\n\r\nok",
            true,
        ),
        (
            b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5\r\ncontent-length: 2\r\n\r\nok",
            false,
        ),
        (
            b"HTTP/1.1 200 OK\r\nconnection: x-hop\r\nx-hop: 1\r\ncontent-length: 2\r\n\r\nok",
            false,
        ),
        (
            b"HTTP/1.1 200 OK\r\nUpgrade: h2c\r\ncontent-length: 2\r\n\r\nok",
            false,
        ),
        (
            b"HTTP/1.1 200 OK\r\nProxy-Connection: keep-alive\r\ncontent-length: 2\r\n\r\nok",
            false,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTE: trailers\r\ncontent-length: 2\r\n\r\nok",
            false,
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
            false,
        ),
    ];
    let be = backend(cases.iter().map(|(a, _)| answer(&[a])).collect()).await;
    let pool = Pools::default().pool_for(be.addr, &Default::default());
    for (i, (text, clean)) in cases.iter().enumerate() {
        let resp = pool
            .send(request(Method::GET), &Added::default())
            .await
            .unwrap();
        let head = String::from_utf8_lossy(text);
        assert_eq!(resp.body().clean_head(), *clean, "answer {i}: {head:?}");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"ok", "answer {i}");
    }
}

#[tokio::test]
async fn a_phrase_of_its_own_is_kept_and_a_standard_one_left_to_the_code() {
    let be = backend(vec![
        answer(&[b"HTTP/1.1 200 Fine\r\ncontent-length: 2\r\n\r\nok"]),
        answer(&[b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"]),
    ])
    .await;
    let pool = Pools::default().pool_for(be.addr, &Default::default());
    let resp = pool
        .send(request(Method::GET), &Added::default())
        .await
        .unwrap();
    let phrase = resp.extensions().get::<hyper::ext::ReasonPhrase>();
    assert_eq!(
        phrase.map(|p| p.as_bytes().to_vec()),
        Some(b"Fine".to_vec())
    );
    resp.into_body().collect().await.unwrap();
    // A standard phrase is left to the status code. (A length beside the chunks, once
    // dropped here, is now refused: `broken_answers_are_errors`.)
    let resp = pool
        .send(request(Method::GET), &Added::default())
        .await
        .unwrap();
    assert!(
        resp.extensions()
            .get::<hyper::ext::ReasonPhrase>()
            .is_none()
    );
    assert!(!resp.headers().contains_key(CONTENT_LENGTH));
    assert_eq!(
        &resp.into_body().collect().await.unwrap().to_bytes()[..],
        b"hi"
    );
}

mod conns;
mod streaming;
