//! Answer heads. In: the bytes an upstream sent, at the front of the read buffer. Out: the
//! answer's status, version and fields (values sharing the buffer's bytes), which framing
//! fields it had, and ([`body_plan`]) how its body is read and whether its connection may
//! carry another request after it.
//!
//! What is refused ([`Error`], a 502 for the client): a head httparse refuses, more than
//! [`MAX_HEADERS`] fields, a status outside 100-999, a field name or value `http` refuses;
//! and by [`body_plan`]: `Transfer-Encoding` in an HTTP/1.0 answer, both framing fields,
//! lengths that differ or are not numbers. A connection may be reused only after an
//! HTTP/1.1 answer that did not ask to close and was framed by length or chunks.

use bytes::{Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderValue, StatusCode, Version};

use crate::body::Framing;
use crate::field_name::{self, Class};
use crate::{Error, MAX_HEADERS, asks_to_close, is_known_token, parse_decimal};

/// How an answer's body is read, and whether its connection may be reused after it, from
/// its head and whether it answers a HEAD.
pub fn body_plan(
    status: StatusCode,
    version: Version,
    headers: &HeaderMap,
    seen: Seen,
    head_request: bool,
) -> Result<(Framing, bool), Error> {
    if seen.transfer_encoding {
        // RFC 9112 §6.1: a 1.0 message cannot be chunked; its framing is faulty.
        if version == Version::HTTP_10 {
            return Err(Error::Invalid("transfer-encoding in an HTTP/1.0 answer"));
        }
        // §6.3: both framings "ought to be handled as an error": two readers could frame
        // the body two ways, and what follows it could be taken for the next answer.
        if seen.content_length {
            return Err(Error::Invalid("content-length with transfer-encoding"));
        }
    }
    let mut keep =
        version == Version::HTTP_11 && !seen.close && !(seen.connection && asks_to_close(headers));
    let state =
        if head_request || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
            Framing::Length(0)
        } else {
            match framing(headers, seen)? {
                Delimit::Chunked { with_length } => {
                    // (Both framings were refused above; kept as a second guard.)
                    keep &= !with_length;
                    Framing::Chunked
                }
                Delimit::Length(n) => Framing::Length(n),
                Delimit::Close => {
                    keep = false;
                    Framing::Close
                }
            }
        };
    Ok((state, keep))
}

/// A parsed answer head.
pub struct ResponseHead {
    pub status: StatusCode,
    pub version: Version,
    pub headers: HeaderMap,
    pub seen: Seen,
    /// The status line's phrase, when it is not the standard one.
    pub reason: Option<Bytes>,
}

/// Which of the fields that frame the body the head has (noted while parsing, so a head
/// without them is not searched for them).
#[derive(Debug, Default, Clone, Copy)]
pub struct Seen {
    /// A `Connection` field that was one known token (`keep-alive`, `close`...) was read
    /// and left out of the map; this says whether it was `close`.
    close: bool,
    /// A `Connection` field is in the map (a list, or a token that may name a field).
    connection: bool,
    transfer_encoding: bool,
    content_length: bool,
    /// The value of the head's one `Content-Length` field when it is a plain number (else
    /// [`framing`] reads every value from the map).
    length: Option<u64>,
    /// Some hop-by-hop field is in the map; without one the service need not look for them
    /// ([`RawBody::clean_head`]).
    pub hop: bool,
}

/// Byte ranges of a field's name and value.
type Span = (std::ops::Range<usize>, std::ops::Range<usize>);

