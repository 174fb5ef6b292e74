//! Socket tests of the bounds on slow and idle clients (issue 26, finding 5): a request body
//! below the minimum rate or past the total deadline is cut (408, the upstream request
//! closed), an idle HTTP/2 connection is closed, streams past the cap are refused, and one
//! HTTP/2 connection holds at most its cap of upstream connections. Limits are set short
//! through `ProxyOptions`; backends are raw listeners that record what they receive.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::raw_h2::*;
use common::*;
use http::{Request, StatusCode};
use hyper::body::Frame;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tollgate_proxy::{Metrics, ProxyOptions};

/// A backend that accepts connections, reads everything they send and never answers.
#[derive(Clone, Default)]
struct RawBackend {
    /// Connections accepted.
    accepted: Arc<AtomicUsize>,
    /// Connections open now, and the most open at once.
    open: Arc<AtomicUsize>,
    max_open: Arc<AtomicUsize>,
    /// Connections the proxy closed (EOF or reset).
    closed: Arc<AtomicUsize>,
    /// Bytes received, per connection in accept order.
    received: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl RawBackend {
    async fn start() -> (Self, SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let b = Self::default();
        let me = b.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let i = {
                    let mut r = me.received.lock().unwrap();
                    r.push(Vec::new());
                    r.len() - 1
                };
                me.accepted.fetch_add(1, Ordering::SeqCst);
                let now = me.open.fetch_add(1, Ordering::SeqCst) + 1;
                me.max_open.fetch_max(now, Ordering::SeqCst);
                let me = me.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    loop {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => me.received.lock().unwrap()[i].extend_from_slice(&buf[..n]),
                        }
                    }
                    me.open.fetch_sub(1, Ordering::SeqCst);
                    me.closed.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        (b, addr)
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    fn closed(&self) -> usize {
        self.closed.load(Ordering::SeqCst)
    }

    /// The request body bytes the first connection received (after the head).
    fn first_body(&self) -> Vec<u8> {
        let r = self.received.lock().unwrap();
        let all = r.first().cloned().unwrap_or_default();
        let at = all
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map_or(all.len(), |p| p + 4);
        all[at..].to_vec()
    }
}

/// A proxy with `opts` (recording into fresh metrics) routing everything to `backend`.
async fn proxy_to(
    opts: ProxyOptions,
    backend: SocketAddr,
) -> (tollgate_proxy::Proxy, String, Arc<Metrics>) {
    let metrics = metrics();
    let opts = ProxyOptions {
        metrics: metrics.clone(),
        ..opts
    };
    let (p, url) = proxy_with_options(
        opts,
        vec![route("r", "/", vec![wb("b", 1)])],
        vec![("b", backend_at(backend))],
    )
    .await;
    (p, url.trim_start_matches("http://").to_owned(), metrics)
}

/// Sends an HTTP/1.1 POST head announcing `len` body bytes, then `chunk` every `every`
/// until the body is sent or the proxy stops reading; returns what the client read back
/// within `wait` and how long the answer took.
async fn trickle(
    addr: &str,
    len: usize,
    chunk: usize,
    every: Duration,
    wait: Duration,
) -> (String, Duration) {
    let s = TcpStream::connect(addr).await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    let head = format!("POST /upload HTTP/1.1\r\nhost: x\r\ncontent-length: {len}\r\n\r\n");
    wr.write_all(head.as_bytes()).await.unwrap();
    let writer = tokio::spawn(async move {
        let mut sent = 0;
        while sent < len {
            tokio::time::sleep(every).await;
            let n = chunk.min(len - sent);
            if wr.write_all(&vec![b'z'; n]).await.is_err() {
                return;
            }
            sent += n;
        }
        // Keep the write side open: the client is waiting for the answer.
        std::future::pending::<()>().await;
    });
    let start = Instant::now();
    let mut out = Vec::new();
    let mut buf = [0u8; 1024];
    let _ = tokio::time::timeout(wait, async {
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    out.extend_from_slice(&buf[..n]);
                    if out.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            }
        }
    })
    .await;
    let took = start.elapsed();
    writer.abort();
    (String::from_utf8_lossy(&out).into_owned(), took)
}

