//! Request heads. In: the bytes a client sent, at the front of the read buffer. Out: the
//! request as an [`http::Request`] whose target and values share the buffer's bytes, with
//! how its body is framed and what it asks of the connection.
//!
//! What is refused ([`Error`]): anything httparse refuses (a bare CR, a field name that is no
//! token, a control byte in a value), an ambiguous framing ([`crate::framing`]), a
//! `Transfer-Encoding` in an HTTP/1.0 request (RFC 9112 §6.1), a method or target `http`
//! refuses, more than [`MAX_HEADERS`] fields.

use bytes::{Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, EXPECT, TE, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri, Version};

use crate::body::Framing;
use crate::{Error, MAX_HEADERS, field_name, framing, parse_decimal};

/// A request head, parsed.
#[derive(Debug)]
pub struct RequestHead {
    /// Method, target, version (HTTP/1.0 or HTTP/1.1) and fields, as sent.
    pub request: Request<()>,
    /// How its body is framed: [`Framing::Length`] (0 when it has none) or
    /// [`Framing::Chunked`].
    pub body: Framing,
    /// The connection closes after the answer: HTTP/1.1 with `Connection: close`, or
    /// HTTP/1.0 without `Connection: keep-alive`.
    pub close: bool,
    /// `Expect: 100-continue` (HTTP/1.1): the client waits for an interim answer before it
    /// sends the body.
    pub expect_continue: bool,
    /// An upgrade is asked (HTTP/1.1, `Upgrade` with `Connection: upgrade`).
    pub upgrade: bool,
    /// `TE` lists `trailers`: the client takes trailer fields on a chunked answer.
    pub te_trailers: bool,
    /// The head's bytes, as read.
    pub raw: Bytes,
}

/// Parses a request head off the front of `buf`: `Ok(None)` until it is whole; its bytes are
/// taken only when it parses. `spare` is room left in the field map for fields added later
/// (so the map does not grow on the way: a rehash and a realloc).
pub fn parse_request(buf: &mut BytesMut, spare: usize) -> Result<Option<RequestHead>, Error> {
    if buf.is_empty() {
        return Ok(None);
    }
    let mut close = false;
    let mut keep_alive = false;
    let mut upgrade_token = false;
    let mut has_upgrade = false;
    let mut expect_continue = false;
    let mut te_trailers = false;
    let mut body = Framing::Length(0);
    // Each field's name, and where its value sits in `buf` (so values can share its bytes).
    let (len, minor, method, target, fields) = {
        let mut slots = [const { std::mem::MaybeUninit::uninit() }; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut []);
        let len = match httparse::ParserConfig::default()
            .parse_request_with_uninit_headers(&mut req, buf, &mut slots)
        {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err(Error::TooManyFields),
            Err(_) => return Err(Error::Invalid("malformed head")),
        };
        framing::check_request_head(&buf[..len], req.headers)?;
        let (Some(method), Some(path), Some(minor)) = (req.method, req.path, req.version) else {
            return Err(Error::Invalid("malformed head"));
        };
        let method = Method::from_bytes(method.as_bytes()).map_err(|_| Error::Invalid("method"))?;
        let base = buf.as_ptr() as usize;
        let offset = |s: &[u8]| s.as_ptr() as usize - base;
        let mut fields = Vec::with_capacity(req.headers.len());
        for f in req.headers.iter() {
            let (name, _) =
                field_name::parse(f.name.as_bytes()).map_err(|_| Error::Invalid("field name"))?;
            let v = f.value;
            if name == CONNECTION {
                // The usual one token first; a list token by token.
                if v.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if v.eq_ignore_ascii_case(b"keep-alive") {
                    keep_alive = true;
                } else {
                    for t in v.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                        close |= t.eq_ignore_ascii_case(b"close");
                        keep_alive |= t.eq_ignore_ascii_case(b"keep-alive");
                        upgrade_token |= t.eq_ignore_ascii_case(b"upgrade");
                    }
                }
            } else if name == CONTENT_LENGTH {
                // One plain number: `check_request_head` refused anything else.
                let n = parse_decimal(v.trim_ascii()).ok_or(Error::Invalid("content-length"))?;
                body = Framing::Length(n);
            } else if name == TRANSFER_ENCODING {
                if minor == 0 {
                    return Err(Error::Invalid("transfer-encoding in an HTTP/1.0 request"));
                }
                body = Framing::Chunked;
            } else if name == EXPECT {
                expect_continue |=
                    minor == 1 && v.trim_ascii().eq_ignore_ascii_case(b"100-continue");
            } else if name == UPGRADE {
                has_upgrade = true;
            } else if name == TE {
                te_trailers |= v
                    .split(|&b| b == b',')
                    .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"trailers"));
            }
            let start = offset(v);
            fields.push((name, start..start + v.len()));
        }
        let start = offset(path.as_bytes());
        (len, minor, method, start..start + path.len(), fields)
    };
    // The head, frozen so the target and values share its bytes; put back if they do not
    // parse.
    let head = buf.split_to(len).freeze();
    let Some((uri, headers)) = request_parts(&head, target, fields, spare) else {
        let rest = buf.split();
        buf.extend_from_slice(&head);
        buf.unsplit(rest);
        return Err(Error::Invalid("request target or field value"));
    };
    let version = if minor == 0 {
        close |= !keep_alive;
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    let mut request = Request::new(());
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = version;
    *request.headers_mut() = headers;
    Ok(Some(RequestHead {
        request,
        body,
        close,
        expect_continue,
        upgrade: minor == 1 && has_upgrade && upgrade_token,
        te_trailers,
        raw: head,
    }))
}

