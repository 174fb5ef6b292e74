//! Desync and framing vectors (issue 26, findings 4 and 6), over real sockets: a raw backend
//! that records every byte it is sent and answers from a script, and raw clients. Two tables:
//! response vectors (what a backend may send back: surplus bytes, broken framing, interim
//! answers) and request vectors (what a client may send: smuggling shapes). For each, the
//! client's status, that the backend saw exactly the requests the proxy routed, and that the
//! next client gets its own answer and nothing of another's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the backend writes for a request: pieces, each after a pause of its own (ms); an
/// empty piece closes the connection.
type Writes = Vec<(u64, Vec<u8>)>;
/// The backend's script: the writes that answer a request, by the request's path.
type Script = Arc<dyn Fn(&str) -> Writes + Send + Sync>;

/// A backend that reads each request whole (head, then a Content-Length or chunked body) and
/// records it as it came; a request cut short by the proxy is recorded in `partial`.
struct RawBackend {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<String>>>,
    partial: Arc<Mutex<Vec<String>>>,
    conns: Arc<AtomicUsize>,
}

impl RawBackend {
    /// The paths of the whole requests seen, in order.
    fn paths(&self) -> Vec<String> {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.split(' ').nth(1).unwrap_or("").to_owned())
            .collect()
    }
}

async fn raw_backend(script: Script) -> RawBackend {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let b = RawBackend {
        addr: l.local_addr().unwrap(),
        requests: Arc::default(),
        partial: Arc::default(),
        conns: Arc::default(),
    };
    let (requests, partial, conns) = (b.requests.clone(), b.partial.clone(), b.conns.clone());
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            conns.fetch_add(1, Ordering::SeqCst);
            let (requests, partial, script) = (requests.clone(), partial.clone(), script.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let len = loop {
                        if let Some(n) = whole_request(&buf) {
                            break n;
                        }
                        let mut chunk = [0u8; 4096];
                        match s.read(&mut chunk).await {
                            Ok(n) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                            _ => {
                                if !buf.is_empty() {
                                    let p = String::from_utf8_lossy(&buf).into_owned();
                                    partial.lock().unwrap().push(p);
                                }
                                return;
                            }
                        }
                    };
                    let req = String::from_utf8_lossy(&buf[..len]).into_owned();
                    buf.drain(..len);
                    let path = req.split(' ').nth(1).unwrap_or("").to_owned();
                    requests.lock().unwrap().push(req);
                    for (pause, bytes) in script(&path) {
                        if pause > 0 {
                            tokio::time::sleep(Duration::from_millis(pause)).await;
                        }
                        // An empty write closes the connection.
                        if bytes.is_empty() || s.write_all(&bytes).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    b
}

/// The length of the whole request at the front of `b`, once it is all there.
fn whole_request(b: &[u8]) -> Option<usize> {
    let end = b.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&b[..end]).to_ascii_lowercase();
    let field = |name: &str| {
        head.lines()
            .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_owned()))
    };
    if field("transfer-encoding:").is_some() {
        // Chunks: size lines and data up to the last chunk and the empty line.
        let mut at = end;
        loop {
            let line = at + b[at..].windows(2).position(|w| w == b"\r\n")?;
            let size = usize::from_str_radix(
                std::str::from_utf8(&b[at..line]).ok()?.split(';').next()?,
                16,
            )
            .ok()?;
            at = line + 2;
            if size == 0 {
                let rest = b[at..].windows(2).position(|w| w == b"\r\n")?;
                // Trailers (if any) end with an empty line.
                let trailers_end = if rest == 0 {
                    at + 2
                } else {
                    at + b[at..].windows(4).position(|w| w == b"\r\n\r\n")? + 4
                };
                return Some(trailers_end);
            }
            if b.len() < at + size + 2 {
                return None;
            }
            at += size + 2;
        }
    }
    let len: usize = field("content-length:").map_or(Some(0), |v| v.parse().ok())?;
    (b.len() >= end + len).then_some(end + len)
}

