//! Response vectors: what a backend may send back (surplus bytes, broken framing, interim
//! answers), on both client paths, and that the connection it came on is never reused.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::*;

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
