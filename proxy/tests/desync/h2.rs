//! HTTP/2 request vectors: what an HTTP/2 client may send to make the HTTP/1 request the
//! proxy writes upstream mean something else (a content-length that disagrees with the DATA
//! sent, connection-specific fields such as Transfer-Encoding, CR or LF inside a field value
//! or the path, upper-case names). Raw frames, so that nothing between the test and the
//! proxy fixes the request first.

use super::common::raw_h2::*;
use super::*;

/// An HPACK header block of literal fields without indexing, names and values as given
/// (no Huffman coding; each under 127 bytes).
fn hpack(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in fields {
        assert!(name.len() < 127 && value.len() < 127);
        out.push(0x00);
        out.push(name.len() as u8);
        out.extend_from_slice(name.as_bytes());
        out.push(value.len() as u8);
        out.extend_from_slice(value.as_bytes());
    }
    out
}

/// How the proxy ended the client's stream.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// An answer; the status when it is one of HPACK's indexed ones (200, 400...), else 0.
    Answered(u16),
    /// RST_STREAM with this error code.
    Reset(u32),
    /// GOAWAY with this error code.
    GoAway(u32),
    /// The connection closed, or 5 s passed, with neither.
    Nothing,
}

/// The status of a response header block whose first field is an indexed `:status`.
fn indexed_status(block: &[u8]) -> u16 {
    match block.first() {
        Some(0x88) => 200,
        Some(0x89) => 204,
        Some(0x8a) => 206,
        Some(0x8b) => 304,
        Some(0x8c) => 400,
        Some(0x8d) => 404,
        Some(0x8e) => 500,
        _ => 0,
    }
}

/// Sends one request on stream 1 of a fresh HTTP/2 connection: its header block, then each
/// DATA payload (the last with END_STREAM; none: END_STREAM on the headers).
async fn h2_ask(addr: &str, fields: &[(&str, &str)], data: &[&[u8]]) -> Outcome {
    let addr = addr.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut out = PREFACE.to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[]));
    let flags = END_HEADERS | if data.is_empty() { END_STREAM } else { 0 };
    out.extend(frame(HEADERS, flags, 1, &hpack(fields)));
    for (i, d) in data.iter().enumerate() {
        let last = i + 1 == data.len();
        out.extend(frame(DATA, if last { END_STREAM } else { 0 }, 1, d));
    }
    s.write_all(&out).await.unwrap();
    let read = async {
        while let Some((kind, flags, stream, payload)) = read_frame(&mut s).await {
            let code = |at: usize| {
                payload
                    .get(at..at + 4)
                    .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
            };
            match kind {
                SETTINGS if flags & ACK == 0 => {
                    let _ = s.write_all(&frame(SETTINGS, ACK, 0, &[])).await;
                }
                HEADERS if stream == 1 => return Outcome::Answered(indexed_status(&payload)),
                RST_STREAM if stream == 1 => return Outcome::Reset(code(0)),
                GOAWAY => return Outcome::GoAway(code(4)),
                _ => {}
            }
        }
        Outcome::Nothing
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .unwrap_or(Outcome::Nothing)
}

