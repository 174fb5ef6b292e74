//! Request bodies on our HTTP/1 server. In: the body bytes a client sends after a head
//! (`Content-Length` or chunks), read off the connection by its own task. Out: a
//! [`RequestBody`] the service streams (as `ClientBody::H1`), one frame at a time.
//!
//! Why a hand-over and not the socket itself: the connection's task keeps the socket (it
//! writes the answer, which may start before the body ends), and the body may be polled on
//! another task (the upstream connection's). The two meet in a [`Pipe`] holding at most one
//! frame: the connection reads from the socket only while the body waits for a frame and
//! none is held, so it reads ahead by at most one read ([`BODY_READ`]) — the backpressure.
//!
//! `Expect: 100-continue`: the interim answer goes out when the body is first waited on
//! and the final answer has not begun (after it, no 100; the body is still read if it
//! comes). Request trailers are handed on as a trailers frame; `body::LimitedBody` drops
//! them unless the route forwards them.
//! Only requests with a body pay for any of this: a bodiless one gets `ClientBody::Empty`.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite};
use tollgate_h1::body::{Decoder, Framing, Step};

/// The interim answer to `Expect: 100-continue`.
const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";
/// Least room for one read of body bytes: the most read ahead of what the body took.
const BODY_READ: usize = 32 * 1024;

/// Why a request body failed.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum BodyError {
    /// The body broke its framing (a bad chunk): the connection cannot go on.
    #[error("request body: {0}")]
    Framing(#[from] tollgate_h1::Error),
    /// The client closed (or broke) the connection mid-body.
    #[error("the client left mid-body")]
    ClientLeft,
}

/// What the connection and the body share.
#[derive(Debug, Default)]
struct State {
    /// A frame read and not yet taken.
    frame: Option<Result<Frame<Bytes>, BodyError>>,
    /// Nothing comes after `frame`.
    end: bool,
    /// The body waits for a frame.
    wanted: bool,
    /// The body is gone (nobody reads the rest).
    dropped: bool,
    body_waker: Option<Waker>,
    conn_waker: Option<Waker>,
}

/// The hand-over between the connection and the body (see the module doc).
#[derive(Debug, Default)]
struct Pipe(Mutex<State>);

impl Pipe {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the state half-written (plain
        // assignments): the state is used as it is.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn register(slot: &mut Option<Waker>, cx: &Context<'_>) {
    if !slot.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
        *slot = Some(cx.waker().clone());
    }
}

/// A request body as the service sees it: the frames the connection reads for it.
#[derive(Debug)]
pub(crate) struct RequestBody {
    pipe: Arc<Pipe>,
    /// Bytes still to come of a `Content-Length` body; `None` for chunks.
    remaining: Option<u64>,
    ended: bool,
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        let pipe = self.pipe.clone();
        let mut st = pipe.lock();
        if let Some(frame) = st.frame.take() {
            let end = st.end;
            if !end && let Some(w) = st.conn_waker.take() {
                w.wake();
            }
            drop(st);
            self.ended = end;
            if let (Some(data), Some(n)) = (
                frame.as_ref().ok().and_then(Frame::data_ref),
                self.remaining.as_mut(),
            ) {
                *n = n.saturating_sub(data.len() as u64);
            }
            return Poll::Ready(Some(frame));
        }
        if st.end {
            drop(st);
            self.ended = true;
            return Poll::Ready(None);
        }
        register(&mut st.body_waker, cx);
        if !st.wanted {
            st.wanted = true;
            if let Some(w) = st.conn_waker.take() {
                w.wake();
            }
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.remaining == Some(0)
    }

    fn size_hint(&self) -> SizeHint {
        match self.remaining {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        let mut st = self.pipe.lock();
        st.dropped = true;
        if let Some(w) = st.conn_waker.take() {
            w.wake();
        }
    }
}

/// The connection's side of one request body: reads it off the socket for the
/// [`RequestBody`].
#[derive(Debug)]
pub(crate) struct Reader {
    pipe: Arc<Pipe>,
    decoder: Decoder,
    /// Bytes of the `100 Continue` still to write; `None` when none is due.
    expect: Option<usize>,
    /// The body broke its framing or the client left: the connection cannot go on.
    failed: bool,
}

impl Reader {
    /// A reader for a body framed so, and the body the service gets; `expect` when the
    /// client waits for `100 Continue`.
    pub(crate) fn new(framing: Framing, expect: bool) -> (Self, RequestBody) {
        let pipe = Arc::new(Pipe::default());
        let remaining = match framing {
            Framing::Length(n) => Some(n),
            _ => None,
        };
        let body = RequestBody {
            pipe: pipe.clone(),
            remaining,
            ended: false,
        };
        let reader = Self {
            pipe,
            decoder: Decoder::new(framing),
            expect: expect.then_some(0),
            failed: false,
        };
        (reader, body)
    }

    /// The body was read to its end: the connection may read the next head.
    pub(crate) fn is_done(&self) -> bool {
        !self.failed && self.decoder.is_done()
    }