/// A complete answer naming `id` in a field and in its body.
fn answer_for(id: &str) -> Vec<u8> {
    let body = format!("for {id}");
    format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nx-secret: {id}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The id a path `/r/ID` names.
fn id_of(path: &str) -> &str {
    path.strip_prefix("/r/").unwrap_or(path)
}

/// A proxy routing everything to `be`.
async fn proxy_to(be: &RawBackend) -> (tollgate_proxy::Proxy, String) {
    proxy_with(
        vec![route("r", "/", vec![wb("b", 1)])],
        vec![("b", backend_at(be.addr))],
    )
    .await
}

/// A client's request for `id`: without a body (the proxy's own HTTP/1 exchange upstream)
/// or with one (hyper's client), asking the proxy to close after the answer.
fn request_for(id: &str, with_body: bool) -> Vec<u8> {
    if with_body {
        format!(
            "POST /r/{id} HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc"
        )
    } else {
        format!("GET /r/{id} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    }
    .into_bytes()
}

/// What a client read: the status (0 when none) and everything.
struct Got {
    status: u16,
    all: String,
}

async fn ask(url: &str, request: &[u8]) -> Got {
    let all = raw(url, request).await;
    let status = all
        .strip_prefix("HTTP/1.1 ")
        .and_then(|s| s.get(..3))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Got { status, all }
}

/// The body of a whole answer, its chunks joined when it came chunked.
fn body_of(all: &str) -> String {
    let Some((head, body)) = all.split_once("\r\n\r\n") else {
        return String::new();
    };
    if !head
        .to_ascii_lowercase()
        .contains("\r\ntransfer-encoding: chunked")
    {
        return body.to_owned();
    }
    let (mut out, mut rest) = (String::new(), body);
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size, 16) else {
            return format!("(bad chunk) {body}");
        };
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].strip_prefix("\r\n").unwrap_or("");
    }
    out
}

/// Whether `got` is exactly the answer for `id`: its own secret and body, no other's.
fn own(got: &Got, id: &str) -> Result<(), String> {
    let secrets: Vec<&str> = got
        .all
        .lines()
        .filter_map(|l| l.strip_prefix("x-secret: "))
        .collect();
    if got.status != 200 || secrets != [id] || body_of(&got.all) != format!("for {id}") {
        return Err(format!("not the answer for {id}: {:?}", got.all));
    }
    Ok(())
}

/// Asserts `got` is exactly the answer for `id`.
fn assert_own(got: &Got, id: &str, ctx: &str) {
    if let Err(e) = own(got, id) {
        panic!("{ctx}: {e}");
    }
}

/// How the backend misbehaves after a complete answer, in the rounds test.
#[derive(Debug, Clone, Copy)]
enum Surplus {
    /// A copy of the answer (with its secret) in the same write.
    SameWrite,
    /// A copy of the answer 300 ms later, on the idle connection.
    Late,
}

/// Finding 4: a backend that follows each complete answer with a copy of it (its secret
/// too), in the same write or 300 ms later. 20 rounds of 4 clients at once; each client gets
/// exactly its own answer, and the backend sees each request once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn surplus_answers_never_reach_another_client() {
    let runs = [
        (Surplus::SameWrite, false),
        (Surplus::SameWrite, true),
        (Surplus::Late, false),
        (Surplus::Late, true),
    ];
    let all = runs.map(|(surplus, with_body)| async move {
        let script: Script = Arc::new(move |path: &str| {
            let a = answer_for(id_of(path));
            // 100 ms before the answer: a round's four requests are all in flight at once,
            // each on a connection of its own, so no connection is reused before its
            // surplus came (a request written before stray bytes arrive cannot be told
            // from its answer).
            match surplus {
                Surplus::SameWrite => vec![(100, [a.clone(), a].concat())],
                Surplus::Late => vec![(100, a.clone()), (300, a)],
            }
        });
        let be = raw_backend(script).await;
        let (_p, url) = proxy_to(&be).await;
        let mut sent = Vec::new();
        for round in 0..20 {
            let clients: Vec<_> = (0..4)
                .map(|c| {
                    let id = format!("{round}-{c}");
                    sent.push(format!("/r/{id}"));
                    let url = url.clone();
                    tokio::spawn(async move {
                        let got = ask(&url, &request_for(&id, with_body)).await;
                        (id, got)
                    })
                })
                .collect();
            for c in clients {
                let (id, got) = c.await.unwrap();
                assert_own(
                    &got,
                    &id,
                    &format!("{surplus:?}, body {with_body}, round {round}"),
                );
            }
            // The late copies arrive on idle connections.
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
        let mut paths = be.paths();
        paths.sort();
        sent.sort();
        assert_eq!(
            paths, sent,
            "{surplus:?}, body {with_body}: each request once"
        );
    });
    futures_util::future::join_all(all).await;
}

