//! The exchange of a request with a body, an upgrade or CONNECT. In: the request head, its
//! body as an [`Outgoing`] (made before a connection is picked: a request refused before its
//! first byte was written goes on another connection with what was taken from the body) and
//! the connection. Out: the answer, as [`Conn::exchange`] gives it; for a 101 to an upgrade
//! (or a 2xx to CONNECT), an answer without a body whose extensions hold the socket's
//! [`OnUpgrade`].
//!
//! The body is framed by the request's own `Content-Length` when it has one, else by its
//! exact size when known, else in chunks; request trailers reach here only from a route that
//! forwards them, and go out after the last chunk. Its first frame, when already there, goes out in one write with the
//! head; the rest is streamed while the answer is read, in the same task: each poll writes
//! what the body has ready (one frame at a time, so memory stays at one frame however large
//! the body: the socket's backpressure reaches the client) and reads what the upstream sent.
//! The answer's head may come before the body is done (an early 413 or 401): the sending
//! stops there, and the connection is never reused (the upstream may still be reading a
//! body that will not come). A write that fails leaves the reading on, so an upstream that
//! answered and closed is still heard. A body that fails ends the exchange with
//! [`H1Error::Body`]: the connection is dropped (closed) with nothing more written.

use std::future::poll_fn;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Buf as _, Bytes};
use http::header::{CONNECTION, CONTENT_LENGTH};
use http::request::Parts;
use http::{HeaderValue, Method, Response, StatusCode};
use hyper::body::{Body as _, Frame};
use tokio::io::{AsyncWrite as _, AsyncWriteExt as _};
use tollgate_h1::body::Framing;
use tollgate_h1::encode::{LAST_CHUNK, chunk_size, last_chunk_with_trailers};
use tollgate_h1::response::{ResponseHead, parse_response};

use super::{Conn, H1Error, MAX_HEAD, MAX_INTERIM, RawBody, Reuse, poll_fill};
use crate::lifecycle::body::{BoxError, ProxyBody};
use crate::lifecycle::forward::Added;
use crate::upgrade::{self, OnUpgrade, Upgraded};
use crate::upstream::io::UpstreamIo;

/// A chunk's CRLF.
const CRLF: &[u8] = b"\r\n";
/// A last chunk's data CRLF and the last chunk, when the body ends with its data.
const CRLF_LAST_CHUNK: &[u8] = b"\r\n0\r\n\r\n";

