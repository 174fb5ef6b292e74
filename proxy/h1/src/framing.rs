//! Strict HTTP/1 request framing (RFC 9112 §2.2, §6; RFC 9110 §8.6), checked where a request
//! head enters, before a byte of it goes anywhere. In: a request head as read (its line
//! endings and fields), or a parsed field map. Out: `Ok`, or the [`FramingError`] the client
//! is answered 400 for (and its connection closed).
//!
//! Why stricter than the RFC's "may accept": a head that two parsers could frame in two ways
//! (both `Content-Length` and `Transfer-Encoding`, `Content-Length: 010`, `chunked` twice, a
//! line ending in LF alone) is how requests are smuggled past a front end. The proxy frames
//! the upstream request itself, but whatever sits in front of it may have read the head
//! otherwise; refusing it is the one answer everyone agrees on.
//!
//! What passes: lines ending in CRLF; at most one `Transfer-Encoding` field, whose value is
//! `chunked` (any case), and then no `Content-Length`; at most one `Content-Length` field,
//! whose value is a plain decimal number without a leading zero (`0` itself is fine).

use http::HeaderMap;
use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};

use crate::parse_decimal;

/// Why a request head is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    /// A line of the head ends in LF without CR.
    #[error("a head line ends in a bare LF")]
    BareLf,
    /// Both `Content-Length` and `Transfer-Encoding`.
    #[error("both content-length and transfer-encoding")]
    LengthAndChunked,
    /// `Transfer-Encoding` other than one field saying `chunked`.
    #[error("transfer-encoding other than one `chunked`")]
    TransferEncoding,
    /// `Content-Length` other than one field holding a plain number.
    #[error("content-length not one plain number")]
    ContentLength,
}

/// The framing fields seen so far.
#[derive(Debug, Default)]
struct Seen {
    lengths: u8,
    encodings: u8,
}

impl Seen {
    fn content_length(&mut self, value: &[u8]) -> Result<(), FramingError> {
        self.lengths = self.lengths.saturating_add(1);
        let v = value.trim_ascii();
        // `parse_decimal` takes digits only (no sign, no list, no space, at most 19).
        if self.lengths > 1 || (v.len() > 1 && v[0] == b'0') || parse_decimal(v).is_none() {
            return Err(FramingError::ContentLength);
        }
        Ok(())
    }

    fn transfer_encoding(&mut self, value: &[u8]) -> Result<(), FramingError> {
        self.encodings = self.encodings.saturating_add(1);
        if self.encodings > 1 || !value.trim_ascii().eq_ignore_ascii_case(b"chunked") {
            return Err(FramingError::TransferEncoding);
        }
        Ok(())
    }

    fn finish(&self) -> Result<(), FramingError> {
        if self.lengths > 0 && self.encodings > 0 {
            return Err(FramingError::LengthAndChunked);
        }
        Ok(())
    }
}

/// Checks a request head as httparse read it: `head` is its bytes (through the empty line)
/// and `fields` the fields parsed from them. httparse takes a bare LF as a line end, so each
/// line's end is looked at: the two bytes before each field name, and the head's last four.
/// (A bare CR, or one not followed by LF, httparse refuses itself.)
pub fn check_request_head(
    head: &[u8],
    fields: &[httparse::Header<'_>],
) -> Result<(), FramingError> {
    if !head.ends_with(b"\r\n\r\n") {
        return Err(FramingError::BareLf);
    }
    let base = head.as_ptr() as usize;
    let mut seen = Seen::default();
    for f in fields {
        let at = (f.name.as_ptr() as usize).wrapping_sub(base);
        if at < 2 || head.get(at - 2..at) != Some(b"\r\n") {
            return Err(FramingError::BareLf);
        }
        let name = f.name.as_bytes();
        // (`eq_ignore_ascii_case` compares lengths first: most fields cost one compare.)
        if name.eq_ignore_ascii_case(b"content-length") {
            seen.content_length(f.value)?;
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            seen.transfer_encoding(f.value)?;
        }
    }
    seen.finish()
}

/// Checks the framing fields of an HTTP/1 request hyper's server parsed. hyper has refused
/// differing lengths, non-digits and a final coding other than `chunked`; left are a leading
/// zero, more than one coding, and several `Transfer-Encoding` fields. (hyper drops a
/// `Content-Length` that comes with `Transfer-Encoding` and takes a bare LF as a line end;
/// module `gate` runs [`check_request_head`] on the heads hyper reads for those.)
pub fn check_request_fields(headers: &HeaderMap) -> Result<(), FramingError> {
    let mut seen = Seen::default();
    for v in headers.get_all(CONTENT_LENGTH) {
        seen.content_length(v.as_bytes())?;
    }
    for v in headers.get_all(TRANSFER_ENCODING) {
        seen.transfer_encoding(v.as_bytes())?;
    }
    seen.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(raw: &[u8]) -> Result<(), FramingError> {
        let mut fields = [httparse::EMPTY_HEADER; 16];
        let mut req = httparse::Request::new(&mut fields);
        let len = match req.parse(raw) {
            Ok(httparse::Status::Complete(len)) => len,
            other => panic!("{other:?}: {raw:?}"),
        };
        check_request_head(&raw[..len], req.headers)
    }

    #[test]
    fn clean_heads_pass() {
        for raw in [
            &b"GET / HTTP/1.1\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 120\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\ntransfer-encoding:  Chunked \r\n\r\n",
        ] {
            assert_eq!(check(raw), Ok(()), "{raw:?}");
        }
    }

    #[test]
    fn ambiguous_heads_fail() {
        use FramingError::*;
        for (raw, want) in [
            (&b"GET / HTTP/1.1\nHost: a\r\n\r\n"[..], BareLf),
            (b"GET / HTTP/1.1\r\nHost: a\nX: b\r\n\r\n", BareLf),
            (b"GET / HTTP/1.1\r\nHost: a\r\n\n", BareLf),
            (b"GET / HTTP/1.1\n\n", BareLf),
            (b"POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", LengthAndChunked),
            (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 1\r\n\r\n", LengthAndChunked),
            (b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", TransferEncoding),
            (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", TransferEncoding),
            (b"POST / HTTP/1.1\r\nContent-Length: 01\r\n\r\n", ContentLength),
            (b"POST / HTTP/1.1\r\nContent-Length: +1\r\n\r\n", ContentLength),
            (b"POST / HTTP/1.1\r\nContent-Length: 1,1\r\n\r\n", ContentLength),
            (b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n", ContentLength),
        ] {
            assert_eq!(check(raw), Err(want), "{raw:?}");
        }
    }

    #[test]
    fn parsed_fields_are_checked_too() {
        let map = |fields: &[(&'static str, &'static str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in fields {
                m.append(*k, http::HeaderValue::from_static(v));
            }
            m
        };
        assert_eq!(
            check_request_fields(&map(&[("content-length", "3")])),
            Ok(())
        );
        assert_eq!(
            check_request_fields(&map(&[("transfer-encoding", "chunked")])),
            Ok(())
        );
        assert_eq!(
            check_request_fields(&map(&[("content-length", "03")])),
            Err(FramingError::ContentLength)
        );
        assert_eq!(
            check_request_fields(&map(&[("transfer-encoding", "chunked, chunked")])),
            Err(FramingError::TransferEncoding)
        );
    }
}