/// What the client must get for a response vector.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    /// Its own answer, whole.
    Own,
    /// 502, and the connection never reused.
    BadGateway,
    /// A body that breaks after the head: 502 when the break came with the head (the proxy's
    /// own exchange checks the first chunk line it read with it); through hyper's client,
    /// which hands over the head before the body, 502 or the client's connection closed
    /// without a byte of the broken answer.
    BrokenBody,
}

/// Response vectors: the backend's answer to the first request. The proxy answers as
/// expected, the connection is never reused (a second request gets its own answer, from a
/// connection of its own when the first was not clean), and the backend sees each request once.
#[tokio::test]
async fn broken_or_surplus_answers_are_refused_or_cut_off() {
    let own_then = |extra: &[u8]| [answer_for("v").as_slice(), extra].concat();
    let chunked = |rest: &str| {
        format!("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nx-secret: v\r\n\r\n{rest}")
            .into_bytes()
    };
    let head = |fields: &str, body: &str| {
        format!("HTTP/1.1 200 OK\r\n{fields}x-secret: v\r\n\r\n{body}").into_bytes()
    };
    let vectors: Vec<(&str, Writes, Expect, bool)> = vec![
        // (name, writes, expected, connection reusable afterwards)
        ("clean", vec![(0, own_then(b""))], Expect::Own, true),
        (
            "surplus answer in the same write",
            vec![(0, own_then(&answer_for("evil")))],
            Expect::Own,
            false,
        ),
        (
            "surplus garbage in the same write",
            vec![(0, own_then(b"XYZ"))],
            Expect::Own,
            false,
        ),
        (
            "surplus answer 50 ms later",
            vec![(0, own_then(b"")), (50, answer_for("evil"))],
            Expect::Own,
            false,
        ),
        (
            "surplus after a chunked body",
            vec![(
                0,
                chunked(&format!(
                    "5\r\nfor v\r\n0\r\n\r\n{}",
                    "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
                )),
            )],
            Expect::Own,
            false,
        ),
        (
            "content-length and transfer-encoding",
            vec![(
                0,
                head(
                    "content-length: 5\r\ntransfer-encoding: chunked\r\n",
                    "5\r\nfor v\r\n0\r\n\r\n",
                ),
            )],
            Expect::BadGateway,
            false,
        ),
        (
            "transfer-encoding and content-length",
            vec![(
                0,
                head(
                    "transfer-encoding: chunked\r\ncontent-length: 5\r\n",
                    "5\r\nfor v\r\n0\r\n\r\n",
                ),
            )],
            Expect::BadGateway,
            false,
        ),
        (
            "chunk size not hex",
            vec![(0, chunked("zz\r\nfor v\r\n0\r\n\r\n"))],
            Expect::BrokenBody,
            false,
        ),
        (
            "chunk size overflows",
            vec![(0, chunked("10000000000000005\r\nfor v\r\n0\r\n\r\n"))],
            Expect::BrokenBody,
            false,
        ),
        (
            "chunk size line ends in LF only",
            vec![(0, chunked("5\nfor v\r\n0\r\n\r\n"))],
            Expect::BrokenBody,
            false,
        ),
        (
            "chunk extension with a bare CR",
            vec![(0, chunked("5;a\rb\r\nfor v\r\n0\r\n\r\n"))],
            Expect::BrokenBody,
            false,
        ),
        (
            "content-length with a plus",
            vec![(0, head("content-length: +5\r\n", "for v"))],
            Expect::BadGateway,
            false,
        ),
        (
            "content-length not a number",
            vec![(0, head("content-length: 5x\r\n", "for v"))],
            Expect::BadGateway,
            false,
        ),
        (
            "conflicting content-lengths",
            vec![(
                0,
                head("content-length: 5\r\ncontent-length: 6\r\n", "for v"),
            )],
            Expect::BadGateway,
            false,
        ),
        (
            "conflicting content-length list",
            vec![(0, head("content-length: 5, 6\r\n", "for v"))],
            Expect::BadGateway,
            false,
        ),
        (
            "one byte more than the length",
            vec![(0, own_then(b"X"))],
            Expect::Own,
            false,
        ),
        (
            "surplus garbage 5 ms later",
            vec![(0, own_then(b"")), (5, b"XYZ".to_vec())],
            Expect::Own,
            false,
        ),
        (
            "content-length with transfer-encoding: gzip",
            vec![(
                0,
                head("content-length: 5\r\ntransfer-encoding: gzip\r\n", "for v"),
            )],
            Expect::BadGateway,
            false,
        ),
        (
            "content-length list with a sign",
            vec![(0, head("content-length: 5, +5\r\n", "for v"))],
            Expect::BadGateway,
            false,
        ),
        (
            "chunk size with a sign",
            vec![(0, chunked("+5\r\nfor v\r\n0\r\n\r\n"))],
            Expect::BrokenBody,
            false,
        ),
        (
            "100 Continue, then close",
            vec![
                (0, b"HTTP/1.1 100 Continue\r\n\r\n".to_vec()),
                (0, Vec::new()),
            ],
            Expect::BadGateway,
            false,
        ),
        (
            "103 Early Hints, then close",
            vec![
                (
                    0,
                    b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n".to_vec(),
                ),
                (0, Vec::new()),
            ],
            Expect::BadGateway,
            false,
        ),
        (
            "unsolicited 101",
            vec![(
                0,
                b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: evil\r\n\r\n"
                    .to_vec(),
            )],
            Expect::BadGateway,
            false,
        ),
    ];
    let mut failures = Vec::new();
    for with_body in [false, true] {
        for (name, writes, expect, reusable) in &vectors {
            let ctx = format!("{name} (body {with_body})");
            let writes = writes.clone();
            let expect = *expect;
            let script: Script = Arc::new(move |path: &str| match id_of(path) {
                "v" => writes.clone(),
                id => vec![(0, answer_for(id))],
            });
            let be = raw_backend(script).await;
            let (_p, url) = proxy_to(&be).await;
            let got = ask(&url, &request_for("v", with_body)).await;
            let mut bad = Vec::new();
            match expect {
                Expect::Own => bad.extend(own(&got, "v").err()),
                Expect::BadGateway => {
                    if got.status != 502 || got.all.contains("x-secret") {
                        bad.push(format!("want 502: {:?}", got.all));
                    }
                }
                Expect::BrokenBody => {
                    let refused = got.status == 502 && !got.all.contains("x-secret");
                    if !(refused || (with_body && got.all.is_empty())) {
                        bad.push(format!("want 502 or nothing: {:?}", got.all));
                    }
                }
            }
            // Late stray bytes, if any, land on the idle connection.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let next = ask(&url, &request_for("next", with_body)).await;
            bad.extend(own(&next, "next").err());
            if be.paths() != ["/r/v", "/r/next"] {
                bad.push(format!("requests: {:?}", be.paths()));
            }
            let conns = be.conns.load(Ordering::SeqCst);
            if conns != if *reusable { 1 } else { 2 } {
                bad.push(format!("{conns} connections"));
            }
            if !bad.is_empty() {
                failures.push(format!("{ctx}: {}", bad.join("; ")));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Sends `request` on a fresh connection and reads until close (or 2 s).
async fn send_raw(url: &str, request: &[u8]) -> Got {
    ask(url, request).await
}

/// Request vectors: raw client bytes, the status the client must get, and the paths the
/// backend must see (whole requests; nothing smuggled, nothing cut short).
#[tokio::test]
async fn request_framing_vectors() {
    // (name, raw bytes, status, whole requests the backend sees)
    let vectors: Vec<(&str, &[u8], u16, &[&str])> = vec![
        (
            "clean chunked",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            200,
            &["/r/1"],
        ),
        (
            "CL.TE",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /r/smuggled HTTP/1.1\r\nHost: a\r\n\r\n",
            400,
            &[],
        ),
        (
            "TE.CL",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n5c\r\nGPOST /r/smuggled HTTP/1.1\r\nHost: a\r\nContent-Length: 15\r\n\r\nx=1\r\n0\r\n\r\n",
            400,
            &[],
        ),
        (
            "TE xchunked",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\nContent-Length: 3\r\n\r\nabc",
            400,
            &[],
        ),
        (
            "TE chunked then identity",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            400,
            &[],
        ),
        (
            "TE twice chunked",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            400,
            &[],
        ),
        (
            "TE gzip, chunked",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            400,
            &[],
        ),
        (
            "TE with a space before the colon",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            400,
            &[],
        ),
        (
            "TE folded onto the next line",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            400,
            &[],
        ),
        (
            "TE with a vertical tab",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: \x0bchunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            400,
            &[],
        ),
        (
            "TE in HTTP/1.0",
            b"POST /r/1 HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            400,
            &[],
        ),
        (
            "CL with a plus",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\nabc",
            400,
            &[],
        ),
        (
            "CL with a leading zero",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nContent-Length: 03\r\n\r\nabc",
            400,
            &[],
        ),
        (
            "CL with an inner space",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nContent-Length: 1 3\r\n\r\nabc",
            400,
            &[],
        ),
        (
            "CL hex",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nContent-Length: 0x3\r\n\r\nabc",
            400,
            &[],
        ),
        (
            "CL negative",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nContent-Length: -3\r\n\r\nabc",
            400,
            &[],
        ),
        (
            "CL twice, the same",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
            400,
            &[],
        ),
        (
            "CL twice, different",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
            400,
            &[],
        ),
        (
            "CL list",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 3\r\n\r\nabc",
            400,
            &[],
        ),
        (
            "CL overflows",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\nabc",
            400,
            &[],
        ),
        (
            "CL zero twice on a bodiless GET",
            b"GET /r/1 HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n",
            400,
            &[],
        ),
        (
            "CL and TE on a GET",
            b"GET /r/1 HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            400,
            &[],
        ),
        (
            "LF-only lines",
            b"GET /r/1 HTTP/1.1\nHost: a\n\n",
            400,
            &[],
        ),
        (
            "LF-only after the request line",
            b"GET /r/1 HTTP/1.1\nHost: a\r\n\r\n",
            400,
            &[],
        ),
        (
            "LF-only end of head",
            b"GET /r/1 HTTP/1.1\r\nHost: a\r\n\n",
            400,
            &[],
        ),
        (
            "LF-only field line with a body",
            b"POST /r/1 HTTP/1.1\r\nHost: a\nContent-Length: 3\r\n\r\nabc",
            400,
            &[],
        ),
        (
            "bare CR in a field value",
            b"GET /r/1 HTTP/1.1\r\nHost: a\r\nX-A: b\rc\r\n\r\n",
            400,
            &[],
        ),
        (
            "NUL in a field value",
            b"GET /r/1 HTTP/1.1\r\nHost: a\r\nX-A: b\x00c\r\n\r\n",
            400,
            &[],
        ),
        (
            "invalid field name",
            b"GET /r/1 HTTP/1.1\r\nHost: a\r\nX(A): b\r\n\r\n",
            400,
            &[],
        ),
        (
            "empty field name",
            b"GET /r/1 HTTP/1.1\r\nHost: a\r\n: b\r\n\r\n",
            400,
            &[],
        ),
        (
            "clean content-length",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
            200,
            &["/r/1"],
        ),
        (
            "TE in capitals",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: CHUNKED\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            200,
            &["/r/1"],
        ),
        (
            "a request in a content-length body stays body",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nContent-Length: 37\r\nConnection: close\r\n\r\nGET /r/smuggled HTTP/1.1\r\nHost: a\r\n\r\n",
            200,
            &["/r/1"],
        ),
        (
            "a field folded onto the next line",
            b"GET /r/1 HTTP/1.1\r\nHost: a\r\nX-A: b\r\n c\r\n\r\n",
            400,
            &[],
        ),
        (
            "a space in the request target",
            b"GET /r/1 x HTTP/1.1\r\nHost: a\r\n\r\n",
            400,
            &[],
        ),
        (
            "NUL in the request line",
            b"GET /r/1\x00 HTTP/1.1\r\nHost: a\r\n\r\n",
            400,
            &[],
        ),
        (
            "CL.TE with TE first and a trailing space",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked \r\nContent-Length: 3\r\n\r\nabc",
            400,
            &[],
        ),
        (
            "TE empty",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\nContent-Length: 3\r\n\r\nabc",
            400,
            &[],
        ),
        (
            "CL empty",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nContent-Length:\r\n\r\nabc",
            400,
            &[],
        ),
        (
            "chunk size not hex",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
            400,
            &[],
        ),
        (
            "chunk size overflows",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000003\r\nabc\r\n0\r\n\r\n",
            400,
            &[],
        ),
        (
            "chunk size line ends in LF only",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\nabc\r\n0\r\n\r\n",
            400,
            &[],
        ),
        (
            "chunk extension with a bare CR",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3;a\rb\r\nabc\r\n0\r\n\r\n",
            400,
            &[],
        ),
        (
            "chunk extension with a bare LF",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3;a\nb\r\nabc\r\n0\r\n\r\n",
            400,
            &[],
        ),
        (
            "chunk data longer than its size",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcd\r\n0\r\n\r\n",
            400,
            &[],
        ),
        (
            "chunk with a negative size",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n-3\r\nabc\r\n0\r\n\r\n",
            400,
            &[],
        ),
        (
            "NUL in a chunk size",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\x00\r\nabc\r\n0\r\n\r\n",
            400,
            &[],
        ),
        (
            "trailer with an invalid name",
            b"POST /r/1 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX(A): b\r\n\r\n",
            400,
            &[],
        ),
        (
            "pipelined after an error",
            b"GET /r/1 HTTP/1.1\r\nHost: a\r\nContent-Length: +0\r\n\r\nGET /r/2 HTTP/1.1\r\nHost: a\r\n\r\n",
            400,
            &[],
        ),
    ];
    let script: Script = Arc::new(|path: &str| vec![(0, answer_for(id_of(path)))]);
    let mut failures = Vec::new();
    for (name, request, status, paths) in vectors {
        let be = raw_backend(script.clone()).await;
        let (_p, url) = proxy_to(&be).await;
        // On a fresh connection (the head goes to whichever server side takes it first),
        // after a bodiless request (the proxy's own server read it, and reads this head),
        // and after one with a body (hyper's server owns the connection from then on).
        let prefixes: [(&str, &[u8]); 3] = [
            ("fresh", b""),
            (
                "after a bodiless request",
                b"GET /r/0 HTTP/1.1\r\nHost: a\r\n\r\n",
            ),
            (
                "after a request with a body",
                b"POST /r/0 HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\nx",
            ),
        ];
        for (i, (way, prefix)) in prefixes.into_iter().enumerate() {
            let ctx = format!("{name} ({way})");
            let before = be.paths().len();
            let partial_before = be.partial.lock().unwrap().len();
            let bytes = [prefix, request].concat();
            let got = send_raw(&url, &bytes).await;
            let last = got.all.rfind("HTTP/1.1 ").map_or("", |i| &got.all[i..]);
            let last_status: u16 = last.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
            // Let a request cut short reach the backend, if one went.
            tokio::time::sleep(Duration::from_millis(20)).await;
            let mut want: Vec<&str> = Vec::new();
            if i > 0 {
                want.push("/r/0");
            }
            want.extend_from_slice(paths);
            let mut bad = Vec::new();
            if last_status != status {
                bad.push(format!(
                    "status {last_status}, want {status}: {:?}",
                    got.all
                ));
            }
            if be.paths()[before..] != want {
                bad.push(format!("backend saw {:?}", &be.paths()[before..]));
            }
            // A break past the first chunk cuts off the upstream request it began (the
            // backend sees it end, never whole); any other leaves the backend untouched.
            let mid_stream = MID_STREAM.contains(&name);
            if !mid_stream && be.partial.lock().unwrap().len() != partial_before {
                bad.push(format!(
                    "cut short upstream: {:?}",
                    be.partial.lock().unwrap()
                ));
            }
            if got.all.contains("smuggled") {
                bad.push(format!("smuggled: {:?}", got.all));
            }
            if !bad.is_empty() {
                failures.push(format!("{ctx}: {}", bad.join("; ")));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Request vectors whose break comes after a whole first chunk, which may have gone upstream.
const MID_STREAM: &[&str] = &[
    "chunk data longer than its size",
    "trailer with an invalid name",
];

/// Finding 6: an invalid chunk size reached after part of the body went upstream answers
/// 400 (not 502), and the upstream request is cut off: the backend never sees it whole.
#[tokio::test]
async fn an_invalid_chunk_mid_stream_resets_the_upstream_request_and_answers_400() {
    let script: Script = Arc::new(|path: &str| vec![(0, answer_for(id_of(path)))]);
    let be = raw_backend(script).await;
    let (_p, url) = proxy_to(&be).await;
    let mut s = TcpStream::connect(url.trim_start_matches("http://"))
        .await
        .unwrap();
    s.write_all(b"POST /r/1 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
        .await
        .unwrap();
    // The first chunk goes upstream before the bad one comes.
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.write_all(b"zz\r\nabc\r\n0\r\n\r\n").await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut out)).await;
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 400 "), "{out:?}");
    assert!(
        eventually(|| be.partial.lock().unwrap().len() == 1).await,
        "the upstream request is cut off"
    );
    assert!(be.paths().is_empty(), "never whole: {:?}", be.paths());
    let partial = be.partial.lock().unwrap()[0].clone();
    assert!(partial.contains("abc"), "part went upstream: {partial:?}");
}
