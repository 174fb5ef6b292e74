//! Heads and chunk framing, written for the wire. In: a request or an answer as `http`
//! types, and what is known of its body. Out: the head's bytes (appended to a buffer the
//! caller writes) and how the body that follows is framed.
//!
//! An answer's framing comes from its `Content-Length` when it has one, else from the
//! body's exact size, else chunks (to an HTTP/1.1 client) or the connection's close (to an
//! HTTP/1.0 one). HEAD answers, 1xx, 204 and 304 carry no body; every answer gets a `date`.

use std::io::Write as _;
use std::time::SystemTime;

use http::header::{CONNECTION, CONTENT_LENGTH, DATE, TRANSFER_ENCODING};
use http::{HeaderName, HeaderValue, Method, StatusCode};

use crate::body::Framing;
use crate::{asks_to_close, parse_decimal};

/// What is known of an answer's body when its head is written.
#[derive(Debug, Clone, Copy)]
pub struct BodyShape {
    /// The body has ended already (it is empty).
    pub end: bool,
    /// Its exact size, when known.
    pub exact: Option<u64>,
}

/// What the answer must know of the request it answers.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestShape {
    /// A HEAD request: the answer has no body.
    pub head: bool,
    /// An HTTP/1.0 request: no chunks, and `connection: keep-alive` when kept.
    pub http10: bool,
}

/// A chunk's size line.
pub fn chunk_size(len: usize, out: &mut Vec<u8>) {
    // Into the buffer, not through a String (no allocation per chunk).
    let _ = write!(out, "{len:x}\r\n");
}

