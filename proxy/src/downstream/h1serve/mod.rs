//! Our HTTP/1 server: every HTTP/1 request a client sends, on plain ports and on TLS ports
//! whose ALPN chose `http/1.1` (or nothing). In: an accepted connection (TCP, or TLS over
//! it). Out: each request handed to [`service::handle`] (its body, if any, streamed as
//! `ClientBody::H1`, module `h1_body`) and its answer written back (module `write`), on the
//! connection's own task; an upgraded connection (101, or a CONNECT's 2xx) handed to
//! [`crate::upgrade`]. Only HTTP/2 goes to hyper's server ([`listener::serve`]): ALPN `h2`
//! on TLS ports (chosen in module `listener`), and here the HTTP/2 prior-knowledge preface
//! (h2c) at the start of a plain connection.
//!
//! Why our own: hyper's HTTP/1 server was about a fifth of the proxy's own instructions per
//! request (callgrind, README Performance): a dispatcher, a read strategy, a generic
//! encoder and a body channel per request. Here a request head is parsed straight into an
//! [`http::Request`] whose values share the read buffer, and a response's head and body go
//! out in one write when the body is already there; a bodiless request pays for no body
//! machinery, no lock and no channel. And one codec (`tollgate_h1`) frames every request,
//! so what the proxy reads is what it checks.
//!
//! What it does as hyper's server did: heads over `max_header_bytes` (or with more than
//! `tollgate_h1::MAX_HEADERS` fields) answered 431, malformed or ambiguously framed heads
//! 400, then closed; a `date` field on every answer; `content-length` from the body's exact
//! size, else `transfer-encoding: chunked` (to an HTTP/1.0 client: the close ends the
//! body); no body for HEAD, 1xx, 204 and 304; HTTP/1.0 kept alive only when it asks
//! (`connection: keep-alive` on the answer); `connection: close` on the answer to a request
//! that asked to close, once the listener stops, or when a request body was left unread,
//! and the connection closed after it; `Expect: 100-continue` answered `100 Continue` when
//! the body is first read (other expectations are ignored, as hyper did: the field goes on
//! to the service); response trailers only to a client that sent `TE: trailers`; the header
//! read timeout, from the moment the connection waits for a head; a client that closes its
//! side while its request is in flight cancels the request.

#[cfg(test)]
mod tests;
mod write;

use std::future::Future as _;

use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::BytesMut;
use http::{Method, StatusCode, Version};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::sync::watch;
use tollgate_h1::body::Framing;
use tollgate_h1::encode::{self, RequestShape};
use tollgate_h1::request::RequestHead;

use crate::downstream::h1_body::Reader;

use self::write::{Answer, WRITE_HIGH, write_response};
use crate::downstream::client_body::ClientBody;
use crate::downstream::conn::ConnCtx;
use crate::downstream::listener;
use crate::lifecycle::service::{self, ProxyResponse};
use crate::state::Shared;
use crate::upgrade::{self, Pending, Upgraded};

/// Least room for a head, whatever `max_header_bytes` says (hyper's least buffer).
const MIN_HEAD_BUFFER: usize = 8192;
/// Room for fields beyond the request's own: a Host the proxy may add upstream, and the
/// answer's, which our HTTP/1 exchange reads into the request's map (module `h1`), with the
/// `X-Request-Id` the service sets on it.
const FIELDS_ADDED: usize = 6;
/// Room made in the read buffer when it runs low: a new buffer, since the heads of earlier
/// requests still share the old one.
const READ_CHUNK: usize = 8192;
/// Least room for a read; less and [`READ_CHUNK`] more is made. (Making room for a whole
/// chunk before every read allocated a buffer per request.)
const READ_ROOM: usize = 2048;
/// What an HTTP/2 client sends first when it knows the port speaks HTTP/2 (h2c).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A connection our server can serve: TCP, or TLS over it.
pub(crate) trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for T {}