fn request_parts(
    head: &Bytes,
    target: std::ops::Range<usize>,
    fields: Vec<(HeaderName, std::ops::Range<usize>)>,
    spare: usize,
) -> Option<(Uri, HeaderMap)> {
    let uri = Uri::from_maybe_shared(head.slice(target)).ok()?;
    let mut headers = HeaderMap::with_capacity(fields.len() + spare);
    for (name, value) in fields {
        headers.append(
            name,
            HeaderValue::from_maybe_shared(head.slice(value)).ok()?,
        );
    }
    Some((uri, headers))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &[u8]) -> Result<Option<RequestHead>, Error> {
        parse_request(&mut BytesMut::from(raw), 0)
    }

    #[test]
    fn a_bodiless_get_keeps_the_connection() {
        let head = parse(b"GET /a?b HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(head.request.uri(), "/a?b");
        assert_eq!(head.body, Framing::Length(0));
        assert!(!head.close && !head.expect_continue && !head.upgrade);
    }

    #[test]
    fn bodies_are_framed_by_length_or_chunks() {
        let head = parse(b"POST / HTTP/1.1\r\nContent-Length: 12\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(head.body, Framing::Length(12));
        let head = parse(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(head.body, Framing::Chunked);
    }

    #[test]
    fn http_1_0_closes_unless_it_asks_to_keep_alive() {
        assert!(parse(b"GET / HTTP/1.0\r\n\r\n").unwrap().unwrap().close);
        let head = parse(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(!head.close);
        assert_eq!(head.request.version(), Version::HTTP_10);
        assert!(matches!(
            parse(b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Err(Error::Invalid(_))
        ));
    }

    #[test]
    fn expect_and_upgrade_are_noted() {
        let head = parse(b"PUT / HTTP/1.1\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(head.expect_continue);
        let head = parse(
            b"GET / HTTP/1.1\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n\r\n",
        )
        .unwrap()
        .unwrap();
        assert!(head.upgrade && !head.close);
        // `Upgrade` without the `Connection` token asks for nothing.
        let head = parse(b"GET / HTTP/1.1\r\nUpgrade: websocket\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(!head.upgrade);
        let head = parse(b"GET / HTTP/1.1\r\nTE: gzip, Trailers\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(head.te_trailers);
    }

    #[test]
    fn a_partial_head_takes_nothing_and_a_refused_one_leaves_the_buffer() {
        let mut buf = BytesMut::from(&b"GET / HTTP/1.1\r\nHost: x\r\n"[..]);
        assert!(parse_request(&mut buf, 0).unwrap().is_none());
        assert_eq!(buf.len(), 25);
        let raw = &b"GET / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"[..];
        let mut buf = BytesMut::from(raw);
        assert!(matches!(parse_request(&mut buf, 0), Err(Error::Framing(_))));
        assert_eq!(&buf[..], raw);
    }

    #[test]
    fn pipelined_requests_come_one_at_a_time() {
        let mut buf = BytesMut::from(&b"GET /1 HTTP/1.1\r\n\r\nGET /2 HTTP/1.1\r\n\r\n"[..]);
        let one = parse_request(&mut buf, 0).unwrap().unwrap();
        assert_eq!(one.request.uri(), "/1");
        assert_eq!(&one.raw[..], b"GET /1 HTTP/1.1\r\n\r\n");
        let two = parse_request(&mut buf, 0).unwrap().unwrap();
        assert_eq!(two.request.uri(), "/2");
        assert!(buf.is_empty());
    }
}
