//! The HTTP/1.1 client side of the proxy, on the project's codec (crate `tollgate-h1`): the
//! one HTTP/1 implementation toward upstreams. In: a request head (origin form, with Host;
//! authority form for CONNECT), its body, and a connection of the endpoint's pool. Out: the
//! answer's head and a [`RawBody`] that reads the body straight off the socket and gives the
//! connection back to its pool when the body has ended; for an upgrade (101) or a CONNECT
//! tunnel (2xx), the socket itself, through the answer's [`crate::upgrade::OnUpgrade`].
//!
//! Two drivers, both run by the request's own task (no connection task, no channel):
//! - [`Conn::exchange`], for a bodiless request (GET, HEAD, DELETE: most of what a gateway
//!   forwards, and the benchmark's hot path): writes the head, parses the answer.
//! - [`Conn::send`] (module `send`), for a request with a body, an upgrade or CONNECT:
//!   writes the head, then streams the body (by its length, else in chunks) while it reads
//!   the answer. An answer that comes before the body is done ends the sending (the
//!   connection is then not reused); a body that fails (the client's fault) ends the
//!   exchange and closes the connection, with nothing more written.
//!
//! What it reads (RFC 9112): a status line and up to `tollgate_h1::MAX_HEADERS` fields in at
//! most [`MAX_HEAD`] bytes; up to [`MAX_INTERIM`] 1xx interim answers are skipped; the body is
//! framed by `Transfer-Encoding: chunked` (trailers kept), `Content-Length`, or the
//! connection's close; HEAD answers and 204/304 have none. Both framing fields, lengths that
//! differ or are not numbers, a broken chunk line and a 101 to a request that asked no upgrade
//! are errors (502), and close the connection. A connection goes back to the pool only when
//! the request went out whole, the answer was HTTP/1.1, did not ask to close, was framed by
//! length or chunks, and nothing followed it; bytes that come while it is idle close it when
//! it is next taken ([`Conn::is_usable`]).

use std::future::Future as _;
use std::io;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::BytesMut;
use http::request::Parts;
use http::{Method, Response, StatusCode};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::lifecycle::body::BoxError;
use tollgate_h1::body::{Decoder, Framing};
use tollgate_h1::response::{ResponseHead, body_plan, parse_response};

use crate::lifecycle::forward::Added;
use crate::upstream::io::UpstreamIo;

/// Where a connection goes back once its answer was read exactly to its end: the endpoint's
/// pool (module `pool`), which this module does not know.
pub(crate) trait Reuse: Send + Sync + std::fmt::Debug {
    /// Takes back an idle connection.
    fn reuse(&self, conn: Conn);
}

mod body;
mod send;

pub(crate) use body::RawBody;
pub(crate) use send::Outgoing;

/// Most bytes an answer's head (status line and fields) may take; hyper's default buffer.
pub(crate) const MAX_HEAD: usize = 8192 + 4096 * 100;
/// Most interim (1xx) answers before the final one: an upstream that sends them without end
/// is broken, not slow.
const MAX_INTERIM: usize = 16;
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
    /// The answer broke HTTP/1.1, as the codec found.
    #[error("invalid answer from upstream: {0}")]
    Codec(#[from] tollgate_h1::Error),
    /// The answer's head went past [`MAX_HEAD`] bytes.
    #[error("answer head larger than {MAX_HEAD} bytes")]
    HeadTooLarge,
    /// The request's body failed (too large, too slow, broken framing: the client's fault,
    /// recorded in its `BodyFault`); the upstream request was cut off.
    #[error("request body: {0}")]
    Body(BoxError),
    /// The request's body did not match the length its head announced.
    #[error("request body {0} its content-length")]
    BodyLength(&'static str),
}

/// An HTTP/1.1 connection to an endpoint, idle between exchanges.
#[derive(Debug)]
pub(crate) struct Conn {
    io: UpstreamIo,
    /// Bytes read and not yet consumed; empty between exchanges.
    rbuf: BytesMut,
    /// The request head being written (kept to reuse its allocation).
    wbuf: Vec<u8>,
    /// Exchanges that ended cleanly on it (counted by the pool it returns to).
    pub(crate) exchanges: u32,
}

impl Conn {
    pub fn new(io: UpstreamIo) -> Self {
        Self {
            io,
            rbuf: BytesMut::new(),
            wbuf: Vec::new(),
            exchanges: 0,
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
        // An EOF, a reset or stray bytes make it unusable; only "nothing there" (or stale
        // readiness from a read that did not drain the socket) leaves it usable.
        self.io.is_idle_usable()
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
        pool: &Arc<impl Reuse + 'static>,
    ) -> Result<Response<RawBody>, H1Error> {
        let target = req.uri.path_and_query().map_or("/", |p| p.as_str());
        let fields = req.headers.iter().chain(added.fields());
        tollgate_h1::encode::request_head(
            &req.method,
            target,
            fields,
            Framing::Length(0),
            &mut self.wbuf,
        );
        self.write_head().await?;
        let head_request = req.method == Method::HEAD;
        // The request's map, sized for its fields and the forwarding ones, takes the answer's
        // fields. hyper's server hands an answer's map, emptied, to the next request it reads
        // on that connection, so a client connection's map grows once, not on every request.
        let mut fields = std::mem::take(&mut req.headers);
        // Whether a byte of answer came (an interim answer counts, and fills `fields`).
        let mut heard = false;
        let mut interim = 0;
        loop {
            if let Some(head) = parse_response(&mut self.rbuf, &mut fields)? {
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
                return self.into_response(head, head_request, true, pool);
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

    /// Writes the head in `wbuf`; [`H1Error::Unwritten`] when not one byte of it went out.
    async fn write_head(&mut self) -> Result<(), H1Error> {
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
        // A TLS stream may hold the last record until flushed; on TCP this is a no-op.
        self.io.flush().await.map_err(H1Error::Io)
    }

    /// The answer to `head`, its body read off this connection. `reusable`: the request went
    /// out whole (else the connection never goes back, whatever the answer says).
    fn into_response(
        self,
        head: ResponseHead,
        head_request: bool,
        reusable: bool,
        pool: &Arc<impl Reuse + 'static>,
    ) -> Result<Response<RawBody>, H1Error> {
        let ResponseHead {
            status,
            version,
            headers,
            seen,
            reason,
        } = head;
        let (framing, keep) = body_plan(status, version, &headers, seen, head_request)?;
        let state = Decoder::new(framing);
        // A first chunk-size line that came with the head is checked now, so a broken one is
        // a 502 rather than an answer cut off after its head.
        state.check_first_chunk(&self.rbuf)?;
        let back = (keep && reusable).then(|| Arc::clone(pool) as Arc<dyn Reuse>);
        let body = RawBody::new(self, state, back, !seen.hop);
        let mut resp = Response::new(body);
        *resp.status_mut() = status;
        *resp.version_mut() = version;
        *resp.headers_mut() = headers;
        // A phrase of its own ("200 Fine") goes on to the client, as hyper passes it.
        if let Some(r) = reason.and_then(|r| hyper::ext::ReasonPhrase::try_from(r).ok()) {
            resp.extensions_mut().insert(r);
        }
        Ok(resp)
    }
}

/// Reads what the socket has into `buf` (after making room); 0 at EOF. The read future keeps
/// no state between polls, so a new one each time loses nothing.
fn poll_fill(
    io: &mut UpstreamIo,
    buf: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Poll<io::Result<usize>> {
    buf.reserve(READ_CHUNK);
    pin!(io.read_buf(buf)).poll(cx)
}

#[cfg(test)]
mod tests;
