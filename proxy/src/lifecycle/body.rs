//! Body types on both sides of the proxy. In: the clients' streaming bodies (hyper's for
//! HTTP/2, module `h1serve`'s for HTTP/1). Out: a boxed
//! [`ProxyBody`] for everything the proxy sends, a request body bounded in size and in pace
//! ([`LimitedBody`]; the pace is module `pace`'s) and a response body ([`TrackedBody`]) that
//! reports how many bytes went out once the response is finished, so the access log and
//! metrics see the whole exchange.

use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Body, Frame, SizeHint};

use crate::downstream::pace::{BodyPace, Cut, Pacer};
use crate::lifecycle::forward::TrailerFilter;
use crate::metrics::Metrics;

pub use crate::error::BoxError;

/// Body of every request and response the proxy sends.
pub type ProxyBody = BoxBody<Bytes, BoxError>;

/// A complete body.
pub(crate) fn full(b: impl Into<Bytes>) -> ProxyBody {
    Full::new(b.into()).map_err(|e| match e {}).boxed()
}

/// An empty body.
pub(crate) fn empty() -> ProxyBody {
    Empty::new().map_err(|e| match e {}).boxed()
}

/// The request body exceeded the configured limit.
#[derive(Debug, thiserror::Error)]
#[error("request body exceeds the limit")]
pub(crate) struct BodyTooLarge;

/// The client sent the request body too slowly: idle, below the minimum rate, or past the
/// total deadline (module `pace`).
#[derive(Debug, thiserror::Error)]
#[error("request body too slow ({0})")]
pub(crate) struct BodyTooSlow(&'static str);

/// What went wrong with a request body, for the answer (413, 408 or 400) and the access
/// log; set by [`LimitedBody`]. Also carries whether the upstream's answer has started (the
/// HTTP/2 total deadline ends there).
#[derive(Debug, Default)]
pub(crate) struct BodyFault(AtomicU8);

impl BodyFault {
    const TOO_LARGE: u8 = 1;
    const IDLE: u8 = 2;
    const SLOW: u8 = 3;
    const DEADLINE: u8 = 4;
    const CLIENT: u8 = 5;
    const FAULT: u8 = 0x7f;
    const ANSWERED: u8 = 0x80;

    fn fault(&self) -> u8 {
        self.0.load(Ordering::Acquire) & Self::FAULT
    }

    /// The body went past the size limit.
    pub fn too_large(&self) -> bool {
        self.fault() == Self::TOO_LARGE
    }

    /// Why the client's body was cut as too slow, if it was.
    pub fn cut(&self) -> Option<Cut> {
        match self.fault() {
            Self::IDLE => Some(Cut::Idle),
            Self::SLOW => Some(Cut::Slow),
            Self::DEADLINE => Some(Cut::Deadline),
            _ => None,
        }
    }

    /// The upstream's answer has started.
    pub fn answered(&self) {
        self.0.fetch_or(Self::ANSWERED, Ordering::AcqRel);
    }

    fn is_answered(&self) -> bool {
        self.0.load(Ordering::Acquire) & Self::ANSWERED != 0
    }

    fn set(&self, fault: u8) {
        self.0.fetch_or(fault, Ordering::AcqRel);
    }

    /// The body broke its framing (a bad chunk, trailers), or the client left mid-body.
    pub fn client(&self) -> bool {
        self.fault() == Self::CLIENT
    }
}

/// A request body that fails past `remaining` bytes, or when the client sends it too slowly
/// ([`BodyPace`]: idle, below the minimum rate, past the total deadline), and records which
/// in `fault`; a cut is counted in `tollgate_client_timeouts_total`. The failure resets the
/// upstream request (hyper's client abandons a request whose body fails).
#[derive(Debug)]
pub(crate) struct LimitedBody<B> {
    inner: B,
    remaining: u64,
    fault: Arc<BodyFault>,
    pacer: Pacer,
    metrics: Arc<Metrics>,
    /// Armed the first time the client keeps us waiting, at the pacer's deadline.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The route forwards request trailers: which fields may go; `None` drops them all.
    trailers: Option<Box<TrailerFilter>>,
}

impl<B> LimitedBody<B> {
    /// Wraps `inner`, whose pace is bounded from now on.
    pub fn new(
        inner: B,
        limit: u64,
        pace: BodyPace,
        fault: Arc<BodyFault>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            inner,
            remaining: limit,
            fault,
            pacer: Pacer::new(pace, tokio::time::Instant::now()),
            metrics,
            timer: None,
            trailers: None,
        }
    }

    /// Sends the trailer fields `filter` allows on (by default none go).
    pub fn with_trailers(mut self, filter: TrailerFilter) -> Self {
        self.trailers = Some(Box::new(filter));
        self
    }

    /// Waiting on the client: arms the timer at the pacer's deadline; the error once it is
    /// past.
    fn wait(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let answered = self.fault.is_answered();
        let (deadline, why) = self.pacer.waiting(tokio::time::Instant::now(), answered);
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if timer.deadline() != deadline {
            timer.as_mut().reset(deadline);
        }
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.fault.set(match why {
            Cut::Idle => BodyFault::IDLE,
            Cut::Slow => BodyFault::SLOW,
            Cut::Deadline => BodyFault::DEADLINE,
        });
        self.metrics.client_timeout(why.kind());
        Poll::Ready(Some(Err(Box::new(BodyTooSlow(why.as_str())))))
    }
}