impl Conn {
    /// Sends `req` with the body in `out` (streamed while the answer is read) and reads the
    /// answer's head. `upgrade`: the request asks for an upgrade (or is a CONNECT), so a 101
    /// (or a 2xx to CONNECT) hands the socket over instead of failing. The head goes out in
    /// one write with what `out` holds already (its first frame, [`Outgoing::first`]). As
    /// with [`Conn::exchange`], a request of which not one byte could be written fails with
    /// [`H1Error::Unwritten`] and is left as it was, `out` whole; once written, the
    /// answer's fields take the request's map, and the request is never sent again.
    pub async fn send(
        mut self,
        req: &mut Parts,
        out: &mut Outgoing,
        added: &Added<'_>,
        pool: &Arc<impl Reuse + 'static>,
        upgrade: bool,
    ) -> Result<Response<RawBody>, H1Error> {
        let connect = req.method == Method::CONNECT;
        let target = if connect {
            req.uri.authority().map_or("", |a| a.as_str())
        } else {
            req.uri.path_and_query().map_or("/", |p| p.as_str())
        };
        let fields = req.headers.iter().chain(added.fields());
        let framing = out.framing;
        tollgate_h1::encode::request_head(&req.method, target, fields, framing, &mut self.wbuf);
        self.write_head_with(out).await?;
        let mut fields = std::mem::take(&mut req.headers);
        let (io, rbuf) = (&mut self.io, &mut self.rbuf);
        let mut heard = false;
        let mut interim = 0;
        let head = poll_fn(|cx| -> Poll<Result<ResponseHead, H1Error>> {
            // The body first: one that fails ends the exchange before anything else is read
            // or written.
            out.drive(io, cx)?;
            loop {
                if let Some(head) = parse_response(rbuf, &mut fields)? {
                    if head.status == StatusCode::SWITCHING_PROTOCOLS && !upgrade {
                        return Poll::Ready(Err(H1Error::Invalid(
                            "101 to a request without an upgrade",
                        )));
                    }
                    if head.status.is_informational()
                        && head.status != StatusCode::SWITCHING_PROTOCOLS
                    {
                        interim += 1;
                        if interim > MAX_INTERIM {
                            return Poll::Ready(Err(H1Error::Invalid("too many interim answers")));
                        }
                        continue;
                    }
                    return Poll::Ready(Ok(head));
                }
                if rbuf.len() >= MAX_HEAD {
                    return Poll::Ready(Err(H1Error::HeadTooLarge));
                }
                match ready!(poll_fill(io, rbuf, cx)) {
                    Ok(0) | Err(_) if !heard && out.write_failed.is_some() => {
                        // The upstream stopped reading and said nothing: the write's error
                        // is the cause.
                        let e = out.write_failed.take();
                        return Poll::Ready(Err(H1Error::Io(
                            e.unwrap_or_else(|| io::ErrorKind::UnexpectedEof.into()),
                        )));
                    }
                    Ok(0) if heard => return Poll::Ready(Err(H1Error::Closed)),
                    Ok(0) => {
                        let eof = io::ErrorKind::UnexpectedEof.into();
                        return Poll::Ready(Err(H1Error::NoAnswer(eof)));
                    }
                    Ok(_) => heard = true,
                    Err(e) if heard => return Poll::Ready(Err(H1Error::Io(e))),
                    Err(e) => return Poll::Ready(Err(H1Error::NoAnswer(e))),
                }
            }
        })
        .await?;
        let whole = out.is_done();
        let switched = (head.status == StatusCode::SWITCHING_PROTOCOLS && upgrade)
            || (connect && head.status.is_success());
        if switched {
            return Ok(self.hand_over(head));
        }
        let head_request = req.method == Method::HEAD;
        // A CONNECT refused is an ordinary answer, but its connection is not reused.
        self.into_response(head, head_request, whole && !connect, pool)
    }

    /// Writes the head in `wbuf`, and with it what `out` has queued;
    /// [`H1Error::Unwritten`] (and `out` untouched) when not one byte went out.
    async fn write_head_with(&mut self, out: &mut Outgoing) -> Result<(), H1Error> {
        let mut written = 0;
        while written < self.wbuf.len() {
            let bufs = [
                IoSlice::new(&self.wbuf[written..]),
                IoSlice::new(&out.line[out.line_at..]),
                IoSlice::new(&out.data),
                IoSlice::new(out.tail),
            ];
            match self.io.write_vectored(&bufs).await {
                Ok(0) if written == 0 => {
                    return Err(H1Error::Unwritten(io::ErrorKind::WriteZero.into()));
                }
                Ok(0) => return Err(H1Error::Io(io::ErrorKind::WriteZero.into())),
                Ok(n) => {
                    let head = (self.wbuf.len() - written).min(n);
                    written += head;
                    out.advance(n - head);
                }
                Err(e) if written == 0 => return Err(H1Error::Unwritten(e)),
                Err(e) => return Err(H1Error::Io(e)),
            }
        }
        Ok(())
    }

