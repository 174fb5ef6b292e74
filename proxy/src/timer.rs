//! One connection's timer for hyper's HTTP/1 header read timeout. In: the deadlines hyper
//! asks for, one per request head. Out: sleeps that finish at those deadlines.
//!
//! Why not hyper-util's `TokioTimer`: hyper asks for a fresh sleep each time it starts reading
//! a request head and drops it once the head is in, so with `TokioTimer` every request on a
//! keep-alive connection inserted an entry into tokio's timer wheel and removed it again
//! (~600 instructions per request, callgrind). Here each connection keeps one tokio sleep,
//! armed for the earliest deadline it was asked for; the deadlines of later heads only
//! re-arm it when it fires before them, at most once per timeout period. A sleep still
//! finishes exactly at its own deadline.
//!
//! This relies on how hyper's HTTP/1 server uses its timer: at most one sleep (the current
//! head's) is awaited at a time, always from the connection's task. The shared tokio sleep
//! keeps one waker, so two sleeps awaited at once from different tasks would not both be
//! woken; hyper never does that. A sleep dropped before its deadline leaves the tokio entry
//! armed: the connection's task is woken once, at that deadline, for nothing.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::rt::{Sleep, Timer};

/// The connection's one tokio sleep, created on first use.
type Armed = Arc<Mutex<Option<Pin<Box<tokio::time::Sleep>>>>>;

/// A [`Timer`] for one connection (see the module doc); clones share the sleep.
#[derive(Clone, Debug, Default)]
pub(crate) struct ConnTimer {
    armed: Armed,
}

impl ConnTimer {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Timer for ConnTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Sleep>> {
        self.sleep_until(self.now() + duration)
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn Sleep>> {
        Box::pin(ConnSleep {
            deadline: deadline.into(),
            armed: self.armed.clone(),
        })
    }

    fn now(&self) -> Instant {
        // tokio's clock, so paused-time tests see the same time as the sleeps.
        tokio::time::Instant::now().into_std()
    }
}

/// A sleep until `deadline` on the connection's shared tokio sleep.
struct ConnSleep {
    deadline: tokio::time::Instant,
    armed: Armed,
}

impl Future for ConnSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let deadline = self.deadline;
        let mut armed = self.armed.lock().unwrap_or_else(PoisonError::into_inner);
        let sleep = armed.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        // Armed for a later deadline (a sleep asked for out of order): this one comes first.
        if sleep.deadline() > deadline {
            sleep.as_mut().reset(deadline);
        }
        loop {
            match sleep.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(()) if sleep.deadline() >= deadline => return Poll::Ready(()),
                // Fired for an earlier head's deadline: wait on for this one.
                Poll::Ready(()) => sleep.as_mut().reset(deadline),
            }
        }
    }
}

impl Sleep for ConnSleep {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Polls `sleep` once; true when it is still pending.
    async fn pending(sleep: &mut Pin<Box<dyn Sleep>>) -> bool {
        std::future::poll_fn(|cx| Poll::Ready(sleep.as_mut().poll(cx).is_pending())).await
    }

    #[tokio::test(start_paused = true)]
    async fn a_sleep_finishes_at_its_deadline() {
        let timer = ConnTimer::new();
        let start = tokio::time::Instant::now();
        timer.sleep(Duration::from_secs(30)).await;
        assert_eq!(start.elapsed(), Duration::from_secs(30));
    }

    #[tokio::test(start_paused = true)]
    async fn a_later_deadline_waits_past_an_earlier_dropped_one() {
        let timer = ConnTimer::new();
        let start = tokio::time::Instant::now();
        // The first head arrived in time: its sleep was polled (armed) and dropped.
        let mut first = timer.sleep(Duration::from_secs(30));
        assert!(pending(&mut first).await);
        drop(first);
        tokio::time::advance(Duration::from_secs(10)).await;
        timer.sleep(Duration::from_secs(30)).await;
        assert_eq!(start.elapsed(), Duration::from_secs(40));
    }

    #[tokio::test(start_paused = true)]
    async fn an_earlier_deadline_is_not_held_up_by_a_later_one() {
        let timer = ConnTimer::new();
        let start = tokio::time::Instant::now();
        let mut later = timer.sleep(Duration::from_secs(60));
        assert!(pending(&mut later).await);
        timer.sleep(Duration::from_secs(5)).await;
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        later.await;
        assert_eq!(start.elapsed(), Duration::from_secs(60));
    }
}