/// Serves `io` until it closes, the listener stops, it is upgraded, or (`h2c`: a plain
/// port) it turns out to be HTTP/2, which goes to hyper.
pub(crate) async fn serve<I: Io>(
    shared: &Arc<Shared>,
    mut io: I,
    conn: Arc<ConnCtx>,
    stop: watch::Receiver<bool>,
    h2c: bool,
) {
    let max_head = conn.limits.max_header_bytes.max(MIN_HEAD_BUFFER);
    let mut rbuf = BytesMut::with_capacity(READ_CHUNK);
    let mut wbuf: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    let mut wait = Wait::new(stop, &conn.limits);
    // The preface is looked for only before the connection's first head.
    let mut first = h2c;
    loop {
        // A head: parsed from what is buffered (pipelined requests), else read.
        wait.start_head(rbuf.is_empty());
        let head = loop {
            let parsed =
                if first && H2_PREFACE.starts_with(&rbuf[..rbuf.len().min(H2_PREFACE.len())]) {
                    if rbuf.len() >= H2_PREFACE.len() {
                        // The preface, read already, is read again first.
                        let io = TokioIo::new(Upgraded::new(io, rbuf.freeze()));
                        return listener::serve(shared, io, conn, wait.into_stop()).await;
                    }
                    Parsed::Partial
                } else {
                    parse_request(&mut rbuf)
                };
            match parsed {
                Parsed::Serve(head) => break head,
                Parsed::Partial if rbuf.len() < max_head => {}
                Parsed::Partial => {
                    return refuse(&mut io, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE).await;
                }
                Parsed::Refuse(code) => return refuse(&mut io, code).await,
            }
            // Stopping closes a connection that has not begun a request.
            if !wait.read_head(&mut io, &mut rbuf).await {
                return;
            }
        };
        first = false;
        let (req, shape, mut reader, pending) = prepare(head);
        if let Some(r) = reader.as_mut() {
            r.prime(&mut rbuf);
        }

        // The service, cancelled when the client closes its side meanwhile. Bytes that come
        // (a pipelined request) stay in `rbuf`. Pinned where it is made: the future is large,
        // and each move of it was a copy (memmove, ~1% of the CPU at saturation).
        let call = pin!(service::handle(shared.clone(), conn.clone(), req));
        let Some(resp) = in_flight(call, &mut io, &mut rbuf, reader.as_mut()).await else {
            return;
        };
        let status = resp.status();
        let switching = pending.is_some()
            && reader.as_ref().is_none_or(Reader::is_done)
            && (status == StatusCode::SWITCHING_PROTOCOLS
                || (shape.connect && status.is_success()));
        let mut close = shape.close || wait.stopped();
        if let Some(r) = reader.as_mut() {
            close |= r.must_close(&mut rbuf, false);
        }
        let answer = Answer {
            request: RequestShape {
                // A CONNECT's 2xx carries no length (RFC 9110 §8.6), as a HEAD answer.
                head: shape.head || (switching && shape.connect),
                http10: shape.http10,
            },
            close: close && !switching,
            trailers: shape.trailers,
            head_only: switching,
        };
        let written =
            write_response(&mut io, &mut wbuf, resp, answer, reader.as_mut(), &mut rbuf).await;
        if wbuf.capacity() > WRITE_HIGH {
            // Not kept for the life of the connection after one large answer.
            wbuf = Vec::with_capacity(READ_CHUNK);
        }
        if let (true, Ok(_), Some(pending)) = (switching, &written, pending) {
            // The bytes read past the head are the tunnel's.
            pending.fulfil(Upgraded::new(io, rbuf.split().freeze()));
            return;
        }
        if let Some(r) = reader.as_mut() {
            close |= r.must_close(&mut rbuf, true);
        }
        match written {
            Ok(true) if !close && !switching => {}
            Ok(_) => {
                let _ = io.shutdown().await;
                return;
            }
            Err(e) => {
                tracing::debug!(error = %e, "writing a response failed");
                return;
            }
        }
    }
}