    /// The answer that switched protocols: the socket, with what was read past the head,
    /// goes to whoever waits on the answer's [`OnUpgrade`]; the connection never returns to
    /// a pool.
    fn hand_over(self, head: ResponseHead) -> Response<RawBody> {
        let ResponseHead {
            status,
            version,
            mut headers,
            reason,
            ..
        } = head;
        // The codec leaves a lone `Connection: upgrade` out of the map (it names no field);
        // the client needs it to see the switch.
        if status == StatusCode::SWITCHING_PROTOCOLS && !headers.contains_key(CONNECTION) {
            headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
        }
        let (pending, on): (_, OnUpgrade) = upgrade::pending();
        pending.fulfil(Upgraded::new(self.io, self.rbuf.freeze()));
        let mut resp = Response::new(RawBody::handed_over());
        *resp.status_mut() = status;
        *resp.version_mut() = version;
        *resp.headers_mut() = headers;
        if let Some(r) = reason.and_then(|r| hyper::ext::ReasonPhrase::try_from(r).ok()) {
            resp.extensions_mut().insert(r);
        }
        resp.extensions_mut().insert(on);
        resp
    }
}

/// How the body goes out: the request's own `Content-Length` stands (the client side
/// checked it frames the body); else the body's exact size; else chunks.
fn framing(req: &Parts, body: &ProxyBody) -> Result<Framing, H1Error> {
    if let Some(v) = req.headers.get(CONTENT_LENGTH) {
        return tollgate_h1::parse_decimal(v.as_bytes().trim_ascii())
            .map(Framing::Length)
            .ok_or(H1Error::BodyLength("framed by an invalid"));
    }
    if body.is_end_stream() {
        return Ok(Framing::Length(0));
    }
    Ok(body
        .size_hint()
        .exact()
        .map_or(Framing::Chunked, Framing::Length))
}

/// A request body on its way out: the frame being written (a chunk's size line, its data,
/// its CRLF) and what is left of the body. It outlives a connection that refused the
/// request before a byte was written, so what was taken from the body goes on the next.
pub(crate) struct Outgoing {
    body: ProxyBody,
    framing: Framing,
    /// `None` when chunked; else the bytes the length still expects.
    remaining: Option<u64>,
    /// A chunk's size line, written from `line_at`.
    line: Vec<u8>,
    line_at: usize,
    data: Bytes,
    /// Written after the data: a chunk's CRLF, and the last chunk once the body ended.
    tail: &'static [u8],
    /// The body has ended (its last bytes may still be queued).
    ended: bool,
    /// A write failed: nothing more is sent, the answer is still read.
    write_failed: Option<io::Error>,
}

impl Outgoing {
    /// The body of `req`, framed by [`framing`].
    pub(crate) fn new(req: &Parts, body: ProxyBody) -> Result<Self, H1Error> {
        let framing = framing(req, &body)?;
        let remaining = match framing {
            Framing::Length(n) => Some(n),
            Framing::Chunked | Framing::Close => None,
        };
        let ended = body.is_end_stream();
        let mut this = Self {
            body,
            framing,
            remaining,
            line: Vec::new(),
            line_at: 0,
            data: Bytes::new(),
            tail: &[],
            ended,
            write_failed: None,
        };
        // An empty body sent in chunks (its length unknown until it ended) still ends.
        if ended && this.remaining.is_none() {
            this.tail = LAST_CHUNK;
        }
        Ok(this)
    }

    /// Takes the body's first frame if it is there already, to go out with the head (one
    /// write, as hyper's client did). A body that fails at once fails here, before any
    /// connection was written to (a body over the size limit is refused without the
    /// upstream seeing its head).
    pub(crate) async fn first(&mut self) -> Result<(), H1Error> {
        if self.ended {
            return Ok(());
        }
        poll_fn(|cx| match Pin::new(&mut self.body).poll_frame(cx) {
            Poll::Pending => Poll::Ready(Ok(())),
            Poll::Ready(polled) => Poll::Ready(self.take(polled)),
        })
        .await
    }

    /// All of the body went out.
    fn is_done(&self) -> bool {
        self.ended && self.queued() == 0 && self.write_failed.is_none()
    }

    fn queued(&self) -> usize {
        self.line.len() - self.line_at + self.data.len() + self.tail.len()
    }

