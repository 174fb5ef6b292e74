//! A raw-socket HTTP/1.1 client for the tests of the proxy's own server (`h1_server.rs`,
//! `h1_bodies.rs`): answers read off the wire by their framing, and the proxy in front of an
//! echo backend they start from.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{EchoBackend, backend_of, echo_backend, proxy_with, route, wb};

/// Writes `request` and reads the answer to it (head only when it is a HEAD request).
pub async fn ask<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    buf: &mut Vec<u8>,
    request: &[u8],
) -> (String, Vec<u8>) {
    s.write_all(request).await.unwrap();
    if request.starts_with(b"HEAD ") {
        read_head(s, buf, true).await
    } else {
        read_answer(s, buf).await
    }
}

/// One answer off `s`: its head, and its body (by `content-length` or chunks; none for 1xx,
/// 204 and 304).
pub async fn read_answer<S: AsyncRead + Unpin>(s: &mut S, buf: &mut Vec<u8>) -> (String, Vec<u8>) {
    read_head(s, buf, false).await
}

async fn read_head<S: AsyncRead + Unpin>(
    s: &mut S,
    buf: &mut Vec<u8>,
    head_request: bool,
) -> (String, Vec<u8>) {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            let start = end + 4;
            let status = head.get(9..12).unwrap_or("");
            let bodiless =
                head_request || status.starts_with('1') || status == "204" || status == "304";
            if !bodiless && field(&head, "transfer-encoding").as_deref() == Some("chunked") {
                if let Some((body, used)) = dechunk(&buf[start..]) {
                    buf.drain(..start + used);
                    return (head, body);
                }
            } else {
                let len = if bodiless {
                    0
                } else {
                    field(&head, "content-length").map_or(0, |v| v.parse().unwrap())
                };
                if buf.len() >= start + len {
                    let body = buf[start..start + len].to_vec();
                    buf.drain(..start + len);
                    return (head, body);
                }
            }
        }
        read_some(s, buf).await;
    }
}

/// Appends to `buf` what `s` has within 5 s; fails when it closes or sends nothing.
pub async fn read_some<S: AsyncRead + Unpin>(s: &mut S, buf: &mut Vec<u8>) {
    let mut chunk = [0u8; 8192];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut chunk))
        .await
        .expect("bytes within 5 s")
        .unwrap();
    assert!(n > 0, "closed: {}", String::from_utf8_lossy(buf));
    buf.extend_from_slice(&chunk[..n]);
}

/// A field of an answer's head.
pub fn field(head: &str, name: &str) -> Option<String> {
    head.lines().skip(1).find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
    })
}

/// A chunked body's data and the bytes it took; `None` until the last chunk is in.
pub fn dechunk(b: &[u8]) -> Option<(Vec<u8>, usize)> {
    let mut out = Vec::new();
    let mut at = 0;
    loop {
        let line_end = at + b[at..].windows(2).position(|w| w == b"\r\n")?;
        let size = usize::from_str_radix(std::str::from_utf8(&b[at..line_end]).unwrap(), 16)
            .expect("a chunk size");
        at = line_end + 2;
        if size == 0 {
            return (b.len() >= at + 2).then_some((out, at + 2));
        }
        if b.len() < at + size + 2 {
            return None;
        }
        out.extend_from_slice(&b[at..at + size]);
        at += size + 2;
    }
}

/// The proxy with one route, `/api`, to an echo backend, and a connection to it.
pub async fn echo_proxy() -> (EchoBackend, tollgate_proxy::Proxy, TcpStream) {
    let b = echo_backend("b").await;
    let (proxy, url) = proxy_with(
        vec![route("api", "/api", vec![wb("b", 1)])],
        vec![("b", backend_of(&[&b]))],
    )
    .await;
    let s = TcpStream::connect(url.trim_start_matches("http://"))
        .await
        .unwrap();
    (b, proxy, s)
}

/// An echo backend's JSON answer.
pub fn json(body: &[u8]) -> serde_json::Value {
    serde_json::from_slice(body).unwrap()
}
