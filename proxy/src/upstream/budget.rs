//! A backend's retry budget (XBackendTrafficPolicy `retryConstraint`, GEP-3388), per proxy.
//! In: each request sent to the backend and each retry about to be made. Out: whether the
//! retry fits: retries over the last interval may be at most a percentage of the requests in
//! it, or the minimum rate, whichever allows more. A backend that fails every request then
//! gets at most that share more, not a retry storm.
//!
//! The window slides: the previous interval's counts weigh in for the part of it that still
//! overlaps. The counters are atomics, updated without a lock; racing requests at an interval's
//! turn may land in either interval, which moves the estimate by a request or two.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tollgate_api::backend::RetryBudget;

use crate::upstream::outlier::now_ms;

/// One backend's budget and its counts.
#[derive(Debug)]
pub(crate) struct Budget {
    pub config: RetryBudget,
    /// The interval counted in `current` (`now_ms / interval`).
    epoch: AtomicU64,
    current: Counts,
    previous: Counts,
}

#[derive(Debug, Default)]
struct Counts {
    requests: AtomicU64,
    retries: AtomicU64,
}

impl Budget {
    /// A budget for `config` (with an interval of at least 1 ms).
    pub fn new(config: &RetryBudget) -> Arc<Self> {
        Arc::new(Self {
            config: RetryBudget {
                interval_ms: config.interval_ms.max(1),
                min_interval_ms: config.min_interval_ms.max(1),
                ..config.clone()
            },
            epoch: AtomicU64::new(now_ms() / config.interval_ms.max(1)),
            current: Counts::default(),
            previous: Counts::default(),
        })
    }

    /// Moves to the interval of `now`; the share of the previous one still in the window.
    fn roll(&self, now: u64) -> f64 {
        let interval = self.config.interval_ms;
        let epoch = now / interval;
        let seen = self.epoch.load(Ordering::Relaxed);
        if epoch != seen
            && self
                .epoch
                .compare_exchange(seen, epoch, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            // The interval just ended becomes the previous one; one long gone counts nothing.
            let last = epoch == seen + 1;
            for (cur, prev) in [
                (&self.current.requests, &self.previous.requests),
                (&self.current.retries, &self.previous.retries),
            ] {
                let n = cur.swap(0, Ordering::AcqRel);
                prev.store(if last { n } else { 0 }, Ordering::Relaxed);
            }
        }
        1.0 - (now % interval) as f64 / interval as f64
    }

    /// Counts a request sent to the backend.
    pub fn request(&self) {
        self.roll(now_ms());
        self.current.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a retry when it fits the budget; false when the budget is spent.
    pub fn retry(&self) -> bool {
        let weight = self.roll(now_ms());
        let est = |c: &Counts, f: fn(&Counts) -> &AtomicU64| {
            f(&self.previous).load(Ordering::Relaxed) as f64 * weight
                + f(c).load(Ordering::Relaxed) as f64
        };
        let requests = est(&self.current, |c| &c.requests);
        let retries = est(&self.current, |c| &c.retries);
        let by_share = requests * f64::from(self.config.percent) / 100.0;
        let by_rate = f64::from(self.config.min_retries) * self.config.interval_ms as f64
            / self.config.min_interval_ms as f64;
        if retries + 1.0 > by_share.max(by_rate) {
            return false;
        }
        self.current.retries.fetch_add(1, Ordering::Relaxed);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_stay_within_their_share_of_requests_or_the_minimum_rate() {
        let b = Budget::new(&RetryBudget {
            percent: 20,
            interval_ms: 60_000,
            min_retries: 3,
            min_interval_ms: 60_000,
        });
        // Before any request: the minimum rate, three.
        assert!(b.retry() && b.retry() && b.retry());
        assert!(!b.retry());
        for _ in 0..100 {
            b.request();
        }
        // 20% of 100 is 20 retries in all, three of them spent.
        let more = (0..100).filter(|_| b.retry()).count();
        assert_eq!(more, 17);
    }
}