fn counted(metrics: &Metrics, kind: &str) -> bool {
    metrics.encode().contains(&format!(
        "tollgate_client_timeouts_total{{kind=\"{kind}\"}} 1"
    ))
}

/// 50 B/s against a minimum of 100 B/s over 1 s (the idle timeout, 60 s, never fires: a
/// byte comes every 100 ms): the bucket of 100 bytes runs dry in about 2 s, the client
/// gets 408 and the upstream request is closed before the body is through. Before the
/// minimum rate, the trickle went on to the end, 20 s in.
#[tokio::test]
async fn a_body_trickled_below_the_minimum_rate_is_cut() {
    let (backend, at) = RawBackend::start().await;
    let opts = ProxyOptions {
        request_body_min_rate: 100,
        request_body_rate_window: Duration::from_secs(1),
        ..ProxyOptions::default()
    };
    let (_p, addr, metrics) = proxy_to(opts, at).await;
    let (out, took) = trickle(
        &addr,
        1000,
        5,
        Duration::from_millis(100),
        Duration::from_secs(8),
    )
    .await;
    assert!(
        out.starts_with("HTTP/1.1 408"),
        "no 408 after {took:?}: {out:?}"
    );
    assert!(took < Duration::from_secs(6), "{took:?}");
    assert!(
        eventually(|| backend.closed() == 1).await,
        "the upstream request stayed open"
    );
    let got = backend.first_body().len();
    assert!(got > 0 && got < 500, "the backend got {got} body bytes");
    assert!(counted(&metrics, "body_rate"), "{}", metrics.encode());
}

/// The minimum rate does not cut a body that keeps above it: 300 B/s against 100 B/s, for
/// twice the window, is served whole.
#[tokio::test]
async fn a_body_above_the_minimum_rate_is_served() {
    let b = echo_backend("b").await;
    let opts = ProxyOptions {
        request_body_min_rate: 100,
        request_body_rate_window: Duration::from_secs(1),
        ..ProxyOptions::default()
    };
    let (_p, addr, metrics) = proxy_to(opts, b.addr).await;
    let (out, _) = trickle(
        &addr,
        600,
        30,
        Duration::from_millis(100),
        Duration::from_secs(10),
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out:?}");
    assert!(
        !metrics.encode().contains("tollgate_client_timeouts_total{"),
        "{}",
        metrics.encode()
    );
}

/// A body sent well above the minimum rate (500 B/s) but taking 4 s in all is cut at the
/// total deadline (1 s): 408, the upstream request closed. Before, it was forwarded to the
/// end however long it took.
#[tokio::test]
async fn a_body_longer_than_the_total_deadline_is_cut() {
    let (backend, at) = RawBackend::start().await;
    let opts = ProxyOptions {
        request_body_timeout: Duration::from_secs(1),
        ..ProxyOptions::default()
    };
    let (_p, addr, metrics) = proxy_to(opts, at).await;
    let (out, took) = trickle(
        &addr,
        2000,
        50,
        Duration::from_millis(100),
        Duration::from_secs(6),
    )
    .await;
    assert!(
        out.starts_with("HTTP/1.1 408"),
        "no 408 after {took:?}: {out:?}"
    );
    assert!(took < Duration::from_millis(3500), "{took:?}");
    assert!(
        eventually(|| backend.closed() == 1).await,
        "the upstream request stayed open"
    );
    let got = backend.first_body().len();
    assert!(got > 0 && got < 2000, "the backend got {got} body bytes");
    assert!(counted(&metrics, "body_deadline"), "{}", metrics.encode());
}

/// An HTTP/2 connection, for the tests below.
async fn h2_connect(
    addr: &str,
) -> (
    hyper::client::conn::http2::SendRequest<H2Body>,
    tokio::task::JoinHandle<Result<(), hyper::Error>>,
) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    (sender, tokio::spawn(conn))
}

