//! The answer's body, read off the upstream connection. In: the connection (its read buffer
//! holding whatever came past the head) and the body's [`Decoder`]. Out: hyper body frames;
//! the connection goes back to its pool once the body was read exactly to its end.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tollgate_h1::body::{Decoder, Step};

use super::{Conn, H1Error, Reuse, poll_fill};
use crate::lifecycle::body::BoxError;

/// An answer's body, read off the connection; gives the connection back to its pool when it
/// has been read to the end (a body dropped early closes the connection).
#[derive(Debug)]
pub(crate) struct RawBody {
    conn: Option<Conn>,
    state: Decoder,
    /// The pool to go back to; `None` when the connection may not be reused.
    back: Option<Arc<dyn Reuse>>,
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

    pub(super) fn new(
        conn: Conn,
        state: Decoder,
        back: Option<Arc<dyn Reuse>>,
        clean_head: bool,
    ) -> Self {
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

    /// The empty body of an answer whose connection was handed over (an upgrade, a
    /// tunnel): nothing to read, nothing to give back, and its head is left for the service
    /// to strip.
    pub(super) fn handed_over() -> Self {
        Self {
            conn: None,
            state: Decoder::Done,
            back: None,
            clean_head: false,
        }
    }

    /// The body has ended: the connection goes back, if it may.
    fn finish(&mut self) {
        self.state = Decoder::Done;
        if let (Some(conn), Some(pool)) = (self.conn.take(), self.back.take())
            && conn.rbuf.is_empty()
        {
            pool.reuse(conn);
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
