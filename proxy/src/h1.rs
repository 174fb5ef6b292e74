//! The HTTP/1.1 exchange of a bodiless upstream request, without hyper's client. In: a
//! request head (origin form, with Host) and a connection of the endpoint's pool. Out: the
//! response head and a [`RawBody`] that reads the body straight off the socket and gives
//! the connection back to its pool when the body has ended.
//!
//! Why: most requests a gateway forwards carry no body (GET, HEAD, DELETE). hyper's client
//! runs each connection in a task of its own: the request goes to it through a channel, the
//! answer comes back through another, and each exchange wakes both tasks. Here the request's
//! own task writes the head and parses the answer. Requests with a body (their body and the
//! answer must be driven at once), upgrades and CONNECT still go through hyper (module `pool`).
//!
//! What it reads (RFC 9112): a status line and up to [`MAX_HEADERS`] fields in at most
//! [`MAX_HEAD`] bytes; up to [`MAX_INTERIM`] 1xx interim answers are skipped; the body is
//! framed by `Transfer-Encoding: chunked` (trailers kept), `Content-Length`, or the
//! connection's close; HEAD answers and 204/304 have none. Both framing fields, lengths that
//! differ or are not numbers, a broken chunk line and a 101 are errors (502), and close the
//! connection. A connection goes back to the pool only when the answer was HTTP/1.1, did not
//! ask to close, was framed by length or chunks, and nothing followed it; bytes that come while
//! it is idle close it when it is next taken ([`Conn::is_usable`]).

use std::future::Future as _;
use std::io;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Buf as _, Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode, Version};
use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::body::BoxError;
use crate::field_name::{self, Class};
use crate::forward::{Added, header_tokens, is_known_token};
use crate::pool::EndpointPool;