type H2Frame = Result<Frame<Bytes>, std::io::Error>;
type H2Body =
    http_body_util::StreamBody<std::pin::Pin<Box<dyn futures_util::Stream<Item = H2Frame> + Send>>>;

/// A request body fed from the returned sender (an `Err` resets the stream).
fn h2_body() -> (mpsc::Sender<H2Frame>, H2Body) {
    let (tx, rx) = mpsc::channel::<H2Frame>(4);
    let frames = futures_util::stream::unfold(rx, |mut rx| async move {
        let f = rx.recv().await?;
        Some((f, rx))
    });
    (tx, http_body_util::StreamBody::new(Box::pin(frames)))
}

fn data(b: &'static [u8]) -> H2Frame {
    Ok(Frame::data(Bytes::from_static(b)))
}

/// An HTTP/2 request body that never finishes is cut at the total deadline (a per-stream
/// deadline: the stream idle timeout is far off), as no answer has started: 408 on the
/// stream and the upstream request closed. Before, the stream held its upstream connection
/// for as long as the client kept it open.
#[tokio::test]
async fn an_http2_body_that_never_finishes_is_cut_at_the_deadline() {
    let (backend, at) = RawBackend::start().await;
    let opts = ProxyOptions {
        request_body_timeout: Duration::from_secs(1),
        ..ProxyOptions::default()
    };
    let (_p, addr, metrics) = proxy_to(opts, at).await;
    let (mut sender, _conn) = h2_connect(&addr).await;
    let (tx, body) = h2_body();
    tx.send(data(b"start")).await.unwrap();
    let req = Request::post(format!("http://{addr}/stream"))
        .body(body)
        .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(5), sender.send_request(req)).await;
    let resp = answer.expect("no answer 5 s in").unwrap();
    assert_eq!(resp.status(), StatusCode::REQUEST_TIMEOUT);
    assert!(
        eventually(|| backend.closed() == 1).await,
        "the upstream request stayed open"
    );
    assert!(counted(&metrics, "body_deadline"), "{}", metrics.encode());
    drop(tx);
}

/// An HTTP/2 request body the client pauses for longer than the stream idle timeout (1 s
/// here; the total deadline is far off) is cut: 408 on the stream, the upstream request
/// closed, counted as `body_idle`. Before, an HTTP/2 body could pause for ever.
#[tokio::test]
async fn an_http2_body_paused_past_the_stream_idle_timeout_is_cut() {
    let (backend, at) = RawBackend::start().await;
    let opts = ProxyOptions {
        http2_stream_idle_timeout: Duration::from_secs(1),
        ..ProxyOptions::default()
    };
    let (_p, addr, metrics) = proxy_to(opts, at).await;
    let (mut sender, _conn) = h2_connect(&addr).await;
    let (tx, body) = h2_body();
    tx.send(data(b"start")).await.unwrap();
    let req = Request::post(format!("http://{addr}/stream"))
        .body(body)
        .unwrap();
    let started = Instant::now();
    let answer = tokio::time::timeout(Duration::from_secs(5), sender.send_request(req)).await;
    let resp = answer.expect("no answer 5 s in").unwrap();
    assert_eq!(resp.status(), StatusCode::REQUEST_TIMEOUT);
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    assert!(
        eventually(|| backend.closed() == 1).await,
        "the upstream request stayed open"
    );
    assert!(counted(&metrics, "body_idle"), "{}", metrics.encode());
    drop(tx);
}

/// An HTTP/2 connection with nothing in flight is closed after the idle timeout (500 ms);
/// a request in flight for longer than that (1.2 s) keeps it open and is served. Before,
/// an idle HTTP/2 connection stayed open for ever.
#[tokio::test]
async fn an_idle_http2_connection_is_closed() {
    let b = slow_backend("b", 1200).await;
    let opts = ProxyOptions {
        http2_idle_timeout: Duration::from_millis(500),
        ..ProxyOptions::default()
    };
    let (_p, addr, metrics) = proxy_to(opts, b.addr).await;
    let (mut sender, conn) = h2_connect(&addr).await;
    let (tx, body) = h2_body();
    drop(tx);
    let req = Request::get(format!("http://{addr}/slow"))
        .body(body)
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let _ = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap();
    let answered = Instant::now();
    let closed = tokio::time::timeout(Duration::from_secs(5), conn).await;
    assert!(closed.is_ok(), "the idle connection is still open 5 s on");
    let idle = answered.elapsed();
    assert!(
        idle >= Duration::from_millis(400),
        "closed {idle:?} after the answer"
    );
    assert!(counted(&metrics, "connection_idle"), "{}", metrics.encode());
}

