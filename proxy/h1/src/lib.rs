//! Tollgate's HTTP/1.1 codec, without I/O: the one place the proxy reads and writes HTTP/1
//! on either side. In: bytes read off a connection. Out: request and answer heads as `http`
//! types (their values share the read buffer), how each body is framed, body bytes decoded,
//! and heads encoded for the wire. The proxy's connection drivers (its server for clients,
//! its exchange with upstreams) own the sockets and call only what this crate exports; the
//! fuzz targets (`fuzz/`) and the differential test (`tests/codec_diff.rs`) call the same.
//!
//! # The state machine of one connection
//!
//! ```text
//!            +--------------------------------------------------------------+
//!            v                                                              |
//!   [Head] --parse_request / parse_response--> [Body: Framing] --Decoder--> [Done]
//!     |  Partial: read more, up to the head limit     |  Length(n): n bytes   |  reusable
//!     |  Err: refuse (400 / 502), close                |  Chunked: chunks,    |  only when the
//!     v                                                |   trailers, CRLF     |  message was
//!   close                                              |  Close: to EOF       |  exactly framed
//!                                                      v                      v
//!                                                  Err: close           keep-alive? -> [Head]
//! ```
//!
//! - A head is whole when its empty line has been read; every line ends in CRLF (a bare LF
//!   is refused: [`framing`]). Field names are tokens, values visible text.
//! - A request's body is framed by `Content-Length` (one plain decimal) or
//!   `Transfer-Encoding: chunked` (alone, final, never with a length), else it has none
//!   (RFC 9112 §6.3). An answer's by the same fields, else by the connection's close; HEAD
//!   answers, 1xx, 204 and 304 have none.
//! - [`body::Decoder`] takes body bytes off the read buffer; a connection goes on to its next
//!   head only when the decoder reached [`body::Decoder::is_done`] with nothing left over.
//! - [`encode`] writes heads, chunk framing and the `date` field.

pub mod body;
pub mod encode;
pub mod field_name;
pub mod framing;
pub mod request;
pub mod response;

/// Why a head or a body was refused. The text is for logs; the caller answers 400 (a
/// client's bytes) or 502 (an upstream's) and closes the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The head's framing fields are ambiguous ([`framing`]).
    #[error(transparent)]
    Framing(#[from] framing::FramingError),
    /// More fields than the parser takes.
    #[error("too many header fields")]
    TooManyFields,
    /// Anything else that breaks HTTP/1.1, with what.
    #[error("{0}")]
    Invalid(&'static str),
}

/// Most header fields a head may carry (hyper's default too).
pub const MAX_HEADERS: usize = 100;

/// A plain decimal number of at most 19 digits (no sign, no space, no list).
pub fn parse_decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 19 {
        return None;
    }
    s.iter().try_fold(0u64, |n, &b| {
        b.is_ascii_digit().then(|| n * 10 + u64::from(b - b'0'))
    })
}

/// The comma-separated tokens of every `name` field, trimmed, empty ones left out.
pub fn header_tokens(
    headers: &http::HeaderMap,
    name: http::HeaderName,
) -> impl Iterator<Item = &str> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// True when `Connection` lists `close`.
pub fn asks_to_close(headers: &http::HeaderMap) -> bool {
    header_tokens(headers, http::header::CONNECTION).any(|t| t.eq_ignore_ascii_case("close"))
}

/// A `Connection` token that names no field of its own (`close`, `keep-alive`, `upgrade`),
/// or a hop-by-hop field removed anyway. `te` is not one: a TE field named by `Connection`
/// goes, `trailers` and all.
pub fn is_known_token(t: &[u8]) -> bool {
    // Length first: `eq_ignore_ascii_case` against every token cost ~90 instructions per
    // response carrying `Connection: keep-alive` (callgrind).
    let known: &[u8] = match t.len() {
        5 => b"close",
        7 => b"upgrade",
        10 => b"keep-alive",
        16 => b"proxy-connection",
        17 => b"transfer-encoding",
        _ => return false,
    };
    t.eq_ignore_ascii_case(known)
}

/// Where `needle` first occurs in `haystack`.
pub(crate) fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
