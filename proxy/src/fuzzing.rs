//! The fuzzing surface: thin public wrappers over the private HTTP/1 codec, so the fuzz
//! targets (`fuzz/` at the repository root) and the differential test
//! (`tests/codec_diff.rs`) drive the very code the proxy runs. In: raw bytes. Out: plain
//! public views of what the codec decided. No logic of its own; not a stable API (hidden
//! from the docs).
//!
//! The SNI reader ([`crate::sni::parse`]), CEL ([`crate::policy::cel::Expr`]) and JWT
//! verification ([`crate::policy::auth::CompiledAuth`]) are public already and are fuzzed
//! through their own API.

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, StatusCode, Version};

use crate::h1serve::{self, Parsed};
use tollgate_h1::body::{Decoder, Framing, Step};
use tollgate_h1::response::{ResponseHead as Head, body_plan, parse_response as parse_head};

/// What the server side (`h1serve`) made of the bytes a client sent.
#[derive(Debug)]
pub enum Request {
    /// Not a whole head yet.
    Partial,
    /// Left to hyper's server, with the bytes untouched.
    Hyper,
    /// Refused for its framing (module `framing`): answered 400, the connection closed.
    Refused(String),
    /// Served by `h1serve` itself; its head's bytes were taken off the buffer.
    Served {
        /// The request as the service receives it (its body is always empty).
        request: Box<http::Request<()>>,
        /// A HEAD request.
        head: bool,
        /// The client asked to close after this exchange.
        close: bool,
    },
}

/// `h1serve`'s request parser over the front of `buf`.
pub fn parse_request(buf: &mut BytesMut) -> Request {
    match h1serve::parse_request(buf) {
        Parsed::Partial => Request::Partial,
        Parsed::Hyper => Request::Hyper,
        Parsed::Reject(e) => Request::Refused(e.to_string()),
        Parsed::Serve(req, shape) => Request::Served {
            request: Box::new(req.map(|_| ())),
            head: shape.head,
            close: shape.close,
        },
    }
}

/// How an answer's body is delimited, as the upstream exchange (`h1`) decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    /// Exactly this many bytes (0 for HEAD answers, 204 and 304).
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Everything until the upstream closes the connection.
    Close,
}

/// An answer head as the upstream exchange reads it.
#[derive(Debug)]
pub struct ResponseHead {
    /// The status code.
    pub status: StatusCode,
    /// HTTP/1.0 or HTTP/1.1.
    pub version: Version,
    /// The fields the client would be sent (a lone `Connection: keep-alive`/`close` is
    /// left out).
    pub headers: HeaderMap,
    /// The body's framing and whether the connection may go back to its pool; `None` for
    /// an interim (1xx) answer, which the exchange skips (and refuses, for a 101).
    pub plan: Option<(BodyFraming, bool)>,
}

/// The upstream exchange's head parser and framing decision over the front of `buf`:
/// `Ok(None)` until the head is whole, `Err` with the reason when it is refused.
pub fn parse_response(
    buf: &mut BytesMut,
    head_request: bool,
) -> Result<Option<ResponseHead>, String> {
    let Some(head) = parse_head(buf, &mut HeaderMap::new()).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    let Head {
        status,
        version,
        headers,
        seen,
        ..
    } = head;
    let plan = if status.is_informational() {
        None
    } else {
        let (decode, keep) =
            body_plan(status, version, &headers, seen, head_request).map_err(|e| e.to_string())?;
        let framing = match decode {
            Framing::Length(n) => BodyFraming::Length(n),
            Framing::Chunked => BodyFraming::Chunked,
            Framing::Close => BodyFraming::Close,
        };
        Some((framing, keep))
    };
    Ok(Some(ResponseHead {
        status,
        version,
        headers,
        plan,
    }))
}

/// One piece of a chunked body.
#[derive(Debug)]
pub enum ChunkPiece {
    /// Body bytes.
    Data(Bytes),
    /// The trailer fields; the body has ended.
    Trailers(HeaderMap),
    /// The body has ended (no trailers).
    End,
}

/// The upstream exchange's chunked-body decoder, one step at a time.
#[derive(Debug)]
pub struct ChunkDecoder(Decoder);

impl Default for ChunkDecoder {
    fn default() -> Self {
        Self(Decoder::new(Framing::Chunked))
    }
}

impl ChunkDecoder {
    /// One step over what `buf` holds: `Ok(None)` when more bytes are needed.
    pub fn step(&mut self, buf: &mut BytesMut) -> Result<Option<ChunkPiece>, String> {
        Ok(match self.0.decode(buf).map_err(|e| e.to_string())? {
            Step::More => None,
            Step::End => Some(ChunkPiece::End),
            Step::Frame(f) => Some(match f.into_data() {
                Ok(data) => ChunkPiece::Data(data),
                Err(f) => ChunkPiece::Trailers(f.into_trailers().unwrap_or_default()),
            }),
        })
    }
}