/// With a cap of 2 streams, the server says so in its SETTINGS, and a client opening a third
/// while two are open (bodies pending) gets it refused (RST_STREAM REFUSED_STREAM). Before,
/// the cap was hyper's 200.
#[tokio::test]
async fn streams_past_the_cap_are_refused() {
    let (_backend, at) = RawBackend::start().await;
    let opts = ProxyOptions {
        http2_max_concurrent_streams: 2,
        ..ProxyOptions::default()
    };
    let (_p, addr, _m) = proxy_to(opts, at).await;
    let mut s = TcpStream::connect(&addr).await.unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    s.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
    // The server's SETTINGS, acknowledged so that they apply.
    let settings = loop {
        let (kind, flags, _, payload) = read_frame(&mut s).await.expect("no SETTINGS");
        if kind == SETTINGS && flags & 1 == 0 {
            break payload;
        }
    };
    let max_streams = settings
        .chunks(6)
        .find(|c| c[..2] == [0, 3])
        .map(|c| u32::from_be_bytes([c[2], c[3], c[4], c[5]]));
    assert_eq!(max_streams, Some(2), "SETTINGS_MAX_CONCURRENT_STREAMS");
    s.write_all(&frame(SETTINGS, 1, 0, &[])).await.unwrap();
    // POST / with :authority x (HPACK static table, literal authority), body to follow.
    let block = [0x83, 0x86, 0x84, 0x01, 0x01, b'x'];
    for stream in [1, 3, 5] {
        s.write_all(&frame(HEADERS, 0x4, stream, &block))
            .await
            .unwrap();
    }
    let refused = tokio::time::timeout(Duration::from_secs(3), async {
        while let Some((kind, _, stream, payload)) = read_frame(&mut s).await {
            if kind == RST_STREAM {
                let code = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
                return Some((stream, code));
            }
        }
        None
    })
    .await;
    assert_eq!(refused, Ok(Some((5, REFUSED_STREAM))));
}

/// With a cap of 2 upstream requests per connection, an HTTP/2 client opening 4 streams
/// whose bodies never finish holds 2 upstream connections; the others wait, and one goes
/// ahead when a held stream ends (the client resets it). Before, every stream held an
/// upstream connection of its own.
#[tokio::test]
async fn one_connection_holds_at_most_its_cap_of_upstream_connections() {
    let (backend, at) = RawBackend::start().await;
    let opts = ProxyOptions {
        max_upstream_requests_per_connection: 2,
        ..ProxyOptions::default()
    };
    let (_p, addr, _m) = proxy_to(opts, at).await;
    let (sender, _conn) = h2_connect(&addr).await;
    let mut bodies = Vec::new();
    for i in 0..4 {
        let (tx, body) = h2_body();
        tx.send(data(b"part")).await.unwrap();
        bodies.push(tx);
        let req = Request::post(format!("http://{addr}/up/{i}"))
            .body(body)
            .unwrap();
        let mut sender = sender.clone();
        tokio::spawn(async move { sender.send_request(req).await });
    }
    assert!(
        eventually(|| backend.accepted() >= 2).await,
        "no upstream request"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        backend.accepted(),
        2,
        "upstream connections for one client connection"
    );

    // One held stream ends (reset by the client): a waiting one takes its place.
    let reset = std::io::Error::other("client gives up");
    bodies[0].send(Err(reset)).await.unwrap();
    assert!(
        eventually(|| backend.accepted() == 3).await,
        "the waiting request never went"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(backend.max_open.load(Ordering::SeqCst), 2);
    assert_eq!(backend.accepted(), 3);
}