    /// Writes what the body has ready, until the body or the socket makes it wait (having
    /// arranged a wake-up), all is sent, or a write failed. An error only when the body
    /// failed or broke its length.
    fn drive(&mut self, io: &mut UpstreamIo, cx: &mut Context<'_>) -> H1Result {
        if self.write_failed.is_some() {
            return Ok(());
        }
        loop {
            while self.queued() > 0 {
                let bufs = [
                    IoSlice::new(&self.line[self.line_at..]),
                    IoSlice::new(&self.data),
                    IoSlice::new(self.tail),
                ];
                match Pin::new(&mut *io).poll_write_vectored(cx, &bufs) {
                    Poll::Pending => return Ok(()),
                    Poll::Ready(Ok(0)) => return self.failed(io::ErrorKind::WriteZero.into()),
                    Poll::Ready(Ok(n)) => self.advance(n),
                    Poll::Ready(Err(e)) => return self.failed(e),
                }
            }
            // What went to a TLS stream may wait in its buffer until flushed (a no-op on
            // TCP): flushed before waiting on the body, which may be slow.
            match Pin::new(&mut *io).poll_flush(cx) {
                Poll::Pending => return Ok(()),
                Poll::Ready(Err(e)) => return self.failed(e),
                Poll::Ready(Ok(())) => {}
            }
            if self.ended {
                return Ok(());
            }
            match Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Pending => return Ok(()),
                Poll::Ready(polled) => self.take(polled)?,
            }
        }
    }

    /// Queues what the body gave.
    fn take(&mut self, polled: Option<Result<Frame<Bytes>, BoxError>>) -> H1Result {
        let frame = match polled {
            None => return self.end(),
            Some(Err(e)) => return Err(H1Error::Body(e)),
            Some(Ok(frame)) => frame,
        };
        let data = match frame.into_data() {
            Ok(data) => data,
            // Trailers (only on a route that forwards them, filtered: `body::LimitedBody`):
            // the body's end, with the last chunk. A body framed by its length has no room
            // for them: dropped. Nothing is queued here (a frame is taken once the last
            // one went out), so the last chunk starts the queue.
            Err(frame) => {
                if let (None, Ok(trailers)) = (self.remaining, frame.into_trailers()) {
                    self.ended = true;
                    self.line.clear();
                    self.line_at = 0;
                    last_chunk_with_trailers(&trailers, &mut self.line);
                    self.data = Bytes::new();
                    self.tail = &[];
                }
                return Ok(());
            }
        };
        if data.is_empty() {
            return Ok(());
        }
        match &mut self.remaining {
            Some(left) => {
                *left = left
                    .checked_sub(data.len() as u64)
                    .ok_or(H1Error::BodyLength("longer than"))?;
            }
            None => {
                self.line.clear();
                self.line_at = 0;
                chunk_size(data.len(), &mut self.line);
                self.tail = CRLF;
            }
        }
        self.data = data;
        // Known to be the last frame: its end goes out in the same write.
        if self.body.is_end_stream() {
            self.end()?;
        }
        Ok(())
    }

    /// The body has ended: the last chunk is queued, or the length checked.
    fn end(&mut self) -> Result<(), H1Error> {
        self.ended = true;
        match self.remaining {
            None if self.tail == CRLF => self.tail = CRLF_LAST_CHUNK,
            None => self.tail = LAST_CHUNK,
            Some(0) => {}
            Some(_) => return Err(H1Error::BodyLength("shorter than")),
        }
        Ok(())
    }

    fn failed(&mut self, e: io::Error) -> H1Result {
        tracing::debug!(error = %e, "writing the request body failed; reading the answer");
        self.write_failed = Some(e);
        Ok(())
    }

    /// `n` bytes of the queue went out.
    fn advance(&mut self, mut n: usize) {
        let line = (self.line.len() - self.line_at).min(n);
        self.line_at += line;
        n -= line;
        let data = self.data.len().min(n);
        self.data.advance(data);
        n -= data;
        self.tail = &self.tail[n.min(self.tail.len())..];
    }
}

type H1Result = Result<(), H1Error>;