/// What [`serve`] must remember of a request for its answer.
#[derive(Debug, Clone, Copy)]
struct Shape {
    /// A HEAD request: the answer has no body.
    head: bool,
    /// The client asked to close after this exchange (HTTP/1.0 rules included).
    close: bool,
    /// An HTTP/1.0 request.
    http10: bool,
    /// `TE: trailers`.
    trailers: bool,
    /// A CONNECT: its 2xx opens a tunnel.
    connect: bool,
}

/// What a head read off the connection comes to.
// Returned once per request and taken apart at once: a box would cost an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Parsed {
    /// Not a whole head yet.
    Partial,
    /// A request to serve.
    Serve(RequestHead),
    /// Refused with this status (400, or 431 for too many fields), then closed.
    Refuse(StatusCode),
}

/// Parses a request head off the front of `buf` (taking its bytes only when it parses).
fn parse_request(buf: &mut BytesMut) -> Parsed {
    match tollgate_h1::request::parse_request(buf, FIELDS_ADDED) {
        Ok(Some(head)) => Parsed::Serve(head),
        Ok(None) => Parsed::Partial,
        Err(tollgate_h1::Error::TooManyFields) => {
            tracing::debug!("request refused: too many fields");
            Parsed::Refuse(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
        }
        Err(e) => {
            tracing::debug!(error = %e, "request refused");
            Parsed::Refuse(StatusCode::BAD_REQUEST)
        }
    }
}

/// The request the service gets, what its answer needs, the reader of its body (none when
/// it has none) and the upgrade it may ask (an `Upgrade` request, a CONNECT).
fn prepare(
    head: RequestHead,
) -> (
    http::Request<ClientBody>,
    Shape,
    Option<Reader>,
    Option<Pending>,
) {
    let req = &head.request;
    let connect = req.method() == Method::CONNECT;
    let shape = Shape {
        head: req.method() == Method::HEAD,
        close: head.close,
        http10: req.version() == Version::HTTP_10,
        trailers: head.te_trailers,
        connect,
    };
    let (reader, body) = match head.body {
        Framing::Length(0) => (None, ClientBody::Empty),
        framing => {
            let (reader, body) = Reader::new(framing, head.expect_continue);
            (Some(reader), ClientBody::H1(body))
        }
    };
    let mut req = head.request.map(|()| body);
    let pending = (head.upgrade || connect).then(|| {
        let (pending, on) = upgrade::pending();
        req.extensions_mut().insert(on);
        pending
    });
    (req, shape, reader, pending)
}

/// Answers a refused head with `code` and closes the connection.
async fn refuse<I: Io>(io: &mut I, code: StatusCode) {
    let mut out = Vec::with_capacity(128);
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(code.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(code.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\ncontent-length: 0\r\nconnection: close\r\ndate: ");
    encode::http_date(&mut out);
    out.extend_from_slice(b"\r\n\r\n");
    let _ = io.write_all(&out).await;
    let _ = io.shutdown().await;
}

/// The connection's waits for request heads: the header read timeout on one tokio sleep per
/// connection (re-armed when it fires before the current deadline, or when the deadline moves
/// earlier than it is armed for), and the listener's stop signal, polled once per waker.
struct Wait {
    stop: watch::Receiver<bool>,
    stopped: Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
    registered: bool,
    deadline: tokio::time::Instant,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Waiting for a head's first byte (the idle timeout runs), not for the rest of it.
    idle: bool,
    idle_timeout: Duration,
    header_timeout: Duration,
}

impl Wait {
    fn new(stop: watch::Receiver<bool>, limits: &crate::limits::Limits) -> Self {
        let mut changed = stop.clone();
        Self {
            stop,
            stopped: Box::pin(async move {
                let _ = changed.changed().await;
            }),
            registered: false,
            deadline: tokio::time::Instant::now(),
            sleep: None,
            idle: false,
            idle_timeout: limits.idle_timeout,
            header_timeout: limits.header_read_timeout,
        }
    }

    /// The listener is stopping (or gone).
    fn stopped(&self) -> bool {
        self.stop.has_changed().unwrap_or(true)
    }

    fn into_stop(self) -> watch::Receiver<bool> {
        self.stop
    }

    /// A new head is awaited: the idle timeout runs from now while none of it is here
    /// (`idle`), else the header read timeout.
    fn start_head(&mut self, idle: bool) {
        self.idle = idle;
        let timeout = if idle {
            self.idle_timeout
        } else {
            self.header_timeout
        };
        self.deadline = tokio::time::Instant::now() + timeout;
    }

    /// Reads more of a head into `buf`; false when the connection is done (closed by the
    /// client, failed, timed out, or idle when the listener stops).
    async fn read_head<I: Io>(&mut self, io: &mut I, buf: &mut BytesMut) -> bool {
        std::future::poll_fn(|cx| {
            if buf.is_empty() && self.poll_stopped(cx) {
                return Poll::Ready(false);
            }
            make_room(buf);
            match pin!(io.read_buf(buf)).poll(cx) {
                Poll::Ready(Ok(n)) => {
                    if n > 0 && self.idle {
                        // The head's first bytes: it has the header read timeout from now.
                        self.start_head(false);
                    }
                    return Poll::Ready(n > 0);
                }
                Poll::Ready(Err(e)) => {
                    tracing::debug!(error = %e, "reading a request head failed");
                    return Poll::Ready(false);
                }
                Poll::Pending => {}
            }
            if self.poll_timeout(cx) {
                tracing::debug!("request head timed out");
                return Poll::Ready(false);
            }
            Poll::Pending
        })
        .await
    }

    fn poll_stopped(&mut self, cx: &mut Context<'_>) -> bool {
        if self.registered {
            return self.stopped();
        }
        // The task's waker does not change (one connection, one task): register once.
        self.registered = true;
        self.stopped.as_mut().poll(cx).is_ready() || self.stopped()
    }

    fn poll_timeout(&mut self, cx: &mut Context<'_>) -> bool {
        let deadline = self.deadline;
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if sleep.deadline() > deadline {
            // Armed for a later deadline (the idle one, and now a head has begun with a
            // shorter header timeout): it must fire at this one.
            sleep.as_mut().reset(deadline);
        }
        loop {
            if sleep.as_mut().poll(cx).is_pending() {
                return false;
            }
            if sleep.deadline() >= deadline {
                return true;
            }
            // Armed for an earlier head's deadline: on to this one's.
            sleep.as_mut().reset(deadline);
        }
    }
}

fn make_room(buf: &mut BytesMut) {
    if buf.capacity() - buf.len() < READ_ROOM {
        buf.reserve(READ_CHUNK);
    }
}

/// Awaits the service's answer, reading the request's body for it meanwhile; `None` when the
/// client closed (or broke) its side first.
async fn in_flight<I: Io>(
    mut call: Pin<
        &mut impl std::future::Future<Output = Result<ProxyResponse, std::convert::Infallible>>,
    >,
    io: &mut I,
    rbuf: &mut BytesMut,
    mut reader: Option<&mut Reader>,
) -> Option<ProxyResponse> {
    std::future::poll_fn(|cx| {
        if let Poll::Ready(r) = call.as_mut().poll(cx) {
            return Poll::Ready(match r {
                Ok(resp) => Some(resp),
                Err(never) => match never {},
            });
        }
        match reader.as_deref_mut() {
            Some(r) if !r.is_done() => r.drive(cx, io, rbuf, false),
            // As hyper did: watch for the client's EOF while nothing is buffered. tokio
            // cleared the socket's readiness on the head's short read, so this costs no
            // system call until the client sends or closes.
            _ if rbuf.is_empty() => {
                make_room(rbuf);
                if let Poll::Ready(Ok(0) | Err(_)) = pin!(io.read_buf(rbuf)).poll(cx) {
                    return Poll::Ready(None);
                }
            }
            _ => {}
        }
        Poll::Pending
    })
    .await
}
