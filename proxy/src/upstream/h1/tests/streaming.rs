//! Requests with bodies, upgrades and tunnels ([`Conn::send`]), against a backend that
//! records every byte each connection carried.

use std::sync::atomic::{AtomicUsize, Ordering};

use http::header::{CONNECTION, UPGRADE};
use http_body_util::BodyExt as _;
use hyper::body::{Frame, SizeHint};
use tokio::io::AsyncReadExt as _;
use tokio::sync::mpsc;

use super::*;
use crate::lifecycle::body::BoxError;

/// What the backend does with each request, in turn.
#[derive(Clone, Copy)]
enum Act {
    /// Reads the whole request, then writes the answer; closes after it when `true`.
    Answer(&'static [u8], bool),
    /// Reads the head and this many body bytes, answers, and reads on until the proxy closes.
    Early(usize, &'static [u8]),
    /// Reads the whole request and closes without a byte of answer.
    Drop,
}

/// A backend that reads requests (framed by their length or chunks) and acts on each as
/// `script` says; keeps every byte each connection carried, once it ended.
struct Recorder {
    addr: SocketAddr,
    /// The requests read, whole, in order.
    requests: Arc<Mutex<Vec<Vec<u8>>>>,
    /// Each ended connection's bytes, in the order they ended.
    ended: Arc<Mutex<Vec<Vec<u8>>>>,
    conns: Arc<AtomicUsize>,
}

async fn recorder(script: Vec<Act>) -> Recorder {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let rec = Recorder {
        addr,
        requests: Arc::default(),
        ended: Arc::default(),
        conns: Arc::default(),
    };
    let (requests, ended, conns) = (rec.requests.clone(), rec.ended.clone(), rec.conns.clone());
    let script = Arc::new(Mutex::new(script.into_iter()));
    tokio::spawn(async move {
        loop {
            let (mut s, _) = l.accept().await.unwrap();
            conns.fetch_add(1, Ordering::SeqCst);
            let (requests, ended, script) = (requests.clone(), ended.clone(), script.clone());
            tokio::spawn(async move {
                let mut log = Vec::new();
                let mut buf = BytesMut::new();
                loop {
                    let act = if buf.is_empty() && !fill(&mut s, &mut buf, &mut log).await {
                        None
                    } else {
                        script.lock().unwrap().next()
                    };
                    let Some(act) = act else { break };
                    let early = match act {
                        Act::Early(n, _) => Some(n),
                        _ => None,
                    };
                    let Some(req) = read_request(&mut s, &mut buf, &mut log, early).await else {
                        break;
                    };
                    requests.lock().unwrap().push(req);
                    match act {
                        Act::Answer(a, close) => {
                            s.write_all(a).await.unwrap();
                            if close {
                                break;
                            }
                        }
                        Act::Early(_, a) => {
                            s.write_all(a).await.unwrap();
                            while fill(&mut s, &mut buf, &mut log).await {}
                            break;
                        }
                        Act::Drop => break,
                    }
                }
                ended.lock().unwrap().push(log);
            });
        }
    });
    rec
}

/// Reads more into `buf` (and `log`); false at EOF or on an error.
async fn fill(s: &mut tokio::net::TcpStream, buf: &mut BytesMut, log: &mut Vec<u8>) -> bool {
    let before = buf.len();
    match s.read_buf(buf).await {
        Ok(0) | Err(_) => false,
        Ok(_) => {
            log.extend_from_slice(&buf[before..]);
            true
        }
    }
}

/// One whole request off `buf` (reading as needed): the head and its body, framed by
/// `content-length` or chunks. `early`: only the head and this many body bytes.
async fn read_request(
    s: &mut tokio::net::TcpStream,
    buf: &mut BytesMut,
    log: &mut Vec<u8>,
    early: Option<usize>,
) -> Option<Vec<u8>> {
    let find = |b: &[u8], n: &[u8]| b.windows(n.len()).position(|w| w == n);
    let head_end = loop {
        if let Some(i) = find(buf, b"\r\n\r\n") {
            break i + 4;
        }
        if !fill(s, buf, log).await {
            return None;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .map(|n| n.trim().parse::<usize>().unwrap());
    let chunked = head.contains("\r\ntransfer-encoding: chunked\r\n");
    let mut end = head_end + early.or(length).unwrap_or(0);
    if chunked && early.is_none() {
        // Size line, data, CRLF; until the last chunk and its empty trailer line.
        let mut at = head_end;
        loop {
            let line = loop {
                if let Some(i) = find(&buf[at..], b"\r\n") {
                    break i;
                }
                if !fill(s, buf, log).await {
                    return None;
                }
            };
            let size = std::str::from_utf8(&buf[at..at + line]).unwrap();
            let size = usize::from_str_radix(size, 16).unwrap();
            if size == 0 {
                // The trailer section: fields (if any), then an empty line.
                at += line + 2;
                let trailers_end = loop {
                    if buf[at..].starts_with(b"\r\n") {
                        break at + 2;
                    }
                    if let Some(i) = find(&buf[at..], b"\r\n\r\n") {
                        break at + i + 4;
                    }
                    if !fill(s, buf, log).await {
                        return None;
                    }
                };
                at = trailers_end;
                break;
            }
            at += line + 2 + size + 2;
            while buf.len() < at {
                if !fill(s, buf, log).await {
                    return None;
                }
            }
        }
        end = at;
    }
    while buf.len() < end {
        if !fill(s, buf, log).await {
            return None;
        }
    }
    Some(buf.split_to(end).to_vec())
}

/// A request body fed through a channel, with an exact size when given.
struct ChanBody {
    rx: mpsc::Receiver<Result<Frame<Bytes>, BoxError>>,
    exact: Option<u64>,
}

impl hyper::body::Body for ChanBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.rx.poll_recv(cx)
    }

    fn size_hint(&self) -> SizeHint {
        self.exact
            .map_or_else(SizeHint::default, SizeHint::with_exact)
    }
}

type Feed = mpsc::Sender<Result<Frame<Bytes>, BoxError>>;

/// A body of unknown size and the channel that feeds it (room for one frame).
fn chan_body() -> (Feed, ProxyBody) {
    let (tx, rx) = mpsc::channel(1);
    (tx, ChanBody { rx, exact: None }.boxed())
}

fn data(b: &'static [u8]) -> Result<Frame<Bytes>, BoxError> {
    Ok(Frame::data(Bytes::from_static(b)))
}

fn post(body: ProxyBody, fields: &[(&str, &str)]) -> Request<ProxyBody> {
    let mut b = Request::builder()
        .method(Method::POST)
        .uri("/up")
        .header("host", "example.test");
    for (k, v) in fields {
        b = b.header(*k, *v);
    }
    b.body(body).unwrap()
}

const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

async fn ok_body(resp: Response<PooledBody>) -> Bytes {
    assert_eq!(resp.status(), 200);
    resp.into_body().collect().await.unwrap().to_bytes()
}

#[tokio::test]
async fn bodies_arrive_byte_exact_by_their_length_or_in_chunks() {
    let be = recorder(vec![Act::Answer(OK, false); 4]).await;
    let pool = Pools::default().pool_for(be.addr, &Default::default());
    let none = Added::default();
    let send = |req| pool.send(req, &none);

    // The client's own content-length passes through, the body after it as it is.
    let req = post(
        crate::lifecycle::body::full("hello"),
        &[("content-length", "5")],
    );
    assert_eq!(ok_body(send(req).await.unwrap()).await, "ok");
    // An exact size and no length field: the length is written.
    let req = post(crate::lifecycle::body::full("exact"), &[("x-a", "1")]);
    assert_eq!(ok_body(send(req).await.unwrap()).await, "ok");
    // Size unknown: chunks, one per frame (an empty frame writes none), and the last chunk
    // with the trailer frame's fields (which reach here only from a route that forwards
    // trailers, filtered by `body::LimitedBody`).
    let (tx, body) = chan_body();
    let feeder = tokio::spawn(async move {
        for f in [&b"ab"[..], b"", b"cde"] {
            tx.send(data(f)).await.unwrap();
        }
        let mut t = HeaderMap::new();
        t.insert("x-user", "root".parse().unwrap());
        tx.send(Ok(Frame::trailers(t))).await.unwrap();
    });
    assert_eq!(ok_body(send(post(body, &[])).await.unwrap()).await, "ok");
    feeder.await.unwrap();
    // A chunked body known to end with its last data frame: the last chunk goes with it.
    let (tx, rx) = mpsc::channel(1);
    tx.send(data(b"xyz")).await.unwrap();
    drop(tx);
    let body = ChanBody { rx, exact: None }.boxed();
    assert_eq!(ok_body(send(post(body, &[])).await.unwrap()).await, "ok");

    let requests: Vec<String> = be
        .requests
        .lock()
        .unwrap()
        .iter()
        .map(|r| String::from_utf8_lossy(r).into_owned())
        .collect();
    assert_eq!(
        requests,
        [
            "POST /up HTTP/1.1\r\nhost: example.test\r\ncontent-length: 5\r\n\r\nhello",
            "POST /up HTTP/1.1\r\nhost: example.test\r\nx-a: 1\r\ncontent-length: 5\r\n\r\nexact",
            "POST /up HTTP/1.1\r\nhost: example.test\r\ntransfer-encoding: chunked\r\n\r\n2\r\nab\r\n3\r\ncde\r\n0\r\nx-user: root\r\n\r\n",
            "POST /up HTTP/1.1\r\nhost: example.test\r\ntransfer-encoding: chunked\r\n\r\n3\r\nxyz\r\n0\r\n\r\n",
        ]
    );
    // Each sent whole and answered exactly: all on one connection, back in the pool.
    assert_eq!(be.conns.load(Ordering::SeqCst), 1);
    assert_eq!(pool.idle_len(), 1);
}

/// 32 MiB in 256 KiB frames to a backend that does not read for a while: the body is taken
/// from the client only as fast as the socket takes it (loopback's socket buffers hold about
/// 4 MiB; nothing buffers the whole), then arrives whole and in order.
#[tokio::test]
async fn a_large_body_streams_at_the_pace_of_the_socket() {
    const FRAME: usize = 256 * 1024;
    const FRAMES: usize = 128;
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let reading = Arc::new(tokio::sync::Notify::new());
    let go = reading.clone();
    let backend = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        go.notified().await;
        let (mut buf, mut log) = (BytesMut::new(), Vec::new());
        let req = read_request(&mut s, &mut buf, &mut log, None)
            .await
            .unwrap();
        s.write_all(OK).await.unwrap();
        req
    });
    let pool = Pools::default().pool_for(addr, &Default::default());
    let fed = Arc::new(AtomicUsize::new(0));
    let (tx, body) = chan_body();
    let count = fed.clone();
    tokio::spawn(async move {
        for i in 0..FRAMES {
            let frame = Bytes::from(vec![(i % 251) as u8; FRAME]);
            if tx.send(Ok(Frame::data(frame))).await.is_err() {
                return;
            }
            count.fetch_add(1, Ordering::SeqCst);
        }
    });
    let none = Added::default();
    let sending = tokio::spawn({
        let pool = pool.clone();
        async move {
            let resp = pool.send(post(body, &[]), &none).await.unwrap();
            ok_body(resp).await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let taken = fed.load(Ordering::SeqCst);
    assert!(
        taken < FRAMES / 2,
        "{taken} of {FRAMES} frames taken while the backend read nothing"
    );
    reading.notify_one();
    assert_eq!(sending.await.unwrap(), "ok");
    let req = backend.await.unwrap();
    let head_end = req.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    // De-chunk what arrived and compare it with what was fed.
    let (mut body, mut at) = (Vec::new(), head_end);
    loop {
        let line = req[at..].windows(2).position(|w| w == b"\r\n").unwrap();
        let size = usize::from_str_radix(std::str::from_utf8(&req[at..at + line]).unwrap(), 16);
        let size = size.unwrap();
        body.extend_from_slice(&req[at + line + 2..at + line + 2 + size]);
        at += line + 2 + size + 2;
        if size == 0 {
            break;
        }
    }
    assert_eq!(at, req.len());
    assert_eq!(body.len(), FRAME * FRAMES);
    assert!(
        body.chunks(FRAME)
            .enumerate()
            .all(|(i, c)| c.iter().all(|&b| b == (i % 251) as u8))
    );
    assert_eq!(pool.idle_len(), 1);
}

/// The backend answers 413 after the head and 3 body bytes, while the body has more to
/// come: the client gets the 413, nothing more of the body is written, and the connection
/// is closed rather than reused.
#[tokio::test]
async fn an_answer_before_the_body_ends_stops_the_body_and_the_connection_is_not_reused() {
    let early: &[u8] = b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 4\r\n\r\nbig!";
    let be = recorder(vec![Act::Early(3, early)]).await;
    let pool = Pools::default().pool_for(be.addr, &Default::default());
    let (tx, body) = chan_body();
    tx.send(data(b"abc")).await.unwrap();
    let resp = pool
        .send(post(body, &[("content-length", "10")]), &Added::default())
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    // More of the body, once answered, goes nowhere.
    let _ = tx.send(data(b"defg")).await;
    let got = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(got, "big!");
    assert_eq!(pool.idle_len(), 0);
    // The backend sees the connection end with what came before the answer.
    let ended = be.ended.clone();
    assert!(eventually(|| ended.lock().unwrap().len() == 1).await);
    let log = String::from_utf8(be.ended.lock().unwrap()[0].clone()).unwrap();
    assert_eq!(
        log,
        "POST /up HTTP/1.1\r\nhost: example.test\r\ncontent-length: 10\r\n\r\nabc"
    );
    drop(tx);
}

/// The client's body fails midway (over the limit, too slow, a broken chunk): the exchange
/// ends with the body's error, and the upstream connection closes with nothing written after
/// what came before the failure; chunked or by length.
#[tokio::test]
async fn a_client_body_failing_midway_closes_the_upstream_connection() {
    for (fields, sent) in [
        (
            &[("content-length", "100")][..],
            "content-length: 100\r\n\r\nabc",
        ),
        (&[][..], "transfer-encoding: chunked\r\n\r\n3\r\nabc\r\n"),
    ] {
        let be = recorder(vec![Act::Answer(OK, false)]).await;
        let pool = Pools::default().pool_for(be.addr, &Default::default());
        let (tx, body) = chan_body();
        let feeder = tokio::spawn(async move {
            tx.send(data(b"abc")).await.unwrap();
            // Let the first frame go out before the failure.
            tokio::time::sleep(Duration::from_millis(50)).await;
            tx.send(Err("client body failed".into())).await.unwrap();
            tx.send(data(b"after")).await.ok();
        });
        let e = pool
            .send(post(body, fields), &Added::default())
            .await
            .unwrap_err();
        assert_eq!(e.to_string(), "request body: client body failed", "{sent}");
        assert!(!e.is_connect());
        feeder.await.unwrap();
        let ended = be.ended.clone();
        assert!(
            eventually(|| ended.lock().unwrap().len() == 1).await,
            "{sent}"
        );
        let log = String::from_utf8(be.ended.lock().unwrap()[0].clone()).unwrap();
        assert_eq!(
            log,
            format!("POST /up HTTP/1.1\r\nhost: example.test\r\n{sent}")
        );
        assert_eq!(pool.idle_len(), 0, "{sent}");
    }
}

/// A connection that carried a body goes back to the pool only after an exactly framed
/// answer: surplus bytes after it, or a body ended by the close, keep it out; and a body,
/// once sent, is never sent again when the reused connection closes without an answer.
#[tokio::test]
async fn a_connection_that_carried_a_body_is_reused_only_after_an_exactly_framed_answer() {
    let be = recorder(vec![
        Act::Answer(OK, false),
        Act::Answer(OK, false),
        Act::Answer(
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokEXTRA",
            false,
        ),
        Act::Answer(OK, false),
        Act::Answer(b"HTTP/1.1 200 OK\r\n\r\nuntil close", true),
        Act::Answer(OK, false),
        Act::Drop,
    ])
    .await;
    let pool = Pools::default().pool_for(be.addr, &Default::default());
    let conns = || be.conns.load(Ordering::SeqCst);
    let post_x = || {
        post(
            crate::lifecycle::body::full("x"),
            &[("content-length", "1")],
        )
    };
    let none = Added::default();
    let send = |req| pool.send(req, &none);
    for (want_body, idle, conns_after) in [
        (&b"ok"[..], 1, 1),
        (b"ok", 1, 1),
        (b"ok", 0, 1),
        (b"ok", 1, 2),
        (b"until close", 0, 2),
        (b"ok", 1, 3),
    ] {
        let got = ok_body(send(post_x()).await.unwrap()).await;
        assert_eq!(&got[..], want_body);
        assert_eq!((pool.idle_len(), conns()), (idle, conns_after));
    }
    // The reused connection closes after reading the body: not sent again.
    let e = send(post_x()).await.unwrap_err();
    assert!(
        e.to_string()
            .starts_with("upstream closed the connection without answering"),
        "{e}"
    );
    assert_eq!((be.requests.lock().unwrap().len(), conns()), (7, 3));
}

/// A 101 to an upgrade hands the socket over, bytes read past the head first; a CONNECT's
/// 2xx does the same; neither connection goes back to a pool. A 101 to a request with a
/// body that asked for none is an error.
#[tokio::test]
async fn an_upgrade_or_a_tunnel_hands_the_socket_over() {
    for (method, uri, fields, answer) in [
        (
            Method::GET,
            "/chat",
            &[("upgrade", "websocket"), ("connection", "upgrade")][..],
            &b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\nEARLY"[..],
        ),
        (
            Method::CONNECT,
            "example.test:443",
            &[][..],
            b"HTTP/1.1 200 OK\r\n\r\nEARLY",
        ),
    ] {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let backend = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let (mut buf, mut log) = (BytesMut::new(), Vec::new());
            let head = read_request(&mut s, &mut buf, &mut log, None).await.unwrap();
            s.write_all(answer).await.unwrap();
            // Then an echo of what comes through the tunnel.
            let mut b = [0u8; 64];
            let n = s.read(&mut b).await.unwrap();
            s.write_all(&b[..n]).await.unwrap();
            String::from_utf8(head).unwrap()
        });
        let pool = Pools::default().pool_for(addr, &Default::default());
        let mut req = Request::builder()
            .method(method.clone())
            .uri(uri)
            .header("host", "example.test");
        for (k, v) in fields {
            req = req.header(*k, *v);
        }
        let mut resp = pool
            .send(req.body(empty()).unwrap(), &Added::default())
            .await
            .unwrap();
        if method == Method::GET {
            assert_eq!(resp.status(), 101);
            assert_eq!(resp.headers()[UPGRADE], "websocket");
            assert_eq!(resp.headers()[CONNECTION], "upgrade");
        } else {
            assert_eq!(resp.status(), 200);
        }
        assert!(resp.body().is_end_stream());
        let on = resp
            .extensions_mut()
            .remove::<crate::upgrade::OnUpgrade>()
            .unwrap();
        let mut up = on.await.unwrap();
        let mut got = [0u8; 5];
        up.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"EARLY", "{method}");
        up.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        up.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping", "{method}");
        let head = backend.await.unwrap();
        let line = if method == Method::GET {
            "GET /chat HTTP/1.1\r\n"
        } else {
            "CONNECT example.test:443 HTTP/1.1\r\n"
        };
        assert!(head.starts_with(line), "{head}");
        assert_eq!(pool.idle_len(), 0);
    }

    let be = recorder(vec![Act::Answer(
        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\n\r\n",
        false,
    )])
    .await;
    let pool = Pools::default().pool_for(be.addr, &Default::default());
    let req = post(
        crate::lifecycle::body::full("x"),
        &[("content-length", "1")],
    );
    let e = pool.send(req, &Added::default()).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid answer from upstream: 101 to a request without an upgrade"
    );
}

/// Polls `cond` for up to a second.
async fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..100 {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cond()
}
