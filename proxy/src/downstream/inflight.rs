//! The requests in flight on one client connection served by hyper (module `listener`).
//! In: each request as it enters ([`InFlight::enter`]) and its response body, which carries
//! the [`Held`] it got until hyper drops it. Out: whether, and since when, the connection has
//! had nothing in flight ([`InFlight::idle_since`], for the idle timeout), and a cap on the
//! HTTP/2 requests forwarded at once (so on the upstream connections one client connection
//! can hold): past it a request waits for one to finish.
//!
//! Why on the response body: an HTTP/2 stream, and the upstream connection behind it, lives
//! until its answer is sent, which is when hyper drops the body.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// One connection's requests in flight.
#[derive(Debug)]
pub(crate) struct InFlight {
    open: AtomicUsize,
    /// When `open` last fell to zero, in nanoseconds since `born`.
    idle_since: AtomicU64,
    born: Instant,
    /// Forwarding slots of HTTP/2 requests.
    slots: Semaphore,
}

impl InFlight {
    /// A connection opened now, idle, allowing `max_forwarded` HTTP/2 requests at once.
    pub fn new(max_forwarded: usize) -> Arc<Self> {
        Arc::new(Self {
            open: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            born: Instant::now(),
            slots: Semaphore::new(max_forwarded.clamp(1, Semaphore::MAX_PERMITS)),
        })
    }

    /// A request enters; an HTTP/2 one (`capped`) first waits for a forwarding slot. Held
    /// until the returned [`Held`] drops.
    pub async fn enter(self: &Arc<Self>, capped: bool) -> Held {
        self.open.fetch_add(1, Ordering::AcqRel);
        let mut held = Held {
            inflight: self.clone(),
            slot: false,
        };
        if capped && let Ok(permit) = self.slots.acquire().await {
            // Given back by `Held`'s drop: a permit cannot outlive its borrow of `slots`.
            permit.forget();
            held.slot = true;
        }
        held
    }

    /// Since when nothing has been in flight; `None` while something is.
    pub fn idle_since(&self) -> Option<Instant> {
        if self.open.load(Ordering::Acquire) > 0 {
            return None;
        }
        let nanos = self.idle_since.load(Ordering::Acquire);
        Some(self.born + std::time::Duration::from_nanos(nanos))
    }

    fn leave(&self) {
        if self.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            let nanos = u64::try_from(self.born.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.idle_since.store(nanos, Ordering::Release);
        }
    }
}

/// A request's place in [`InFlight`], given back when dropped.
#[derive(Debug)]
pub(crate) struct Held {
    inflight: Arc<InFlight>,
    slot: bool,
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.slot {
            self.inflight.slots.add_permits(1);
        }
        self.inflight.leave();
    }
}

/// A response body that keeps its request's [`Held`] until hyper drops it.
#[derive(Debug)]
pub(crate) struct HeldBody<B> {
    inner: B,
    _held: Held,
}

impl<B> HeldBody<B> {
    pub fn new(inner: B, held: Held) -> Self {
        Self { inner, _held: held }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for HeldBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn idle_only_with_nothing_in_flight_and_since_the_last_left() {
        let f = InFlight::new(2);
        let born = Instant::now();
        assert_eq!(f.idle_since(), Some(born));
        let a = f.enter(false).await;
        tokio::time::advance(std::time::Duration::from_secs(3)).await;
        let b = f.enter(true).await;
        drop(a);
        assert_eq!(f.idle_since(), None);
        tokio::time::advance(std::time::Duration::from_secs(2)).await;
        drop(b);
        assert_eq!(
            f.idle_since(),
            Some(born + std::time::Duration::from_secs(5))
        );
    }

    #[tokio::test]
    async fn past_the_cap_an_http2_request_waits_for_a_slot() {
        let f = InFlight::new(1);
        let first = f.enter(true).await;
        // HTTP/1 requests take no slot.
        let _h1 = f.enter(false).await;
        let mut second = Box::pin(f.enter(true));
        let waited = tokio::time::timeout(std::time::Duration::from_millis(50), second.as_mut());
        assert!(
            waited.await.is_err(),
            "a second HTTP/2 request went past a cap of 1"
        );
        drop(first);
        let _second = second.await;
        assert_eq!(f.open.load(Ordering::Acquire), 2);
    }
}