/// Most header fields an answer may carry (hyper's default too).
pub(crate) const MAX_HEADERS: usize = 100;
/// Most bytes an answer's head (status line and fields) may take; hyper's default buffer.
pub(crate) const MAX_HEAD: usize = 8192 + 4096 * 100;
/// Most interim (1xx) answers before the final one: an upstream that sends them without end
/// is broken, not slow.
const MAX_INTERIM: usize = 16;
/// Longest chunk-size line (with extensions).
const MAX_CHUNK_LINE: usize = 4096;
/// Most bytes of trailer fields.
const MAX_TRAILERS: usize = 64 * 1024;
/// The end of a chunked body without trailers, after a chunk's data.
const LAST_CHUNK: &[u8] = b"\r\n0\r\n\r\n";
/// Room made in the read buffer before each read.
const READ_CHUNK: usize = 8192;

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum H1Error {
    /// Writing the request failed before its first byte went out: nothing reached the
    /// upstream, so the request may go on another connection.
    #[error("writing the request: {0}")]
    Unwritten(io::Error),
    /// The socket failed after the request went out (in part or whole).
    #[error("upstream connection: {0}")]
    Io(#[from] io::Error),
    /// The upstream closed (or reset) the connection after the request went out, before a
    /// byte of its answer came: on a reused connection, most likely its keep-alive timeout
    /// closing it as the request arrived. The request has its fields back (sent again, it is
    /// the same request).
    #[error("upstream closed the connection without answering: {0}")]
    NoAnswer(io::Error),
    /// The upstream closed the connection before its answer was complete.
    #[error("upstream closed the connection before the answer was complete")]
    Closed,
    /// The answer broke HTTP/1.1.
    #[error("invalid answer from upstream: {0}")]
    Invalid(&'static str),
    /// The answer's head went past [`MAX_HEAD`] bytes.
    #[error("answer head larger than {MAX_HEAD} bytes")]
    HeadTooLarge,
}

/// An HTTP/1.1 connection to an endpoint, idle between exchanges.
#[derive(Debug)]
pub(crate) struct Conn {
    io: TcpStream,
    /// Bytes read and not yet consumed; empty between exchanges.
    rbuf: BytesMut,
    /// The request head being written (kept to reuse its allocation).
    wbuf: Vec<u8>,
}

impl Conn {
    pub fn new(io: TcpStream) -> Self {
        Self {
            io,
            rbuf: BytesMut::new(),
            wbuf: Vec::new(),
        }
    }

    /// False when the upstream closed the connection (or sent something unasked) while it
    /// was idle. Costs no system call unless the socket became readable since the last read:
    /// `try_read` looks at tokio's cached readiness first (and, unlike `poll_read_ready`,
    /// spends none of the task's cooperative budget, which would read as "not readable").
    pub fn is_usable(&mut self) -> bool {
        if !self.rbuf.is_empty() {
            return false;
        }
        // An EOF, a reset or stray bytes make it unusable; only WouldBlock (nothing there, or
        // stale readiness from a read that did not drain the socket) leaves it usable.
        matches!(
            self.io.try_read(&mut [0u8; 1]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock
        )
    }

    /// Sends `req`'s head (its body must be empty) and reads the answer's head. A request
    /// whose first byte could not be written fails with [`H1Error::Unwritten`] and is left
    /// as it was; once written, its field map is emptied and holds the answer's fields (given
    /// back to the request when the connection ends without a byte of answer,
    /// [`H1Error::NoAnswer`]).
    pub async fn exchange(
        mut self,
        req: &mut Parts,
        added: &Added<'_>,
        pool: &Arc<EndpointPool>,
    ) -> Result<Response<RawBody>, H1Error> {
        encode_head(req, added, &mut self.wbuf);
        let mut written = 0;
        while written < self.wbuf.len() {
            match self.io.write(&self.wbuf[written..]).await {
                Ok(0) if written == 0 => {
                    return Err(H1Error::Unwritten(io::ErrorKind::WriteZero.into()));
                }
                Ok(0) => return Err(H1Error::Io(io::ErrorKind::WriteZero.into())),
                Ok(n) => written += n,
                Err(e) if written == 0 => return Err(H1Error::Unwritten(e)),
                Err(e) => return Err(H1Error::Io(e)),
            }
        }
        let head_request = req.method == Method::HEAD;
        // The request's map, sized for its fields and the forwarding ones, takes the answer's
        // fields. hyper's server hands an answer's map, emptied, to the next request it reads
        // on that connection, so a client connection's map grows once, not on every request.
        let mut fields = std::mem::take(&mut req.headers);
        // Whether a byte of answer came (an interim answer counts, and fills `fields`).
        let mut heard = false;
        let mut interim = 0;
        loop {
            if let Some(head) = parse_head(&mut self.rbuf, &mut fields)? {
                // Interim answers (100 Continue, 103 Early Hints) precede the real one. A
                // 101 cannot answer a request that asked for no upgrade.
                if head.status == StatusCode::SWITCHING_PROTOCOLS {
                    return Err(H1Error::Invalid("101 to a request without an upgrade"));
                }
                if head.status.is_informational() {
                    interim += 1;
                    if interim > MAX_INTERIM {
                        return Err(H1Error::Invalid("too many interim answers"));
                    }
                    continue;
                }
                return self.into_response(head, head_request, pool);
            }
            if self.rbuf.len() >= MAX_HEAD {
                return Err(H1Error::HeadTooLarge);
            }
            let (io, rbuf) = (&mut self.io, &mut self.rbuf);
            let read = std::future::poll_fn(|cx| poll_fill(io, rbuf, cx)).await;
            if !heard && !matches!(read, Ok(1..)) {
                // Nothing of an answer came, so the map is still the request's.
                req.headers = fields;
                let e = read
                    .err()
                    .unwrap_or_else(|| io::ErrorKind::UnexpectedEof.into());
                return Err(H1Error::NoAnswer(e));
            }
            heard = true;
            if read? == 0 {
                return Err(H1Error::Closed);
            }
        }
    }

    fn into_response(
        self,
        head: Head,
        head_request: bool,
        pool: &Arc<EndpointPool>,
    ) -> Result<Response<RawBody>, H1Error> {
        let Head {
            status,
            version,
            headers,
            seen,
            reason,
        } = head;
        let (state, keep) = body_plan(status, version, &headers, seen, head_request)?;
        // A first chunk-size line that came with the head is checked now, so a broken one is
        // a 502 rather than an answer cut off after its head.
        if matches!(state, Decode::Chunked(Chunk::Size))
            && let Some(end) = find(&self.rbuf, b"\r\n")
        {
            parse_chunk_size(&self.rbuf[..end])?;
        }
        let body = RawBody::new(self, state, keep.then(|| pool.clone()), !seen.hop);
        let mut resp = Response::new(body);
        *resp.status_mut() = status;
        *resp.version_mut() = version;
        *resp.headers_mut() = headers;
        if let Some(r) = reason {
            resp.extensions_mut().insert(r);
        }
        Ok(resp)
    }
}

/// How an answer's body is read, and whether its connection may be reused after it, from
/// its head and whether it answers a HEAD. Apart from [`Conn::into_response`] so the fuzz targets and the
/// differential test (`crate::fuzzing`) judge the very same decision.
pub(crate) fn body_plan(
    status: StatusCode,
    version: Version,
    headers: &HeaderMap,
    seen: Seen,
    head_request: bool,
) -> Result<(Decode, bool), H1Error> {
    if seen.transfer_encoding {
        // RFC 9112 §6.1: a 1.0 message cannot be chunked; its framing is faulty.
        if version == Version::HTTP_10 {
            return Err(H1Error::Invalid("transfer-encoding in an HTTP/1.0 answer"));
        }
        // §6.3: both framings "ought to be handled as an error": two readers could frame
        // the body two ways, and what follows it could be taken for the next answer.
        if seen.content_length {
            return Err(H1Error::Invalid("content-length with transfer-encoding"));
        }
    }
    let mut keep =
        version == Version::HTTP_11 && !seen.close && !(seen.connection && asks_to_close(headers));
    let state =
        if head_request || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
            Decode::Length(0)
        } else {
            match framing(headers, seen)? {
                Framing::Chunked { with_length } => {
                    // (Both framings were refused above; kept as a second guard.)
                    keep &= !with_length;
                    Decode::Chunked(Chunk::Size)
                }
                Framing::Length(n) => Decode::Length(n),
                Framing::Close => {
                    keep = false;
                    Decode::Close
                }
            }
        };
    Ok((state, keep))
}

/// Writes the request line and fields, the request's own then `added`. A POST, PUT or PATCH
/// without a length gets `content-length: 0` (RFC 9110 §8.6: a client should send it;
/// hyper's client did not).
fn encode_head(req: &Parts, added: &Added<'_>, out: &mut Vec<u8>) {
    out.clear();
    let path = req.uri.path_and_query().map_or("/", |p| p.as_str());
    out.extend_from_slice(req.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in req.headers.iter().chain(added.fields()) {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let m = &req.method;
    if (m == Method::POST || m == Method::PUT || m == Method::PATCH)
        && !req.headers.contains_key(CONTENT_LENGTH)
    {
        out.extend_from_slice(b"content-length: 0\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Reads what the socket has into `buf` (after making room); 0 at EOF. The read future keeps
/// no state between polls, so a new one each time loses nothing.
fn poll_fill(
    io: &mut TcpStream,
    buf: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Poll<io::Result<usize>> {
    buf.reserve(READ_CHUNK);
    pin!(io.read_buf(buf)).poll(cx)
}

/// A parsed answer head.
pub(crate) struct Head {
    pub(crate) status: StatusCode,
    pub(crate) version: Version,
    pub(crate) headers: HeaderMap,
    pub(crate) seen: Seen,
    /// The status line's phrase, when it is not the standard one.
    pub(crate) reason: Option<hyper::ext::ReasonPhrase>,
}

/// Which of the fields that frame the body the head has (noted while parsing, so a head
/// without them is not searched for them).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Seen {
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
    hop: bool,
}

/// Byte ranges of a field's name and value.
type Span = (std::ops::Range<usize>, std::ops::Range<usize>);

/// Parses an answer head off the front of `buf`; `None` until it is complete. The fields go
/// into `map` (emptied first), which the head then takes.
pub(crate) fn parse_head(buf: &mut BytesMut, map: &mut HeaderMap) -> Result<Option<Head>, H1Error> {
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
            Err(httparse::Error::TooManyHeaders) => {
                return Err(H1Error::Invalid("too many header fields"));
            }
            Err(_) => return Err(H1Error::Invalid("malformed head")),
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
    let status = StatusCode::from_u16(code).map_err(|_| H1Error::Invalid("status code"))?;
    let version = if minor == 0 {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    // A phrase of its own ("200 Fine") goes on to the client, as hyper passes it.
    let reason = reason
        .map(|r| head.slice(r))
        .filter(|r| Some(&r[..]) != status.canonical_reason().map(str::as_bytes))
        .and_then(|r| hyper::ext::ReasonPhrase::try_from(r).ok());
    let mut headers = std::mem::take(map);
    headers.clear();
    headers.reserve(spans.len());
    let mut seen = Seen::default();
    for (name, value) in spans {
        let (name, class) =
            field_name::parse(&head[name]).map_err(|_| H1Error::Invalid("header field name"))?;
        if name == CONNECTION && is_known_token(&head[value.clone()]) {
            // The usual `Connection: keep-alive` (or `close`) is hop-by-hop and names no
            // other field: read here and left out, where the service would remove it
            // (hashed lookups, ~300 instructions per answer).
            seen.close |= head[value].eq_ignore_ascii_case(b"close");
            continue;
        }
        let value = HeaderValue::from_maybe_shared(head.slice(value))
            .map_err(|_| H1Error::Invalid("header field value"))?;
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
    Ok(Some(Head {
        status,
        version,
        headers,
        seen,
        reason,
    }))
}

/// True when `Connection` lists `close`.
pub(crate) fn asks_to_close(headers: &HeaderMap) -> bool {
    header_tokens(headers, CONNECTION).any(|t| t.eq_ignore_ascii_case("close"))
}

/// How an answer's body is delimited.
#[derive(Debug, PartialEq)]
enum Framing {
    Chunked { with_length: bool },
    Length(u64),
    Close,
}

/// The body's framing from the fields (RFC 9112 §6.3).
fn framing(headers: &HeaderMap, seen: Seen) -> Result<Framing, H1Error> {
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
            Some(t) if t.eq_ignore_ascii_case(b"chunked") => Framing::Chunked {
                with_length: has_length,
            },
            _ => Framing::Close,
        });
    }
    if !has_length {
        return Ok(Framing::Close);
    }
    if let Some(n) = seen.length {
        return Ok(Framing::Length(n));
    }
    // Repeated values (one field or several) must agree.
    let mut length = None;
    for v in headers.get_all(CONTENT_LENGTH) {
        for part in v.as_bytes().split(|&b| b == b',') {
            let n = parse_decimal(part.trim_ascii()).ok_or(H1Error::Invalid("content-length"))?;
            if length.is_some_and(|l| l != n) {
                return Err(H1Error::Invalid("content-length values differ"));
            }
            length = Some(n);
        }
    }
    length
        .map(Framing::Length)
        .ok_or(H1Error::Invalid("content-length"))
}

pub(crate) fn parse_decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 19 {
        return None;
    }
    s.iter().try_fold(0u64, |n, &b| {
        b.is_ascii_digit().then(|| n * 10 + u64::from(b - b'0'))
    })
}

/// Where the body's reading stands.
#[derive(Debug)]
pub(crate) enum Decode {
    /// This many bytes to go.
    Length(u64),
    Chunked(Chunk),
    /// Everything until the upstream closes.
    Close,
    /// Read to the end.
    Done,
}

#[derive(Debug)]
pub(crate) enum Chunk {
    /// Expecting a chunk-size line.
    Size,
    /// This many bytes of the chunk to go.
    Data(u64),
    /// Expecting the CRLF after a chunk's data.
    DataEnd,
    /// Past the last chunk: trailer fields, then an empty line.
    Trailers,
}

/// An answer's body, read off the connection; gives the connection back to its pool when it
/// has been read to the end (a body dropped early closes the connection).
#[derive(Debug)]
pub(crate) struct RawBody {
    conn: Option<Conn>,
    state: Decode,
    /// The pool to go back to; `None` when the connection may not be reused.
    back: Option<Arc<EndpointPool>>,
    /// The answer's head, as read, holds no hop-by-hop field (see [`RawBody::clean_head`]).
    clean_head: bool,
}

impl RawBody {
    /// The answer's head held no hop-by-hop field once its `Connection: keep-alive` (or
    /// `close`) was left out: nothing for the service to strip. (A field of another name
    /// that a `Connection` list names would have kept that `Connection` in the map.)
    pub(crate) fn clean_head(&self) -> bool {
        self.clean_head
    }

    fn new(conn: Conn, state: Decode, back: Option<Arc<EndpointPool>>, clean_head: bool) -> Self {
        let mut this = Self {
            conn: Some(conn),
            state,
            back,
            clean_head,
        };
        if matches!(this.state, Decode::Length(0)) {
            this.finish();
        }
        this
    }

    /// The body has ended: the connection goes back, if it may.
    fn finish(&mut self) {
        self.state = Decode::Done;
        if let (Some(conn), Some(pool)) = (self.conn.take(), self.back.take())
            && conn.rbuf.is_empty()
        {
            pool.push_raw(conn);
        }
    }

    fn fail(&mut self, e: H1Error) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.state = Decode::Done;
        self.conn = None;
        self.back = None;
        Poll::Ready(Some(Err(Box::new(e))))
    }
}

/// What one step of decoding gave.
pub(crate) enum Step {
    Frame(Frame<Bytes>),
    /// The body ended.
    End,
    /// The buffer holds too little: read more.
    More,
}

impl Body for RawBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            let step = match &mut this.state {
                Decode::Done | Decode::Length(0) => Ok(Step::End),
                Decode::Length(rest) => Ok(take_data(&mut conn.rbuf, rest)),
                Decode::Close => Ok(if conn.rbuf.is_empty() {
                    Step::More
                } else {
                    Step::Frame(Frame::data(conn.rbuf.split().freeze()))
                }),
                Decode::Chunked(chunk) => decode_chunk(&mut conn.rbuf, chunk),
            };
            match step {
                Err(e) => return this.fail(e),
                Ok(Step::Frame(f)) => {
                    let ended = match &this.state {
                        Decode::Length(0) | Decode::Chunked(Chunk::Trailers) => true,
                        // The last chunk often arrives with the body's end: take it now, so
                        // the end is known (and the connection back) without another poll.
                        Decode::Chunked(Chunk::DataEnd) if conn.rbuf[..] == *LAST_CHUNK => {
                            conn.rbuf.clear();
                            true
                        }
                        _ => false,
                    };
                    if ended {
                        this.finish();
                    }
                    return Poll::Ready(Some(Ok(f)));
                }
                Ok(Step::End) => {
                    this.finish();
                    return Poll::Ready(None);
                }
                Ok(Step::More) => match ready!(poll_fill(&mut conn.io, &mut conn.rbuf, cx)) {
                    Ok(0) if matches!(this.state, Decode::Close) => {
                        this.state = Decode::Done;
                        this.conn = None;
                        return Poll::Ready(None);
                    }
                    Ok(0) => return this.fail(H1Error::Closed),
                    Ok(_) => {}
                    Err(e) => return this.fail(H1Error::Io(e)),
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.state, Decode::Done)
    }

    fn size_hint(&self) -> SizeHint {
        match self.state {
            Decode::Length(n) => SizeHint::with_exact(n),
            Decode::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

/// Up to `rest` bytes of body from `buf`.
fn take_data(buf: &mut BytesMut, rest: &mut u64) -> Step {
    if buf.is_empty() {
        return Step::More;
    }
    let n = usize::try_from(*rest).map_or(buf.len(), |r| r.min(buf.len()));
    *rest -= n as u64;
    Step::Frame(Frame::data(buf.split_to(n).freeze()))
}

/// One step of chunked decoding over what `buf` holds.
pub(crate) fn decode_chunk(buf: &mut BytesMut, chunk: &mut Chunk) -> Result<Step, H1Error> {
    loop {
        match chunk {
            Chunk::Size => {
                let Some(line) = take_line(buf, MAX_CHUNK_LINE)? else {
                    return Ok(Step::More);
                };
                let size = parse_chunk_size(&line)?;
                *chunk = if size == 0 {
                    Chunk::Trailers
                } else {
                    Chunk::Data(size)
                };
            }
            Chunk::Data(rest) => {
                let step = take_data(buf, rest);
                if *rest == 0 {
                    *chunk = Chunk::DataEnd;
                }
                return Ok(step);
            }
            Chunk::DataEnd => {
                if buf.len() < 2 {
                    return Ok(Step::More);
                }
                if &buf[..2] != b"\r\n" {
                    return Err(H1Error::Invalid("chunk not followed by CRLF"));
                }
                buf.advance(2);
                *chunk = Chunk::Size;
            }
            Chunk::Trailers => {
                if buf.starts_with(b"\r\n") {
                    buf.advance(2);
                    return Ok(Step::End);
                }
                let Some(end) = find(buf, b"\r\n\r\n") else {
                    if buf.len() > MAX_TRAILERS {
                        return Err(H1Error::Invalid("trailers too large"));
                    }
                    return Ok(Step::More);
                };
                let section = buf.split_to(end + 4).freeze();
                let trailers = parse_trailers(&section)?;
                return Ok(Step::Frame(Frame::trailers(trailers)));
            }
        }
    }
}

/// Takes one CRLF-ended line off `buf` (without the CRLF); `None` until it is complete.
fn take_line(buf: &mut BytesMut, max: usize) -> Result<Option<BytesMut>, H1Error> {
    match find(buf, b"\r\n") {
        Some(i) => {
            let line = buf.split_to(i);
            buf.advance(2);
            Ok(Some(line))
        }
        None if buf.len() > max => Err(H1Error::Invalid("chunk-size line too long")),
        None => Ok(None),
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A chunk-size line: hex digits, then optional spaces or tabs before extensions (`;...`),
/// which may hold no control byte.
fn parse_chunk_size(line: &[u8]) -> Result<u64, H1Error> {
    let digits = line
        .iter()
        .position(|b| !b.is_ascii_hexdigit())
        .unwrap_or(line.len());
    let rest = &line[digits..];
    let rest = &rest[rest
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t'))
        .unwrap_or(rest.len())..];
    // Extensions hold no control byte (a bare CR or LF there is read as a line end by
    // some, RFC 9112 §7.1.1); a tab is whitespace.
    if digits == 0
        || digits > 16
        || !(rest.is_empty() || rest[0] == b';')
        || rest.iter().any(|&b| (b < b' ' && b != b'\t') || b == 0x7f)
    {
        return Err(H1Error::Invalid("chunk size"));
    }
    line[..digits].iter().try_fold(0u64, |n, &b| {
        let d = (b as char)
            .to_digit(16)
            .ok_or(H1Error::Invalid("chunk size"))?;
        Ok((n << 4) | u64::from(d))
    })
}

/// Trailer fields (ending with the empty line).
fn parse_trailers(section: &Bytes) -> Result<HeaderMap, H1Error> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    match httparse::parse_headers(section, &mut fields) {
        Ok(httparse::Status::Complete((_, parsed))) => {
            let mut map = HeaderMap::with_capacity(parsed.len());
            for f in parsed {
                let name = HeaderName::from_bytes(f.name.as_bytes())
                    .map_err(|_| H1Error::Invalid("trailer field name"))?;
                let value = HeaderValue::from_maybe_shared(section.slice_ref(f.value))
                    .map_err(|_| H1Error::Invalid("trailer field value"))?;
                map.append(name, value);
            }
            Ok(map)
        }
        _ => Err(H1Error::Invalid("malformed trailers")),
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::Mutex;
    use std::time::Duration;

    use http::Request;
    use http_body_util::BodyExt as _;
    use tokio::io::AsyncWriteExt as _;
    use tokio::net::TcpListener;

    use super::*;
    use crate::body::{ProxyBody, empty};
    use crate::pool::{PooledBody, Pools, UpstreamError};

    /// One answer, written in pieces (each its own write, a few ms apart, so the proxy reads
    /// them separately), and whether the backend closes the connection after it.
    struct Answer {
        pieces: Vec<&'static [u8]>,
        close: bool,
    }

    fn answer(pieces: &[&'static [u8]]) -> Answer {
        Answer {
            pieces: pieces.to_vec(),
            close: false,
        }
    }

    /// A backend that answers each request head it reads with the next answer of `script`,
    /// on whichever connection it came; records the request heads and counts connections.
    struct Backend {
        addr: SocketAddr,
        heads: Arc<Mutex<Vec<String>>>,
        conns: Arc<std::sync::atomic::AtomicUsize>,
    }

    async fn backend(script: Vec<Answer>) -> Backend {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let conns = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let script = Arc::new(Mutex::new(script.into_iter()));
        let (h, c) = (heads.clone(), conns.clone());
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let (h, script) = (h.clone(), script.clone());
                tokio::spawn(async move {
                    let mut got = BytesMut::new();
                    loop {
                        while find(&got, b"\r\n\r\n").is_none() {
                            match s.read_buf(&mut got).await {
                                Ok(0) | Err(_) => return,
                                Ok(_) => {}
                            }
                        }
                        let end = find(&got, b"\r\n\r\n").unwrap() + 4;
                        let head = got.split_to(end);
                        h.lock()
                            .unwrap()
                            .push(String::from_utf8_lossy(&head).into_owned());
                        let Some(a) = script.lock().unwrap().next() else {
                            return;
                        };
                        for p in a.pieces {
                            if s.write_all(p).await.is_err() {
                                return;
                            }
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        if a.close {
                            return;
                        }
                    }
                });
            }
        });
        Backend { addr, heads, conns }
    }

    fn request(method: Method) -> Request<ProxyBody> {
        Request::builder()
            .method(method)
            .uri("/p?q=1")
            .header("host", "example.test")
            .header("x-a", "1")
            .body(empty())
            .unwrap()
    }

    /// The whole answer: status, body, trailers; or the error that ended it.
    async fn exchange(
        pool: &Arc<EndpointPool>,
        method: Method,
    ) -> Result<(StatusCode, Bytes, Option<HeaderMap>), String> {
        let resp = pool
            .send(request(method), &Added::default())
            .await
            .map_err(|e: UpstreamError| format!("send: {e}"))?;
        let status = resp.status();
        let body: PooledBody = resp.into_body();
        let collected = body.collect().await.map_err(|e| format!("body: {e}"))?;
        let trailers = collected.trailers().cloned();
        Ok((status, collected.to_bytes(), trailers))
    }

    #[tokio::test]
    async fn answers_are_framed_and_connections_reused_only_when_clean() {
        struct Case {
            name: &'static str,
            method: Method,
            answer: Answer,
            status: u16,
            body: &'static [u8],
            trailer: Option<(&'static str, &'static str)>,
            reused: bool,
        }
        let case = |name, pieces: &[&'static [u8]], status, body, reused| Case {
            name,
            method: Method::GET,
            answer: answer(pieces),
            status,
            body,
            trailer: None,
            reused,
        };
        let cases = vec![
            case(
                "content-length, body in two reads",
                &[b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n01234", b"56789"],
                200,
                b"0123456789",
                true,
            ),
            case(
                "head split inside a field",
                &[b"HTTP/1.1 201 Created\r\nconte", b"nt-length: 2\r\n\r\nok"],
                201,
                b"ok",
                true,
            ),
            Case {
                trailer: Some(("grpc-status", "0")),
                ..case(
                    "chunked with an extension and trailers, split mid-chunk",
                    &[
                        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;ext=1\r\nhel",
                        b"lo\r\n6\r\n world\r\n0\r\ngrpc-status: 0\r\n\r\n",
                    ],
                    200,
                    b"hello world",
                    true,
                )
            },
            case(
                "chunked, the last chunk in its own read",
                &[
                    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n",
                    b"0\r\n",
                    b"\r\n",
                ],
                200,
                b"abc",
                true,
            ),
            case(
                "interim 100 and 103 are skipped",
                &[b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n", b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nx"],
                200,
                b"x",
                true,
            ),
            case(
                "204 has no body",
                &[b"HTTP/1.1 204 No Content\r\n\r\n"],
                204,
                b"",
                true,
            ),
            case(
                "304 has no body, whatever its length says",
                &[b"HTTP/1.1 304 Not Modified\r\ncontent-length: 5\r\n\r\n"],
                304,
                b"",
                true,
            ),
            Case {
                method: Method::HEAD,
                ..case(
                    "HEAD: the length describes a body that is not sent",
                    &[b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"],
                    200,
                    b"",
                    true,
                )
            },
            case(
                "connection: close",
                &[b"HTTP/1.1 200 OK\r\nconnection: keep-alive, close\r\ncontent-length: 2\r\n\r\nok"],
                200,
                b"ok",
                false,
            ),
            case(
                "HTTP/1.0",
                &[b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok"],
                200,
                b"ok",
                false,
            ),
            case(
                "repeated equal lengths",
                &[b"HTTP/1.1 200 OK\r\ncontent-length: 2, 2\r\ncontent-length: 2\r\n\r\nok"],
                200,
                b"ok",
                true,
            ),
            case(
                "bytes after the answer: not reused",
                &[b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokEXTRA"],
                200,
                b"ok",
                false,
            ),
        ];
        for c in cases {
            let be = backend(vec![c.answer]).await;
            let pool = Pools::default().pool_for(be.addr);
            let (status, body, trailers) = exchange(&pool, c.method)
                .await
                .unwrap_or_else(|e| panic!("{}: {e}", c.name));
            assert_eq!(status, c.status, "{}", c.name);
            assert_eq!(&body[..], c.body, "{}", c.name);
            let trailer = trailers.as_ref().and_then(|t| {
                let (k, v) = t.iter().next()?;
                Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned()))
            });
            assert_eq!(
                trailer,
                c.trailer.map(|(k, v)| (k.to_owned(), v.to_owned())),
                "{}",
                c.name
            );
            assert_eq!(pool.idle_len(), usize::from(c.reused), "{}", c.name);
        }
    }

    /// An answer whose head, once `Connection: keep-alive` is left out, has no hop-by-hop
    /// field says so, and the service skips its search for them; any hop-by-hop field (or a
    /// `Connection` list) leaves the search to the service.
    #[tokio::test]
    async fn answers_say_whether_their_head_needs_hop_by_hop_stripping() {
        let cases: [(&[u8], bool); 8] = [
            (
                b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\ncontent-length: 2\r\n\r\nok",
                true,
            ),
            (
                b"HTTP/1.1 200 OK\r\nServer: s\r\nX-Other: 1\r\ncontent-length: 2\r\n\r\nok",
                true,
            ),
            (
                b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5\r\ncontent-length: 2\r\n\r\nok",
                false,
            ),
            (
                b"HTTP/1.1 200 OK\r\nconnection: x-hop\r\nx-hop: 1\r\ncontent-length: 2\r\n\r\nok",
                false,
            ),
            (
                b"HTTP/1.1 200 OK\r\nUpgrade: h2c\r\ncontent-length: 2\r\n\r\nok",
                false,
            ),
            (
                b"HTTP/1.1 200 OK\r\nProxy-Connection: keep-alive\r\ncontent-length: 2\r\n\r\nok",
                false,
            ),
            (
                b"HTTP/1.1 200 OK\r\nTE: trailers\r\ncontent-length: 2\r\n\r\nok",
                false,
            ),
            (
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
                false,
            ),
        ];
        let be = backend(cases.iter().map(|(a, _)| answer(&[a])).collect()).await;
        let pool = Pools::default().pool_for(be.addr);
        for (i, (text, clean)) in cases.iter().enumerate() {
            let resp = pool
                .send(request(Method::GET), &Added::default())
                .await
                .unwrap();
            let head = String::from_utf8_lossy(text);
            assert_eq!(resp.body().clean_head(), *clean, "answer {i}: {head:?}");
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(&body[..], b"ok", "answer {i}");
        }
    }

    #[tokio::test]
    async fn a_phrase_of_its_own_is_kept_and_a_standard_one_left_to_the_code() {
        let be = backend(vec![
            answer(&[b"HTTP/1.1 200 Fine\r\ncontent-length: 2\r\n\r\nok"]),
            answer(&[b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"]),
        ])
        .await;
        let pool = Pools::default().pool_for(be.addr);
        let resp = pool
            .send(request(Method::GET), &Added::default())
            .await
            .unwrap();
        let phrase = resp.extensions().get::<hyper::ext::ReasonPhrase>();
        assert_eq!(
            phrase.map(|p| p.as_bytes().to_vec()),
            Some(b"Fine".to_vec())
        );
        resp.into_body().collect().await.unwrap();
        // A standard phrase is left to the status code. (A length beside the chunks, once
        // dropped here, is now refused: `broken_answers_are_errors`.)
        let resp = pool
            .send(request(Method::GET), &Added::default())
            .await
            .unwrap();
        assert!(
            resp.extensions()
                .get::<hyper::ext::ReasonPhrase>()
                .is_none()
        );
        assert!(!resp.headers().contains_key(CONTENT_LENGTH));
        assert_eq!(
            &resp.into_body().collect().await.unwrap().to_bytes()[..],
            b"hi"
        );
    }

    #[tokio::test]
    async fn the_answer_fills_the_request_map_and_leaves_out_a_lone_connection_token() {
        let be = backend(vec![
            answer(&[b"HTTP/1.1 200 OK\r\nServer: be\r\nConnection: Keep-Alive\r\ncontent-length: 2\r\n\r\nok"]),
            answer(&[b"HTTP/1.1 200 OK\r\nconnection: x-hop\r\nx-hop: 1\r\ncontent-length: 2\r\n\r\nok"]),
            answer(&[b"HTTP/1.1 200 OK\r\nConnection: CLOSE\r\ncontent-length: 2\r\n\r\nok"]),
        ])
        .await;
        let pool = Pools::default().pool_for(be.addr);
        let fields = |resp: &Response<PooledBody>| -> Vec<(String, String)> {
            resp.headers()
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
                .collect()
        };
        let owned = |f: &[(&str, &str)]| -> Vec<(String, String)> {
            f.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };

        // The request's map, with room to spare, takes the answer's fields and nothing of
        // the request's; `Connection: Keep-Alive` is read, not passed on.
        let mut req = request(Method::GET);
        req.headers_mut().reserve(20);
        let room = req.headers().capacity();
        let resp = pool.send(req, &Added::default()).await.unwrap();
        assert_eq!(
            fields(&resp),
            owned(&[("server", "be"), ("content-length", "2")])
        );
        assert!(resp.headers().capacity() >= room);
        resp.into_body().collect().await.unwrap();
        assert_eq!(pool.idle_len(), 1);

        // A token that names a field stays, for the service to remove both.
        let resp = pool
            .send(request(Method::GET), &Added::default())
            .await
            .unwrap();
        assert_eq!(
            fields(&resp),
            owned(&[
                ("connection", "x-hop"),
                ("x-hop", "1"),
                ("content-length", "2")
            ])
        );
        resp.into_body().collect().await.unwrap();
        assert_eq!(pool.idle_len(), 1);

        // A lone `close`, in any case, is left out too, and still ends the connection.
        let resp = pool
            .send(request(Method::GET), &Added::default())
            .await
            .unwrap();
        assert_eq!(fields(&resp), owned(&[("content-length", "2")]));
        resp.into_body().collect().await.unwrap();
        assert_eq!(pool.idle_len(), 0);
        assert_eq!(be.conns.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_connect_tunnel_never_goes_back_to_a_pool() {
        // A 2xx to CONNECT makes the connection a tunnel whatever its length says (RFC 9112
        // §6.3); module `pool` leaves CONNECT to hyper, which treats it as an upgrade.
        let be = backend(vec![answer(&[
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
        ])])
        .await;
        let pool = Pools::default().pool_for(be.addr);
        let req = Request::builder()
            .method(Method::CONNECT)
            .uri("example.test:443")
            .header("host", "example.test:443")
            .body(empty())
            .unwrap();
        let resp = pool.send(req, &Added::default()).await.unwrap();
        assert_eq!(resp.status(), 200);
        drop(resp);
        assert_eq!(pool.idle_len(), 0);
    }

    #[tokio::test]
    async fn a_body_until_close_ends_at_the_close() {
        let be = backend(vec![Answer {
            pieces: vec![b"HTTP/1.1 200 OK\r\n\r\nuntil ", b"close"],
            close: true,
        }])
        .await;
        let pool = Pools::default().pool_for(be.addr);
        let (status, body, _) = exchange(&pool, Method::GET).await.unwrap();
        assert_eq!((status.as_u16(), &body[..]), (200, &b"until close"[..]));
        assert_eq!(pool.idle_len(), 0);
    }

    #[tokio::test]
    async fn broken_answers_are_errors() {
        let cases: Vec<(&str, Answer, &str)> = vec![
            (
                "chunked HTTP/1.0",
                answer(&[b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n"]),
                "send: invalid answer from upstream: transfer-encoding in an HTTP/1.0 answer",
            ),
            (
                "malformed status line",
                answer(&[b"HTTP/1.1 OK\r\n\r\n"]),
                "send: invalid answer from upstream: malformed head",
            ),
            (
                "101 without an upgrade",
                answer(&[b"HTTP/1.1 101 Switching Protocols\r\n\r\n"]),
                "send: invalid answer from upstream: 101 to a request without an upgrade",
            ),
            (
                "chunked and content-length",
                answer(&[b"HTTP/1.1 200 OK\r\ncontent-length: 99\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"]),
                "send: invalid answer from upstream: content-length with transfer-encoding",
            ),
            (
                "first chunk size not hex, with the head",
                answer(&[b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"]),
                "send: invalid answer from upstream: chunk size",
            ),
            (
                "interim answers without end",
                answer(&[b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\n"]),
                "send: invalid answer from upstream: too many interim answers",
            ),
            (
                "lengths differ",
                answer(&[b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nok"]),
                "send: invalid answer from upstream: content-length values differ",
            ),
            (
                "length not a number",
                answer(&[b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n"]),
                "send: invalid answer from upstream: content-length",
            ),
            (
                "chunk size not hex",
                answer(&[
                    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
                    b"zz\r\n",
                ]),
                "body: invalid answer from upstream: chunk size",
            ),
            (
                "chunk without its CRLF",
                answer(&[
                    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhiXX0\r\n\r\n",
                ]),
                "body: invalid answer from upstream: chunk not followed by CRLF",
            ),
            (
                "closed before the head",
                Answer {
                    pieces: vec![b"HTTP/1.1 200"],
                    close: true,
                },
                "send: upstream closed the connection before the answer was complete",
            ),
            (
                "closed mid-body",
                Answer {
                    pieces: vec![b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc"],
                    close: true,
                },
                "body: upstream closed the connection before the answer was complete",
            ),
            (
                "closed mid-chunk",
                Answer {
                    pieces: vec![b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\na\r\nabc"],
                    close: true,
                },
                "body: upstream closed the connection before the answer was complete",
            ),
        ];
        for (name, a, want) in cases {
            let be = backend(vec![a]).await;
            let pool = Pools::default().pool_for(be.addr);
            let got = exchange(&pool, Method::GET).await.expect_err(name);
            assert_eq!(got, want, "{name}");
            assert_eq!(pool.idle_len(), 0, "{name}");
        }
    }

    #[tokio::test]
    async fn a_head_over_the_limit_is_an_error() {
        let big: &'static [u8] = Box::leak(
            [
                &b"HTTP/1.1 200 OK\r\nx-big: "[..],
                &vec![b'a'; MAX_HEAD][..],
            ]
            .concat()
            .into_boxed_slice(),
        );
        let be = backend(vec![answer(&[big])]).await;
        let pool = Pools::default().pool_for(be.addr);
        let got = exchange(&pool, Method::GET).await.unwrap_err();
        assert_eq!(
            got,
            format!("send: answer head larger than {MAX_HEAD} bytes")
        );
    }

    #[tokio::test]
    async fn the_request_head_is_the_request_line_and_fields() {
        let ok: &'static [u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        let be = backend(vec![answer(&[ok]), answer(&[ok]), answer(&[ok])]).await;
        let pool = Pools::default().pool_for(be.addr);
        for m in [Method::GET, Method::POST, Method::DELETE] {
            exchange(&pool, m).await.unwrap();
        }
        assert_eq!(
            *be.heads.lock().unwrap(),
            [
                "GET /p?q=1 HTTP/1.1\r\nhost: example.test\r\nx-a: 1\r\n\r\n",
                "POST /p?q=1 HTTP/1.1\r\nhost: example.test\r\nx-a: 1\r\ncontent-length: 0\r\n\r\n",
                "DELETE /p?q=1 HTTP/1.1\r\nhost: example.test\r\nx-a: 1\r\n\r\n",
            ]
        );
        // All three on one connection.
        assert_eq!(be.conns.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_connection_the_upstream_closed_while_idle_is_not_used() {
        let ok: &'static [u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        let be = backend(vec![
            Answer {
                pieces: vec![ok],
                close: true,
            },
            answer(&[ok]),
        ])
        .await;
        let pool = Pools::default().pool_for(be.addr);
        exchange(&pool, Method::GET).await.unwrap();
        // The answer was complete, so the connection went back before the close came.
        assert_eq!(pool.idle_len(), 1);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (status, body, _) = exchange(&pool, Method::GET).await.unwrap();
        assert_eq!((status.as_u16(), &body[..]), (200, &b"ok"[..]));
        assert_eq!(be.conns.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    /// The backend closes a reused connection on reading the next request, without a byte of
    /// answer (its keep-alive timeout racing the request): an idempotent request goes once
    /// more, the same, on a fresh connection; a POST or PATCH does not. A fresh connection
    /// closed so is not tried again.
    #[tokio::test]
    async fn an_idempotent_request_a_reused_connection_dropped_is_sent_again_on_a_fresh_one() {
        let ok: &'static [u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        let dropped = || Answer {
            pieces: Vec::new(),
            close: true,
        };
        let conns = |be: &Backend| be.conns.load(std::sync::atomic::Ordering::SeqCst);
        for (m, again) in [
            (Method::GET, true),
            (Method::PUT, true),
            (Method::DELETE, true),
            (Method::POST, false),
            (Method::PATCH, false),
        ] {
            let be = backend(vec![answer(&[ok]), dropped(), answer(&[ok])]).await;
            let pool = Pools::default().pool_for(be.addr);
            exchange(&pool, Method::GET).await.unwrap();
            assert_eq!(pool.idle_len(), 1, "{m}");
            let got = exchange(&pool, m.clone()).await;
            let heads = be.heads.lock().unwrap().clone();
            if again {
                let (status, body, _) = got.unwrap_or_else(|e| panic!("{m}: {e}"));
                assert_eq!((status.as_u16(), &body[..]), (200, &b"ok"[..]), "{m}");
                assert_eq!(conns(&be), 2, "{m}");
                assert_eq!(heads.len(), 3, "{m}");
                assert_eq!(heads[1], heads[2], "{m}: sent again, the same");
                assert!(heads[2].contains("\r\nx-a: 1\r\n"), "{m}: {}", heads[2]);
            } else {
                let e = got.expect_err(m.as_str());
                assert!(
                    e.starts_with("send: upstream closed the connection without answering"),
                    "{m}: {e}"
                );
                assert_eq!(conns(&be), 1, "{m}");
                assert_eq!(heads.len(), 2, "{m}");
            }
        }
        let be = backend(vec![dropped(), answer(&[ok])]).await;
        let pool = Pools::default().pool_for(be.addr);
        let e = exchange(&pool, Method::GET).await.unwrap_err();
        assert!(
            e.starts_with("send: upstream closed the connection without answering"),
            "{e}"
        );
        assert_eq!((conns(&be), be.heads.lock().unwrap().len()), (1, 1));
        // An interim answer is a byte of answer: closed after it, the request is not sent
        // again (its field map by then holds the interim answer's fields).
        let be = backend(vec![
            answer(&[ok]),
            Answer {
                pieces: vec![b"HTTP/1.1 100 Continue\r\n\r\n"],
                close: true,
            },
            answer(&[ok]),
        ])
        .await;
        let pool = Pools::default().pool_for(be.addr);
        exchange(&pool, Method::GET).await.unwrap();
        let e = exchange(&pool, Method::GET).await.unwrap_err();
        assert_eq!(
            e,
            "send: upstream closed the connection before the answer was complete"
        );
        assert_eq!((conns(&be), be.heads.lock().unwrap().len()), (1, 2));
    }

    #[tokio::test]
    async fn a_chunked_body_ends_with_its_last_data_when_the_last_chunk_came_along() {
        let be = backend(vec![answer(&[
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        ])])
        .await;
        let pool = Pools::default().pool_for(be.addr);
        let mut body = pool
            .send(request(Method::GET), &Added::default())
            .await
            .unwrap()
            .into_body();
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "abc");
        // Known without another poll: the connection is back already.
        assert!(body.is_end_stream());
        assert_eq!(pool.idle_len(), 1);
    }

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
        assert_eq!(f(&[]), Ok(Framing::Close));
        assert_eq!(f(&[("content-length", "0")]), Ok(Framing::Length(0)));
        assert_eq!(
            f(&[("transfer-encoding", "gzip, chunked")]),
            Ok(Framing::Chunked { with_length: false })
        );
        assert_eq!(
            f(&[
                ("transfer-encoding", "chunked"),
                ("transfer-encoding", "gzip")
            ]),
            Ok(Framing::Close)
        );
        assert_eq!(
            f(&[("content-length", "9999999999999999999")]),
            Ok(Framing::Length(9_999_999_999_999_999_999))
        );
        assert!(f(&[("content-length", "99999999999999999999")]).is_err());
        assert!(f(&[("content-length", "")]).is_err());
        assert!(f(&[("content-length", "1 2")]).is_err());
    }

    #[test]
    fn chunk_sizes_parse_or_fail() {
        assert_eq!(parse_chunk_size(b"1a").ok(), Some(26));
        assert_eq!(parse_chunk_size(b"FF;name=value").ok(), Some(255));
        assert_eq!(parse_chunk_size(b"0 ").ok(), Some(0));
        assert_eq!(parse_chunk_size(b"ffffffffffffffff").ok(), Some(u64::MAX));
        assert_eq!(parse_chunk_size(b"5 \t;a=b").ok(), Some(5));
        for bad in [
            &b""[..],
            b";x",
            b"1g",
            b"fffffffffffffffff",
            b"-1",
            b"5 junk",
            b"5;a\nb",
            b"5;a\rb",
            b"5;a\x00",
        ] {
            assert!(parse_chunk_size(bad).is_err(), "{bad:?}");
        }
    }
}