/// The end of a chunked body (no trailers).
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// The end of a chunked body with trailer fields: the last chunk, the fields, the empty line.
pub fn last_chunk_with_trailers(trailers: &http::HeaderMap, out: &mut Vec<u8>) {
    out.extend_from_slice(b"0\r\n");
    for (name, value) in trailers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Writes the request line (`target` in origin form) and `fields`, then the body's framing
/// field when `fields` has none. A POST, PUT or PATCH
/// without a length gets `content-length: 0` (RFC 9110 §8.6: a client should send it;
/// hyper's client did not).
pub fn request_head<'a>(
    method: &Method,
    target: &str,
    fields: impl Iterator<Item = (&'a HeaderName, &'a HeaderValue)>,
    body: Framing,
    out: &mut Vec<u8>,
) {
    out.clear();
    let path = target;
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let mut has_length = false;
    for (name, value) in fields {
        has_length |= *name == CONTENT_LENGTH;
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let m = method;
    match body {
        Framing::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        Framing::Length(n)
            if !has_length
                && (n > 0 || m == Method::POST || m == Method::PUT || m == Method::PATCH) =>
        {
            let _ = write!(out, "content-length: {n}\r\n");
        }
        _ => {}
    }
    out.extend_from_slice(b"\r\n");
}

/// Writes the status line and fields; returns the body's framing and whether the
/// connection closes after it.
pub fn response_head(
    parts: &http::response::Parts,
    reason: Option<&[u8]>,
    body: BodyShape,
    request: RequestShape,
    mut close: bool,
    out: &mut Vec<u8>,
) -> (Framing, bool) {
    let status = parts.status;
    let head_request = request.head;
    if status == StatusCode::OK && reason.is_none() {
        out.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
    } else {
        out.extend_from_slice(b"HTTP/1.1 ");
        out.extend_from_slice(status.as_str().as_bytes());
        out.push(b' ');
        match reason {
            Some(r) => out.extend_from_slice(r),
            None => out.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes()),
        }
        out.extend_from_slice(b"\r\n");
    }
    // HEAD answers, 1xx, 204 and 304 carry no body; only 1xx, 204 and 304 no length.
    let no_length = status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let no_body = no_length || head_request;
    let BodyShape { end, exact } = body;
    let mut framing = None;
    let mut wrote_date = false;
    let mut has_connection = false;
    for (name, value) in &parts.headers {
        if *name == CONTENT_LENGTH {
            if framing.is_some() {
                continue; // a repeated length: the first one stands
            }
            if end && !head_request {
                continue; // nothing to send: `content-length: 0` below, as hyper wrote
            }
            let Some(n) = parse_decimal(value.as_bytes().trim_ascii()) else {
                continue; // not a length: framed below from the body
            };
            framing = Some(Framing::Length(n));
        } else if *name == TRANSFER_ENCODING {
            // The body comes decoded; it is framed here.
            continue;
        } else if *name == CONNECTION {
            has_connection = true;
        } else if *name == DATE {
            wrote_date = true;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    // An answer that asks to close says so itself; the connection closes after it.
    let wrote_close = has_connection && asks_to_close(&parts.headers);
    close |= wrote_close;
    let framing = match framing {
        Some(f) => f,
        None if end || exact == Some(0) => {
            if !no_length && !head_request {
                out.extend_from_slice(b"content-length: 0\r\n");
            }
            Framing::Length(0)
        }
        None => match exact {
            Some(n) if !no_length => {
                let _ = write!(out, "content-length: {n}\r\n");
                Framing::Length(n)
            }
            Some(_) => Framing::Length(0),
            None if no_body => Framing::Length(0),
            // An HTTP/1.0 client reads no chunks: the close ends the body.
            None if request.http10 => {
                close = true;
                Framing::Close
            }
            None => {
                out.extend_from_slice(b"transfer-encoding: chunked\r\n");
                Framing::Chunked
            }
        },
    };
    if close && !wrote_close {
        out.extend_from_slice(b"connection: close\r\n");
    } else if !close && request.http10 && !has_connection {
        // An HTTP/1.0 client that asked to keep the connection is told it is kept.
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
    if !wrote_date {
        out.extend_from_slice(b"date: ");
        http_date(out);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    let framing = if no_body { Framing::Length(0) } else { framing };
    (framing, close)
}

/// Appends the current time as an IMF-fixdate (`Wed, 02 Dec 2026 12:17:13 GMT`), formatted
/// once a second per thread.
pub fn http_date(out: &mut Vec<u8>) {
    thread_local! {
        static CACHED: std::cell::Cell<(u64, [u8; 29])> = const { std::cell::Cell::new((u64::MAX, [0; 29])) };
    }
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (at, text) = CACHED.get();
    if at == secs {
        out.extend_from_slice(&text);
        return;
    }
    let text = format_http_date(secs);
    CACHED.set((secs, text));
    out.extend_from_slice(&text);
}

fn format_http_date(secs: u64) -> [u8; 29] {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(i64::try_from(days).unwrap_or(0));
    let s = format!(
        "{}, {d:02} {} {y:04} {:02}:{:02}:{:02} GMT",
        DAYS[(days % 7) as usize],
        MONTHS[(m.clamp(1, 12) - 1) as usize],
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    );
    let mut text = [b' '; 29];
    let n = s.len().min(29);
    text[..n].copy_from_slice(&s.as_bytes()[..n]);
    text
}

/// Days since 1970-01-01 to (year, month, day), Howard Hinnant's algorithm.
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    (
        y,
        u32::try_from(m).unwrap_or(1),
        u32::try_from(d).unwrap_or(1),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailers_written_are_read_back_by_the_decoder() {
        let mut fields = http::HeaderMap::new();
        fields.insert("grpc-status", HeaderValue::from_static("0"));
        fields.append("x-sum", HeaderValue::from_static("a1"));
        fields.append("x-sum", HeaderValue::from_static("b2"));
        let mut out = Vec::new();
        chunk_size(3, &mut out);
        out.extend_from_slice(b"abc\r\n");
        last_chunk_with_trailers(&fields, &mut out);
        assert!(out.ends_with(b"\r\nx-sum: b2\r\n\r\n"), "{out:?}");
        let mut buf = bytes::BytesMut::from(&out[..]);
        let mut d = crate::body::Decoder::new(Framing::Chunked);
        let mut got = None;
        loop {
            match d.decode(&mut buf).unwrap() {
                crate::body::Step::Frame(f) if f.is_trailers() => got = f.into_trailers().ok(),
                crate::body::Step::Frame(_) => {}
                crate::body::Step::End | crate::body::Step::More => break,
            }
            if d.is_done() {
                break;
            }
        }
        assert_eq!(got, Some(fields));
        assert!(buf.is_empty());
    }

    #[test]
    fn dates_are_imf_fixdates() {
        assert_eq!(&format_http_date(0), b"Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(
            &format_http_date(1_796_213_833),
            b"Wed, 02 Dec 2026 12:17:13 GMT"
        );
    }
}
