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
//! What it reads (RFC 9112): a status line and up to `tollgate_h1::MAX_HEADERS` fields in at most
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

use bytes::{Bytes, BytesMut};
use http::request::Parts;
use http::{Method, Response, StatusCode};
use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::body::BoxError;
use tollgate_h1::body::{Decoder, Framing, Step};
use tollgate_h1::response::{ResponseHead, body_plan, parse_response};

use crate::forward::Added;
use crate::pool::EndpointPool;

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
        let target = req.uri.path_and_query().map_or("/", |p| p.as_str());
        let fields = req.headers.iter().chain(added.fields());
        tollgate_h1::encode::request_head(
            &req.method,
            target,
            fields,
            Framing::Length(0),
            &mut self.wbuf,
        );
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
        head: ResponseHead,
        head_request: bool,
        pool: &Arc<EndpointPool>,
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
        let body = RawBody::new(self, state, keep.then(|| pool.clone()), !seen.hop);
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
    io: &mut TcpStream,
    buf: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Poll<io::Result<usize>> {
    buf.reserve(READ_CHUNK);
    pin!(io.read_buf(buf)).poll(cx)
}

/// An answer's body, read off the connection; gives the connection back to its pool when it
/// has been read to the end (a body dropped early closes the connection).
#[derive(Debug)]
pub(crate) struct RawBody {
    conn: Option<Conn>,
    state: Decoder,
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

    fn new(conn: Conn, state: Decoder, back: Option<Arc<EndpointPool>>, clean_head: bool) -> Self {
        let mut this = Self {
            conn: Some(conn),
            state,
            back,
            clean_head,
        };
        if this.state.is_done() {
            this.finish();
        }
        this
    }

    /// The body has ended: the connection goes back, if it may.
    fn finish(&mut self) {
        self.state = Decoder::Done;
        if let (Some(conn), Some(pool)) = (self.conn.take(), self.back.take())
            && conn.rbuf.is_empty()
        {
            pool.push_raw(conn);
        }
    }

    fn fail(&mut self, e: H1Error) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.state = Decoder::Done;
        self.conn = None;
        self.back = None;
        Poll::Ready(Some(Err(Box::new(e))))
    }
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
            match this.state.decode(&mut conn.rbuf) {
                Err(e) => return this.fail(e.into()),
                Ok(Step::Frame(f)) => {
                    if this.state.is_done() {
                        this.finish();
                    }
                    return Poll::Ready(Some(Ok(f)));
                }
                Ok(Step::End) => {
                    this.finish();
                    return Poll::Ready(None);
                }
                Ok(Step::More) => match ready!(poll_fill(&mut conn.io, &mut conn.rbuf, cx)) {
                    Ok(0) if matches!(this.state, Decoder::Close) => {
                        this.state = Decoder::Done;
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
        matches!(self.state, Decoder::Done)
    }

    fn size_hint(&self) -> SizeHint {
        self.state
            .remaining()
            .map_or_else(SizeHint::default, SizeHint::with_exact)
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

    use http::HeaderMap;
    use http::header::CONTENT_LENGTH;

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
                        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                            match s.read_buf(&mut got).await {
                                Ok(0) | Err(_) => return,
                                Ok(_) => {}
                            }
                        }
                        let end = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
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
}