/// Each vector: its fields, DATA frames, how the stream must end (a field hyper's HTTP/2
/// server cannot decode into a header map ends the whole connection), and the whole requests the
/// backend must see. The request pseudo-fields come first; `:path` is `/r/<vector number>`
/// unless the vector names its own. Nothing named `smuggled` may reach the backend, whole or
/// in part, and a refused request never arrives whole.
#[tokio::test]
async fn http2_request_vectors() {
    let smuggled = "GET /r/smuggled HTTP/1.1\r\nHost: a\r\n\r\n";
    let with_smuggled = format!("abc{smuggled}");
    let chunked_then_smuggled = format!("0\r\n\r\n{smuggled}");
    type Vector<'a> = (
        &'a str,
        Vec<(&'a str, &'a str)>,
        Vec<&'a [u8]>,
        Outcome,
        &'a [&'a str],
    );
    let vectors: Vec<Vector<'_>> = vec![
        (
            "content-length matching the DATA",
            vec![("content-length", "3")],
            vec![b"abc"],
            Outcome::Answered(200),
            &["/r/0"],
        ),
        (
            "content-length above the DATA sent",
            vec![("content-length", "10")],
            vec![b"abc"],
            Outcome::Reset(PROTOCOL_ERROR),
            &[],
        ),
        (
            "content-length below the DATA sent (a request in the excess)",
            vec![("content-length", "3")],
            vec![with_smuggled.as_bytes()],
            Outcome::Reset(PROTOCOL_ERROR),
            &[],
        ),
        (
            "content-length below the DATA, excess in a second frame",
            vec![("content-length", "3")],
            vec![b"abc", smuggled.as_bytes()],
            Outcome::Reset(PROTOCOL_ERROR),
            &[],
        ),
        (
            "transfer-encoding: chunked with a chunked body and a request behind it",
            vec![("transfer-encoding", "chunked")],
            vec![chunked_then_smuggled.as_bytes()],
            Outcome::Reset(PROTOCOL_ERROR),
            &[],
        ),
        (
            "content-length and transfer-encoding",
            vec![("content-length", "3"), ("transfer-encoding", "chunked")],
            vec![b"abc"],
            Outcome::Reset(PROTOCOL_ERROR),
            &[],
        ),
        (
            "connection: keep-alive",
            vec![("connection", "keep-alive")],
            vec![],
            Outcome::Reset(PROTOCOL_ERROR),
            &[],
        ),
        (
            "CRLF and a field in a value",
            vec![("x-a", "b\r\ntransfer-encoding: chunked")],
            vec![b"0\r\n\r\nGET /r/smuggled HTTP/1.1\r\nHost: a\r\n\r\n"],
            Outcome::GoAway(PROTOCOL_ERROR),
            &[],
        ),
        (
            "LF alone in a value",
            vec![("x-a", "b\nhost: evil")],
            vec![],
            Outcome::GoAway(PROTOCOL_ERROR),
            &[],
        ),
        (
            "CRLF and a request in the path",
            vec![(":path", "/r/9 HTTP/1.1\r\nHost: a\r\n\r\nGET /r/smuggled")],
            vec![],
            Outcome::Reset(PROTOCOL_ERROR),
            &[],
        ),
        (
            "a space in the path",
            vec![(":path", "/r/10 HTTP/1.1")],
            vec![],
            Outcome::Reset(PROTOCOL_ERROR),
            &[],
        ),
        (
            "an upper-case field name",
            vec![("X-A", "b")],
            vec![],
            Outcome::GoAway(PROTOCOL_ERROR),
            &[],
        ),
        (
            "te other than trailers",
            vec![("te", "chunked")],
            vec![],
            Outcome::Reset(PROTOCOL_ERROR),
            &[],
        ),
    ];
    let mut failures = Vec::new();
    for (i, (name, extra, data, want, backend_sees)) in vectors.into_iter().enumerate() {
        let be = raw_backend(Arc::new(|path: &str| vec![(0, answer_for(id_of(path)))])).await;
        let (_p, addr) = proxy_to(&be).await;
        let path = format!("/r/{i}");
        let own_path = extra.iter().any(|(n, _)| *n == ":path");
        let mut fields = vec![
            (":method", if data.is_empty() { "GET" } else { "POST" }),
            (":scheme", "http"),
            (":authority", "a"),
        ];
        if !own_path {
            fields.push((":path", path.as_str()));
        }
        fields.extend(extra);
        let got = h2_ask(&addr, &fields, &data).await;
        // Whatever reached the backend has arrived by now (the answer came after it).
        tokio::time::sleep(Duration::from_millis(100)).await;
        let seen = be.paths();
        let partial = be.partial.lock().unwrap().clone();
        let all_bytes = format!("{:?}{partial:?}", be.requests.lock().unwrap());
        if got != want {
            failures.push(format!("{name}: stream ended {got:?}, want {want:?}"));
        }
        if seen != backend_sees {
            failures.push(format!(
                "{name}: backend saw {seen:?}, want {backend_sees:?}"
            ));
        }
        if all_bytes.contains("smuggled") || all_bytes.to_ascii_lowercase().contains("evil") {
            failures.push(format!(
                "{name}: smuggled bytes reached the backend: {all_bytes}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
