//! The server side of a plain HTTP/1.1 connection, for the requests most clients send: an
//! HTTP/1.1 head without a body. In: an accepted TCP connection of an HTTP port. Out: each
//! such request handed to [`service::handle`] and its response written back, on the
//! connection's own task; the first request this module does not serve itself hands the whole
//! connection, with the bytes read so far, to hyper's server ([`listener::serve`]).
//!
//! Why: hyper's HTTP/1 server was about a fifth of the proxy's own instructions per request
//! (callgrind, README Performance): a dispatcher, a read strategy, a generic encoder and a
//! body channel per request. Here a request head is parsed straight into an
//! [`http::Request`] whose values share the read buffer, and a response's head and body go
//! out in one write when the body is already there.
//!
//! What it serves itself: HTTP/1.1 requests in origin form (`GET /path HTTP/1.1`), without
//! `Transfer-Encoding`, a non-zero `Content-Length`, `Upgrade`, `Expect` or `TE`, whose
//! `Connection` (if any) is `keep-alive` or `close`, with at most `tollgate_h1::MAX_HEADERS` fields.
//! Everything else (HTTP/1.0, HTTP/2 by prior knowledge, request bodies, upgrades and
//! CONNECT, `Expect: 100-continue`, heads too large or malformed, which hyper answers 431 or
//! 400) goes to hyper, which then keeps the connection to its end.
//!
//! What it does as hyper's server did: a `date` field on every response; `content-length`
//! from the body's exact size, else `transfer-encoding: chunked`; no body for HEAD, 1xx, 204
//! and 304; `connection: close` on the answer to a request that asked to close, or once the
//! listener stops, and the connection closed after it; the header read timeout, from the
//! moment the connection waits for a head; a client that closes its side while its request
//! is in flight cancels the request. Response trailers are dropped (a request with `TE`,
//! which asks for them, goes to hyper).

use std::future::Future as _;
use std::io;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf as _, Bytes, BytesMut};
use http::header::{EXPECT, TE};
use http::{Method, Request, Version};
use hyper::body::Body;
use hyper::ext::ReasonPhrase;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tollgate_h1::body::Framing;
use tollgate_h1::encode::{self, BodyShape, RequestShape};
use tollgate_h1::framing::FramingError;

use crate::body::ClientBody;
use crate::gate::Gated;
use crate::listener::{self, HEADER_READ_TIMEOUT, MIN_H1_BUFFER};
use crate::proxy::Shared;
use crate::service::{self, ConnCtx, ProxyResponse};

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
/// The answer to a head refused for its framing; the connection closes after it.
const BAD_REQUEST: &[u8] =
    b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
/// Response bytes gathered before they are written while the body still comes.
const WRITE_HIGH: usize = 64 * 1024;

