//! Body types on both sides of the proxy. In: hyper's streaming bodies. Out: a boxed
//! [`ProxyBody`] for everything the proxy sends, a byte-limited request body
//! ([`LimitedBody`]) and a response body ([`TrackedBody`]) that reports how many bytes went
//! out once the response is finished, so the access log and metrics see the whole exchange.

use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};

/// Boxed error of proxy bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

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

/// A request body as the client sends it: hyper's, or none (a request head our own HTTP/1
/// server read, module `h1serve`, which serves only bodiless requests itself).
#[derive(Debug)]
pub(crate) enum ClientBody {
    Hyper(Incoming),
    Empty,
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            Self::Hyper(b) => Pin::new(b).poll_frame(cx),
            Self::Empty => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Hyper(b) => b.is_end_stream(),
            Self::Empty => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Hyper(b) => b.size_hint(),
            Self::Empty => SizeHint::with_exact(0),
        }
    }
}

/// The request body exceeded the configured limit.
#[derive(Debug, thiserror::Error)]
#[error("request body exceeds the limit")]
pub(crate) struct BodyTooLarge;

/// The client sent no request body bytes for the idle timeout.
#[derive(Debug, thiserror::Error)]
#[error("request body idle for too long")]
pub(crate) struct BodyIdle;

/// What went wrong with a request body, for the answer (413, 408 or 400); set by
/// [`LimitedBody`].
#[derive(Debug, Default)]
pub(crate) struct BodyFault(AtomicU8);

impl BodyFault {
    const TOO_LARGE: u8 = 1;
    const IDLE: u8 = 2;
    const CLIENT: u8 = 3;

    /// The body went past the size limit.
    pub fn too_large(&self) -> bool {
        self.0.load(Ordering::Acquire) == Self::TOO_LARGE
    }

    /// The client stopped sending the body.
    pub fn idle(&self) -> bool {
        self.0.load(Ordering::Acquire) == Self::IDLE
    }

    /// The body broke its framing (a bad chunk, trailers), or the client left mid-body.
    pub fn client(&self) -> bool {
        self.0.load(Ordering::Acquire) == Self::CLIENT
    }
}

/// A request body that fails past `remaining` bytes, or when the client sends nothing for
/// `idle_timeout` (if any) while more is due, and records which in `fault`.
#[derive(Debug)]
pub(crate) struct LimitedBody {
    inner: ClientBody,
    remaining: u64,
    fault: Arc<BodyFault>,
    idle_timeout: Option<Duration>,
    /// Armed the first time the client keeps us waiting; pushed back by every frame.
    idle: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl LimitedBody {
    /// Wraps `inner`.
    pub fn new(
        inner: ClientBody,
        limit: u64,
        idle_timeout: Option<Duration>,
        fault: Arc<BodyFault>,
    ) -> Self {
        Self {
            inner,
            remaining: limit,
            fault,
            idle_timeout,
            idle: None,
        }
    }
}

impl Body for LimitedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            // Request trailers are dropped: a field the client adds after the body
            // (`X-User: root` in a chunked trailer) would escape every check made on the head.
            Poll::Ready(Some(Ok(frame))) if frame.is_trailers() => Poll::Ready(None),
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let len = data.len() as u64;
                    if len > self.remaining {
                        self.fault.0.store(BodyFault::TOO_LARGE, Ordering::Release);
                        return Poll::Ready(Some(Err(Box::new(BodyTooLarge))));
                    }
                    self.remaining -= len;
                }
                if let (Some(timeout), Some(idle)) = (self.idle_timeout, self.idle.as_mut()) {
                    idle.as_mut().reset(tokio::time::Instant::now() + timeout);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                // The client's fault, not the upstream's: 400, even once the upstream
                // request has begun (it is cut off).
                self.fault.0.store(BodyFault::CLIENT, Ordering::Release);
                Poll::Ready(Some(Err(Box::new(e))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                let Some(timeout) = self.idle_timeout else {
                    return Poll::Pending;
                };
                let idle = self
                    .idle
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                if idle.as_mut().poll(cx).is_ready() {
                    self.fault.0.store(BodyFault::IDLE, Ordering::Release);
                    return Poll::Ready(Some(Err(Box::new(BodyIdle))));
                }
                Poll::Pending
            }
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
