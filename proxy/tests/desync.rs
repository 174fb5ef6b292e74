//! Desync and framing vectors (issue 26, findings 4 and 6), over real sockets: a raw backend
//! that records every byte it is sent and answers from a script, and raw clients. Two tables:
//! response vectors (what a backend may send back: surplus bytes, broken framing, interim
//! answers) and request vectors (what a client may send: smuggling shapes). For each, the
//! client's status, that the backend saw exactly the requests the proxy routed, and that the
//! next client gets its own answer and nothing of another's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "desync/h2.rs"]
mod h2;
#[path = "desync/requests.rs"]
mod requests;
#[path = "desync/responses.rs"]
mod responses;

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