impl<B> Body for LimitedBody<B>
where
    B: Body<Data = Bytes, Error = BoxError> + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            // Request trailers are dropped unless the route forwards them, and then only
            // fields the filter allows: a field the client adds after the body (`X-User: root`
            // in a chunked trailer) would escape every check made on the head.
            Poll::Ready(Some(Ok(frame))) if frame.is_trailers() => {
                let kept = match (this.trailers.as_deref(), frame.into_trailers()) {
                    (Some(filter), Ok(fields)) => filter.apply(fields),
                    _ => None,
                };
                Poll::Ready(kept.map(|t| Ok(Frame::trailers(t))))
            }
            Poll::Ready(Some(Ok(frame))) => {
                let len = frame.data_ref().map_or(0, |d| d.len() as u64);
                if len > this.remaining {
                    this.fault.set(BodyFault::TOO_LARGE);
                    return Poll::Ready(Some(Err(Box::new(BodyTooLarge))));
                }
                this.remaining -= len;
                this.pacer.received(len, tokio::time::Instant::now);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                // The client's fault, not the upstream's: 400, even once the upstream
                // request has begun (it is cut off); 413 for a message that declared more
                // than the limit (module `grpc_web`) before its bytes came.
                this.fault.set(if e.is::<BodyTooLarge>() {
                    BodyFault::TOO_LARGE
                } else {
                    BodyFault::CLIENT
                });
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => this.wait(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Called once when a response body ends (or is dropped), with the bytes sent.
pub(crate) trait OnComplete: Send + Unpin + 'static {
    /// Reports the bytes sent.
    fn complete(self, bytes: u64);

    /// Sees the body's trailers as they pass (before [`OnComplete::complete`]).
    fn trailers(&mut self, _trailers: &HeaderMap) {}
}

/// A response body that counts bytes and reports them once.
pub struct TrackedBody<C: OnComplete> {
    inner: ProxyBody,
    bytes: u64,
    done: Option<C>,
}

impl<C: OnComplete> std::fmt::Debug for TrackedBody<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrackedBody")
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

impl<C: OnComplete> TrackedBody<C> {
    /// Wraps `inner`; `done` runs when it ends or is dropped.
    pub(crate) fn new(inner: ProxyBody, done: C) -> Self {
        let mut this = Self {
            inner,
            bytes: 0,
            done: Some(done),
        };
        // Bodiless responses (redirects, errors, HEAD) never get polled by hyper.
        if this.inner.is_end_stream() {
            this.finish();
        }
        this
    }

    fn finish(&mut self) {
        if let Some(done) = self.done.take() {
            done.complete(self.bytes);
        }
    }
}

impl<C: OnComplete> Body for TrackedBody<C> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref() {
                    this.bytes += d.len() as u64;
                } else if let Some(t) = frame.trailers_ref()
                    && let Some(done) = this.done.as_mut()
                {
                    done.trailers(t);
                }
                if this.inner.is_end_stream() {
                    this.finish();
                }
            }
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => this.finish(),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<C: OnComplete> Drop for TrackedBody<C> {
    fn drop(&mut self) {
        self.finish();
    }
}
