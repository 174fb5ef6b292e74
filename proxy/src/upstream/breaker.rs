//! The circuit breaker of a backend (BackendPolicy `circuitBreaker`), per proxy. In: each
//! request about to be sent to the backend, and each retry about to be made. Out: an
//! [`Admission`] held until the answer ends, or the limit that refused it (503 at once,
//! counted in `tollgate_circuit_breaker_rejections_total{limit}`).
//!
//! `maxRequests` bounds requests at once (waiting or in flight); `maxConnections` bounds
//! exchanges at once (each HTTP/1.1 exchange holds a connection), and up to
//! `maxPendingRequests` more wait for one; `maxRetries` bounds retries at once. A breaker is
//! carried from one snapshot to the next while its limits stay the same, so requests in
//! flight across a table swap keep counting.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tollgate_api::backend::CircuitBreaker;

/// Which limit refused a request (the `limit` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limit {
    Requests,
    Pending,
    Retries,
}

impl Limit {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Requests => "max_requests",
            Self::Pending => "max_pending_requests",
            Self::Retries => "max_retries",
        }
    }
}

/// The counters of one backend's limits.
#[derive(Debug)]
pub(crate) struct Breaker {
    pub limits: CircuitBreaker,
    requests: AtomicU32,
    waiting: AtomicU32,
    retries: AtomicU32,
    exchanges: Option<Arc<Semaphore>>,
}

/// One request's place under the limits; given back when dropped.
#[derive(Debug)]
pub(crate) struct Admission {
    breaker: Arc<Breaker>,
    _exchange: Option<OwnedSemaphorePermit>,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.breaker.requests.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One retry's place under `maxRetries`.
#[derive(Debug)]
pub(crate) struct RetrySlot(Arc<Breaker>);

impl Drop for RetrySlot {
    fn drop(&mut self) {
        self.0.retries.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counts a waiting request while it waits.
struct Waiting<'a>(&'a AtomicU32);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Breaker {
    /// A breaker for `limits`; `None` when no limit is set (no counting at all then).
    pub fn new(limits: &CircuitBreaker) -> Option<Arc<Self>> {
        if limits.is_empty() {
            return None;
        }
        Some(Arc::new(Self {
            limits: limits.clone(),
            requests: AtomicU32::new(0),
            waiting: AtomicU32::new(0),
            retries: AtomicU32::new(0),
            exchanges: limits
                .max_connections
                .map(|n| Arc::new(Semaphore::new(n as usize))),
        }))
    }

    /// Admits a request, waiting for an exchange slot when `maxConnections` are busy and
    /// fewer than `maxPendingRequests` wait already.
    pub async fn admit(self: &Arc<Self>) -> Result<Admission, Limit> {
        let n = self.requests.fetch_add(1, Ordering::Relaxed) + 1;
        let mut admission = Admission {
            breaker: self.clone(),
            _exchange: None,
        };
        if self.limits.max_requests.is_some_and(|max| n > max) {
            return Err(Limit::Requests);
        }
        let Some(sem) = &self.exchanges else {
            return Ok(admission);
        };
        if let Ok(p) = sem.clone().try_acquire_owned() {
            admission._exchange = Some(p);
            return Ok(admission);
        }
        let w = self.waiting.fetch_add(1, Ordering::Relaxed) + 1;
        let _waiting = Waiting(&self.waiting);
        if w > self.limits.max_pending_requests.unwrap_or(0) {
            return Err(Limit::Pending);
        }
        // The semaphore is never closed.
        admission._exchange = sem.clone().acquire_owned().await.ok();
        Ok(admission)
    }

    /// A retry's slot, or the limit when `maxRetries` are in flight.
    pub fn retry(self: &Arc<Self>) -> Result<RetrySlot, Limit> {
        let n = self.retries.fetch_add(1, Ordering::Relaxed) + 1;
        let slot = RetrySlot(self.clone());
        if self.limits.max_retries.is_some_and(|max| n > max) {
            return Err(Limit::Retries);
        }
        Ok(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn requests_beyond_the_limits_are_refused_and_slots_come_back() {
        let b = Breaker::new(&CircuitBreaker {
            max_connections: Some(2),
            max_pending_requests: Some(1),
            max_requests: Some(4),
            max_retries: Some(1),
        })
        .unwrap();
        let a1 = b.admit().await.unwrap();
        let a2 = b.admit().await.unwrap();
        // The third waits for a slot; a fourth finds the queue full.
        let b2 = b.clone();
        let waiter = tokio::spawn(async move { b2.admit().await.map(|_| ()) });
        tokio::task::yield_now().await;
        while b.waiting.load(Ordering::Relaxed) == 0 {
            tokio::task::yield_now().await;
        }
        assert_eq!(b.admit().await.err(), Some(Limit::Pending));
        drop(a1);
        assert_eq!(waiter.await.unwrap(), Ok(()));
        let r = b.retry().unwrap();
        assert_eq!(b.retry().err(), Some(Limit::Retries));
        drop((r, a2));
        assert_eq!(b.requests.load(Ordering::Relaxed), 0);
        assert_eq!(b.retries.load(Ordering::Relaxed), 0);
        assert!(Breaker::new(&CircuitBreaker::default()).is_none());
    }

    #[tokio::test]
    async fn max_requests_counts_waiting_and_in_flight() {
        let b = Breaker::new(&CircuitBreaker {
            max_requests: Some(2),
            ..CircuitBreaker::default()
        })
        .unwrap();
        let held = (b.admit().await.unwrap(), b.admit().await.unwrap());
        assert_eq!(b.admit().await.err(), Some(Limit::Requests));
        drop(held);
        assert!(b.admit().await.is_ok());
    }
}