/// Parses an answer head off the front of `buf`; `None` until it is complete. The fields go
/// into `map` (emptied first), which the head then takes.
pub fn parse_response(
    buf: &mut BytesMut,
    map: &mut HeaderMap,
) -> Result<Option<ResponseHead>, Error> {
    if buf.is_empty() {
        return Ok(None);
    }
    // Where each field's name and value sit in `buf`, so the values can share its bytes.
    // (Neither array is zeroed: at 100 fields that would cost more than the parse.)
    let (len, code, minor, reason, spans) = {
        let mut fields = [const { std::mem::MaybeUninit::uninit() }; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut []);
        let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut resp,
            buf,
            &mut fields,
        ) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err(Error::TooManyFields),
            Err(_) => return Err(Error::Invalid("malformed head")),
        };
        let base = buf.as_ptr() as usize;
        let offset = |s: &[u8]| s.as_ptr() as usize - base;
        // An empty phrase ("HTTP/1.1 200\r\n") may be a static "" outside `buf`, whose
        // offset would be garbage (a panic, found by fuzzing): it is the empty range, and
        // the client reads the empty phrase the upstream sent.
        let reason = resp.reason.map(|r| {
            if r.is_empty() {
                return 0..0;
            }
            let start = offset(r.as_bytes());
            start..start + r.len()
        });
        let spans: Vec<Span> = resp
            .headers
            .iter()
            .map(|f| {
                let (n, v) = (offset(f.name.as_bytes()), offset(f.value));
                (n..n + f.name.len(), v..v + f.value.len())
            })
            .collect();
        (
            len,
            resp.code.unwrap_or(0),
            resp.version.unwrap_or(1),
            reason,
            spans,
        )
    };
    let head = buf.split_to(len).freeze();
    let status = StatusCode::from_u16(code).map_err(|_| Error::Invalid("status code"))?;
    let version = if minor == 0 {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    // A phrase of its own ("200 Fine") goes on to the client, as hyper passes it.
    let reason = reason
        .map(|r| head.slice(r))
        .filter(|r| Some(&r[..]) != status.canonical_reason().map(str::as_bytes));
    let mut headers = std::mem::take(map);
    headers.clear();
    headers.reserve(spans.len());
    let mut seen = Seen::default();
    for (name, value) in spans {
        let (name, class) =
            field_name::parse(&head[name]).map_err(|_| Error::Invalid("header field name"))?;
        if name == CONNECTION && is_known_token(&head[value.clone()]) {
            // The usual `Connection: keep-alive` (or `close`) is hop-by-hop and names no
            // other field: read here and left out, where the service would remove it
            // (hashed lookups, ~300 instructions per answer).
            seen.close |= head[value].eq_ignore_ascii_case(b"close");
            continue;
        }
        let value = HeaderValue::from_maybe_shared(head.slice(value))
            .map_err(|_| Error::Invalid("header field value"))?;
        seen.connection |= name == CONNECTION;
        seen.transfer_encoding |= name == TRANSFER_ENCODING;
        seen.hop |= class == Class::HopByHop;
        if name == CONTENT_LENGTH {
            // A second field leaves the length to `framing`, which checks they agree.
            seen.length = if seen.content_length {
                None
            } else {
                parse_decimal(value.as_bytes().trim_ascii())
            };
            seen.content_length = true;
        }
        headers.append(name, value);
    }
    Ok(Some(ResponseHead {
        status,
        version,
        headers,
        seen,
        reason,
    }))
}

/// How an answer's body is delimited.
#[derive(Debug, PartialEq)]
enum Delimit {
    Chunked { with_length: bool },
    Length(u64),
    Close,
}

/// The body's framing from the fields (RFC 9112 §6.3).
fn framing(headers: &HeaderMap, seen: Seen) -> Result<Delimit, Error> {
    let has_length = seen.content_length;
    if seen.transfer_encoding {
        // Only chunked as the final coding delimits the body; anything else runs to close.
        // By bytes, from the last field: a value that is not text (obs-text) must not be
        // skipped, or an earlier `chunked` would pass for the final coding.
        let last = headers
            .get_all(TRANSFER_ENCODING)
            .iter()
            .next_back()
            .and_then(|v| {
                v.as_bytes()
                    .split(|&b| b == b',')
                    .map(<[u8]>::trim_ascii)
                    .rfind(|t| !t.is_empty())
            });
        return Ok(match last {
            Some(t) if t.eq_ignore_ascii_case(b"chunked") => Delimit::Chunked {
                with_length: has_length,
            },
            _ => Delimit::Close,
        });
    }
    if !has_length {
        return Ok(Delimit::Close);
    }
    if let Some(n) = seen.length {
        return Ok(Delimit::Length(n));
    }
    // Repeated values (one field or several) must agree.
    let mut length = None;
    for v in headers.get_all(CONTENT_LENGTH) {
        for part in v.as_bytes().split(|&b| b == b',') {
            let n = parse_decimal(part.trim_ascii()).ok_or(Error::Invalid("content-length"))?;
            if length.is_some_and(|l| l != n) {
                return Err(Error::Invalid("content-length values differ"));
            }
            length = Some(n);
        }
    }
    length
        .map(Delimit::Length)
        .ok_or(Error::Invalid("content-length"))
}

#[cfg(test)]
mod tests {
    use http::HeaderName;

    use super::*;

    #[test]
    fn framing_follows_rfc_9112() {
        let map = |fields: &[(&str, &str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in fields {
                m.append(
                    HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    HeaderValue::from_str(v).unwrap(),
                );
            }
            m
        };
        let f = |fields: &[(&str, &str)]| {
            let m = map(fields);
            let seen = Seen {
                close: false,
                connection: false,
                transfer_encoding: m.contains_key(TRANSFER_ENCODING),
                content_length: m.contains_key(CONTENT_LENGTH),
                // No length read while parsing: `framing` reads every value.
                ..Seen::default()
            };
            framing(&m, seen).map_err(|e| e.to_string())
        };
        assert_eq!(f(&[]), Ok(Delimit::Close));
        assert_eq!(f(&[("content-length", "0")]), Ok(Delimit::Length(0)));
        assert_eq!(
            f(&[("transfer-encoding", "gzip, chunked")]),
            Ok(Delimit::Chunked { with_length: false })
        );
        assert_eq!(
            f(&[
                ("transfer-encoding", "chunked"),
                ("transfer-encoding", "gzip")
            ]),
            Ok(Delimit::Close)
        );
        assert_eq!(
            f(&[("content-length", "9999999999999999999")]),
            Ok(Delimit::Length(9_999_999_999_999_999_999))
        );
        assert!(f(&[("content-length", "99999999999999999999")]).is_err());
        assert!(f(&[("content-length", "")]).is_err());
        assert!(f(&[("content-length", "1 2")]).is_err());
    }
}
