//! Request vectors: what a client may send (smuggling shapes), on a fresh connection, after
//! a bodiless request and after one with a body.

use std::sync::Arc;
use std::time::Duration;

use super::*;

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
        // On a fresh connection, after a bodiless request, and after one with a body (read
        // off the same buffer: this head must start where that body ended).
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