/// Serves `io` until it closes, the listener stops, or hyper takes it over.
pub(crate) async fn serve(
    shared: &Arc<Shared>,
    mut io: TcpStream,
    conn: Arc<ConnCtx>,
    stop: watch::Receiver<bool>,
) {
    let max_head = shared.limits.max_header_bytes.max(MIN_H1_BUFFER);
    let mut rbuf = BytesMut::with_capacity(READ_CHUNK);
    let mut wbuf: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    let mut wait = Wait::new(stop);
    loop {
        // A head: parsed from what is buffered (pipelined requests), else read.
        wait.start_head();
        let (req, shape) = loop {
            match parse_request(&mut rbuf) {
                Parsed::Serve(req, shape) => break (req, shape),
                Parsed::Partial if rbuf.len() < max_head => {}
                Parsed::Reject(e) => {
                    tracing::debug!(error = %e, "request refused");
                    let _ = io.write_all(BAD_REQUEST).await;
                    let _ = io.shutdown().await;
                    return;
                }
                Parsed::Partial | Parsed::Hyper => {
                    // Gated: hyper's parser frames some heads otherwise (module `gate`).
                    let io = TokioIo::new(Gated::new(
                        Prefixed {
                            prefix: rbuf.freeze(),
                            io,
                        },
                        true,
                    ));
                    return listener::serve(shared, io, conn, wait.into_stop()).await;
                }
            }
            // Stopping closes a connection that has not begun a request.
            if !wait.read_head(&mut io, &mut rbuf).await {
                return;
            }
        };

        // The service, cancelled when the client closes its side meanwhile. Bytes that come
        // (a pipelined request) stay in `rbuf`. Pinned where it is made: the future is large,
        // and each move of it was a copy (memmove, ~1% of the CPU at saturation).
        let call = pin!(service::handle(shared.clone(), conn.clone(), req));
        let Some(resp) = in_flight(call, &mut io, &mut rbuf).await else {
            return;
        };
        let close = shape.close || wait.stopped();
        let written = write_response(&mut io, &mut wbuf, resp, shape.head, close).await;
        if wbuf.capacity() > WRITE_HIGH {
            // Not kept for the life of the connection after one large answer.
            wbuf = Vec::with_capacity(READ_CHUNK);
        }
        match written {
            Ok(true) if !close => {}
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

/// What [`serve`] must remember of a request for its response.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    /// A HEAD request: the response has no body.
    pub(crate) head: bool,
    /// The client asked to close after this exchange.
    pub(crate) close: bool,
}

// Returned once per request and taken apart at once: a box would cost an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Parsed {
    /// Not a whole head yet.
    Partial,
    /// A request this module serves.
    Serve(Request<ClientBody>, Shape),
    /// Anything else: hyper's.
    Hyper,
    /// A head whose framing is ambiguous (module `framing`): answered 400, then closed.
    Reject(FramingError),
}

/// Parses a request head off the front of `buf` (taking its bytes only when it is served).
pub(crate) fn parse_request(buf: &mut BytesMut) -> Parsed {
    let head = match tollgate_h1::request::parse_request(buf, FIELDS_ADDED) {
        Ok(Some(head)) => head,
        Ok(None) => return Parsed::Partial,
        // Every head read here, served or handed to hyper: hyper's parser takes a bare LF
        // as a line end, and a length with chunks as chunks.
        Err(tollgate_h1::Error::Framing(e)) => return Parsed::Reject(e),
        // hyper answers the rest (400, or 431 for too many fields).
        Err(_) => return Parsed::Hyper,
    };
    let req = &head.request;
    let served = head.body == Framing::Length(0)
        && !head.expect_continue
        && !head.upgrade
        && req.version() == Version::HTTP_11
        && req.method() != Method::CONNECT
        && req.uri().scheme().is_none()
        && req.uri().path().starts_with('/')
        && !req.headers().contains_key(EXPECT)
        && !req.headers().contains_key(TE);
    if !served {
        // Put back for hyper, as read.
        let rest = buf.split();
        buf.extend_from_slice(&head.raw);
        buf.unsplit(rest);
        return Parsed::Hyper;
    }
    let shape = Shape {
        head: req.method() == Method::HEAD,
        close: head.close,
    };
    Parsed::Serve(head.request.map(|()| ClientBody::Empty), shape)
}

/// The connection's waits for request heads: the header read timeout on one tokio sleep per
/// connection (re-armed only when it fires before the current deadline, as [`crate::timer`]
/// does for hyper), and the listener's stop signal, polled once per waker.
struct Wait {
    stop: watch::Receiver<bool>,
    stopped: Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
    registered: bool,
    deadline: tokio::time::Instant,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Wait {
    fn new(stop: watch::Receiver<bool>) -> Self {
        let mut changed = stop.clone();
        Self {
            stop,
            stopped: Box::pin(async move {
                let _ = changed.changed().await;
            }),
            registered: false,
            deadline: tokio::time::Instant::now(),
            sleep: None,
        }
    }

    /// The listener is stopping (or gone).
    fn stopped(&self) -> bool {
        self.stop.has_changed().unwrap_or(true)
    }

    fn into_stop(self) -> watch::Receiver<bool> {
        self.stop
    }

    /// A new head begins: its header read timeout runs from now.
    fn start_head(&mut self) {
        self.deadline = tokio::time::Instant::now() + HEADER_READ_TIMEOUT;
    }

    /// Reads more of a head into `buf`; false when the connection is done (closed by the
    /// client, failed, timed out, or idle when the listener stops).
    async fn read_head(&mut self, io: &mut TcpStream, buf: &mut BytesMut) -> bool {
        std::future::poll_fn(|cx| {
            if buf.is_empty() && self.poll_stopped(cx) {
                return Poll::Ready(false);
            }
            make_room(buf);
            match pin!(io.read_buf(buf)).poll(cx) {
                Poll::Ready(Ok(n)) => return Poll::Ready(n > 0),
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

/// Awaits the service's answer; `None` when the client closed (or broke) its side first.
async fn in_flight(
    mut call: Pin<
        &mut impl std::future::Future<Output = Result<ProxyResponse, std::convert::Infallible>>,
    >,
    io: &mut TcpStream,
    rbuf: &mut BytesMut,
) -> Option<ProxyResponse> {
    std::future::poll_fn(|cx| {
        if let Poll::Ready(r) = call.as_mut().poll(cx) {
            return Poll::Ready(match r {
                Ok(resp) => Some(resp),
                Err(never) => match never {},
            });
        }
        // As hyper did: watch for the client's EOF while nothing is buffered. tokio cleared
        // the socket's readiness on the head's short read, so this costs no system call
        // until the client sends or closes.
        if rbuf.is_empty() {
            make_room(rbuf);
            if let Poll::Ready(Ok(0) | Err(_)) = pin!(io.read_buf(rbuf)).poll(cx) {
                return Poll::Ready(None);
            }
        }
        Poll::Pending
    })
    .await
}

/// Writes the response; `Ok(true)` when the connection can serve another request.
async fn write_response(
    io: &mut TcpStream,
    wbuf: &mut Vec<u8>,
    resp: ProxyResponse,
    head_request: bool,
    close: bool,
) -> io::Result<bool> {
    let (parts, body) = resp.into_parts();
    wbuf.clear();
    let reason = parts
        .extensions
        .get::<ReasonPhrase>()
        .map(ReasonPhrase::as_bytes);
    let shape = BodyShape {
        end: body.is_end_stream(),
        exact: body.size_hint().exact(),
    };
    let request = RequestShape {
        head: head_request,
        http10: false,
    };
    let (framing, asked_close) = encode::response_head(&parts, reason, shape, request, close, wbuf);
    let mut reusable = !asked_close;
    if framing == Framing::Length(0) {
        drop(body);
        io.write_all(wbuf).await?;
        return Ok(reusable);
    }
    let mut body = pin!(body);
    let mut remaining = match framing {
        Framing::Length(n) => n,
        _ => u64::MAX,
    };
    loop {
        // Poll once; when the body is not ready, what is gathered goes out before waiting.
        let polled = std::future::poll_fn(|cx| Poll::Ready(body.as_mut().poll_frame(cx))).await;
        let frame = match polled {
            Poll::Ready(f) => f,
            Poll::Pending => {
                if !wbuf.is_empty() {
                    io.write_all(wbuf).await?;
                    wbuf.clear();
                }
                std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await
            }
        };
        match frame {
            None => break,
            Some(Err(e)) => {
                // Cut short: the client must not take it for whole.
                tracing::debug!(error = %e, "response body failed");
                if !wbuf.is_empty() {
                    io.write_all(wbuf).await?;
                }
                return Ok(false);
            }
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else {
                    continue; // trailers: dropped (see the module doc)
                };
                if data.is_empty() {
                    continue;
                }
                match framing {
                    Framing::Chunked => {
                        encode::chunk_size(data.len(), wbuf);
                        wbuf.extend_from_slice(&data);
                        wbuf.extend_from_slice(b"\r\n");
                    }
                    _ => {
                        let n = usize::try_from(remaining).unwrap_or(usize::MAX);
                        if data.len() > n {
                            // More than the length said: send what it said, then close.
                            wbuf.extend_from_slice(&data[..n]);
                            remaining = 0;
                            reusable = false;
                        } else {
                            wbuf.extend_from_slice(&data);
                            remaining -= data.len() as u64;
                        }
                    }
                }
                if wbuf.len() >= WRITE_HIGH {
                    io.write_all(wbuf).await?;
                    wbuf.clear();
                }
            }
        }
    }
    match framing {
        Framing::Chunked => wbuf.extend_from_slice(encode::LAST_CHUNK),
        Framing::Close => reusable = false,
        // Shorter than its length: the connection ends the message.
        _ if remaining != 0 => reusable = false,
        _ => {}
    }
    if !wbuf.is_empty() {
        io.write_all(wbuf).await?;
    }
    Ok(reusable)
}

/// A connection whose first bytes were already read: they are read again first.
struct Prefixed {
    prefix: Bytes,
    io: TcpStream,
}

impl AsyncRead for Prefixed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &str) -> Parsed {
        parse_request(&mut BytesMut::from(raw))
    }

    #[test]
    fn a_bodiless_http11_request_is_served_here() {
        let mut buf = BytesMut::from(
            "GET /a?b=1 HTTP/1.1\r\nHost: x.test\r\nX-A: 1\r\nx-a: 2\r\n\r\nGET /next",
        );
        let Parsed::Serve(req, shape) = parse_request(&mut buf) else {
            panic!("not served");
        };
        assert_eq!(req.uri().path_and_query().unwrap().as_str(), "/a?b=1");
        assert_eq!(req.headers()["host"], "x.test");
        let xa: Vec<_> = req.headers().get_all("x-a").iter().collect();
        assert_eq!(xa, ["1", "2"]);
        assert!(!shape.head && !shape.close);
        // The pipelined rest stays.
        assert_eq!(&buf[..], b"GET /next");
        assert!(matches!(parse_request(&mut buf), Parsed::Partial));
    }

    #[test]
    fn close_and_head_are_noted() {
        let Parsed::Serve(req, shape) = parse("HEAD / HTTP/1.1\r\nConnection: Close\r\n\r\n")
        else {
            panic!("not served");
        };
        assert_eq!(req.method(), Method::HEAD);
        assert!(shape.head && shape.close);
        assert!(matches!(
            parse("GET / HTTP/1.1\r\nContent-Length: 0\r\n\r\n"),
            Parsed::Serve(..)
        ));
        // A `Connection` list is served here; the service removes the fields it names.
        assert!(matches!(
            parse("GET / HTTP/1.1\r\nConnection: keep-alive, x-hop\r\n\r\n"),
            Parsed::Serve(..)
        ));
    }

    #[test]
    fn everything_else_goes_to_hyper_with_its_bytes() {
        for raw in [
            "GET / HTTP/1.0\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            "GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
            "PUT / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
            "GET / HTTP/1.1\r\nTE: trailers\r\n\r\n",
            "CONNECT a.test:443 HTTP/1.1\r\n\r\n",
            "OPTIONS * HTTP/1.1\r\n\r\n",
            "GET http://a.test/ HTTP/1.1\r\n\r\n",
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            "GET / HTTP/1.1\r\nBad Header: x\r\n\r\n",
        ] {
            let mut buf = BytesMut::from(raw);
            assert!(matches!(parse_request(&mut buf), Parsed::Hyper), "{raw}");
            assert_eq!(&buf[..], raw.as_bytes(), "{raw}: bytes kept for hyper");
        }
        let many = format!(
            "GET / HTTP/1.1\r\n{}\r\n",
            "a: b\r\n".repeat(tollgate_h1::MAX_HEADERS + 1)
        );
        assert!(matches!(parse(&many), Parsed::Hyper));
        assert!(matches!(
            parse("GET / HTTP/1.1\r\nHost: a"),
            Parsed::Partial
        ));
    }
}