    /// Whether the connection must close after the answer for this body: when it broke,
    /// or is left unread. A body nobody holds any more is first drained of what is
    /// buffered (nothing more is read). Before the answer (`answered` false), a body still
    /// held may yet be read, unless its client still waits for `100 Continue`, which no
    /// longer comes; after it, an unfinished body closes the connection.
    pub(crate) fn must_close(&mut self, rbuf: &mut BytesMut, answered: bool) -> bool {
        if self.is_done() {
            return false;
        }
        if self.failed {
            return true;
        }
        if self.pipe.lock().dropped {
            self.drain_buffered(rbuf);
            return !self.is_done();
        }
        answered || self.expect.is_some()
    }

    /// Moves body bytes from `io` to the body while it waits for them (see the module doc).
    /// `answered`: the final answer's head is out, so no `100 Continue` any more. Registers
    /// the task's waker for the body's next wish; never completes on its own.
    pub(crate) fn drive<I>(
        &mut self,
        cx: &mut Context<'_>,
        io: &mut I,
        rbuf: &mut BytesMut,
        answered: bool,
    ) where
        I: AsyncRead + AsyncWrite + Unpin,
    {
        if self.failed || self.decoder.is_done() {
            return;
        }
        {
            let mut st = self.pipe.lock();
            register(&mut st.conn_waker, cx);
            if st.dropped || !st.wanted || st.frame.is_some() {
                return;
            }
        }
        if let Some(sent) = self.expect {
            if answered {
                self.expect = None;
            } else {
                match Pin::new(&mut *io).poll_write(cx, &CONTINUE[sent..]) {
                    Poll::Ready(Ok(n)) if sent + n >= CONTINUE.len() => self.expect = None,
                    Poll::Ready(Ok(n)) if n > 0 => {
                        self.expect = Some(sent + n);
                        // More to write: polled again at once.
                        cx.waker().wake_by_ref();
                        return;
                    }
                    Poll::Ready(_) => return self.fail(BodyError::ClientLeft),
                    Poll::Pending => return,
                }
            }
        }
        while !self.take_buffered(rbuf) {
            if rbuf.capacity() - rbuf.len() < BODY_READ / 4 {
                rbuf.reserve(BODY_READ);
            }
            let mut read = std::pin::pin!(tokio::io::AsyncReadExt::read_buf(io, rbuf));
            match std::future::Future::poll(read.as_mut(), cx) {
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => {
                    return self.fail(BodyError::ClientLeft);
                }
                Poll::Ready(Ok(_)) => {}
                Poll::Pending => return,
            }
        }
    }

    /// Hands the body the first frame of what `rbuf` already holds (the bytes that came
    /// with the head), so its first poll needs no round trip through the connection.
    pub(crate) fn prime(&mut self, rbuf: &mut BytesMut) {
        if !rbuf.is_empty() && self.take_buffered(rbuf) {
            // The client sends without waiting for `100 Continue`: none is due.
            self.expect = None;
        }
    }

    /// Decodes what `rbuf` holds into one frame (or the end, or a failure) for the body;
    /// false when it needs more bytes.
    fn take_buffered(&mut self, rbuf: &mut BytesMut) -> bool {
        loop {
            match self.decoder.decode(rbuf) {
                Ok(Step::Frame(frame)) => {
                    let wanted =
                        frame.is_trailers() || frame.data_ref().is_some_and(|d| !d.is_empty());
                    if wanted {
                        let end = self.decoder.is_done();
                        self.deliver(Some(Ok(frame)), end);
                        return true;
                    }
                    // Empty data: on to what follows.
                    if self.decoder.is_done() {
                        self.deliver(None, true);
                        return true;
                    }
                }
                Ok(Step::End) => {
                    self.deliver(None, true);
                    return true;
                }
                Ok(Step::More) => return false,
                Err(e) => {
                    self.fail(BodyError::Framing(e));
                    return true;
                }
            }
        }
    }

    /// After the answer: takes what is already buffered of a body nobody read, so the
    /// connection may go on when it ends there. Reads nothing more.
    pub(crate) fn drain_buffered(&mut self, rbuf: &mut BytesMut) {
        while !self.failed && !self.decoder.is_done() {
            match self.decoder.decode(rbuf) {
                Ok(Step::Frame(_)) => {}
                Ok(Step::End) | Ok(Step::More) => return,
                Err(_) => self.failed = true,
            }
        }
    }

    fn deliver(&mut self, frame: Option<Result<Frame<Bytes>, BodyError>>, end: bool) {
        let mut st = self.pipe.lock();
        st.frame = frame;
        st.end = end;
        st.wanted = false;
        if let Some(w) = st.body_waker.take() {
            w.wake();
        }
    }

    fn fail(&mut self, e: BodyError) {
        tracing::debug!(error = %e, "request body failed");
        self.failed = true;
        self.deliver(Some(Err(e)), true);
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        // The connection is gone with the body unfinished: whoever still reads it learns so.
        if !self.failed && !self.decoder.is_done() {
            self.failed = true;
            self.deliver(Some(Err(BodyError::ClientLeft)), true);
        }
    }
}
