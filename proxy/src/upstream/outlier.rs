//! Endpoint health: passive outlier detection and the flag active checks set. In: each
//! upstream attempt's outcome (an answer's status, or a local failure: connect, reset,
//! timeout) and the checker's verdicts (module `health`). Out: whether an endpoint is
//! available now, read by the balancer on every pick of a backend that has a BackendPolicy
//! with outlier detection or health checks.
//!
//! An endpoint whose attempts fail a configured number of times in a row is ejected for the
//! base ejection time multiplied by its ejection count (which decays by one for each
//! `interval` it stays in), unless that would eject more than `max_ejection_percent` of the
//! backend (one endpoint may always be). Ejections expire by themselves: nothing sweeps.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

use tollgate_api::backend::OutlierDetection;

/// Longest ejection, however often an endpoint was ejected (Envoy's default too).
const MAX_EJECTION_MS: u64 = 300_000;

/// Milliseconds on the process's monotonic clock (never 0: 0 means "not ejected").
pub(crate) fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX) + 1
}

/// The outcome of one upstream attempt, as outlier detection counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The endpoint answered with this status.
    Answered(u16),
    /// No answer: the connection failed or the attempt timed out.
    Local,
}

/// One endpoint's health, kept across snapshots with the endpoint.
#[derive(Debug, Default)]
pub(crate) struct Health {
    /// Out until this time ([`now_ms`]); 0: in.
    ejected_until: AtomicU64,
    /// Ejections so far, decayed (the multiplier of the next ejection time).
    ejections: AtomicU32,
    consecutive_5xx: AtomicU32,
    consecutive_gateway: AtomicU32,
    consecutive_local: AtomicU32,
    /// Active health checks say it is down (module `health`).
    pub check_failing: AtomicBool,
    /// When it joined its backend ([`now_ms`]); 0 for the endpoints the proxy started with.
    pub joined: AtomicU64,
}

impl Health {
    /// Neither ejected nor failing its checks at `now`.
    pub fn available(&self, now: u64) -> bool {
        !self.check_failing.load(Ordering::Relaxed) && !self.ejected(now)
    }

    /// When its ejection ends ([`now_ms`]); 0 when it was never ejected.
    pub fn ejected_until(&self) -> u64 {
        self.ejected_until.load(Ordering::Relaxed)
    }

    /// Ejected at `now`.
    pub fn ejected(&self, now: u64) -> bool {
        self.ejected_until.load(Ordering::Relaxed) > now
    }

    /// Counts `outcome`; true when a threshold of `od` is reached (the caller decides
    /// whether to eject, see [`Health::eject`]).
    pub fn record(&self, outcome: Outcome, od: &OutlierDetection) -> bool {
        let (five, gateway, local) = match outcome {
            Outcome::Answered(s) if s < 500 => {
                // A success ends every run (only a store when a run was going).
                for c in [
                    &self.consecutive_5xx,
                    &self.consecutive_gateway,
                    &self.consecutive_local,
                ] {
                    if c.load(Ordering::Relaxed) != 0 {
                        c.store(0, Ordering::Relaxed);
                    }
                }
                return false;
            }
            Outcome::Answered(s) => (true, matches!(s, 502..=504), false),
            Outcome::Local => (true, true, true),
        };
        let bump = |c: &AtomicU32, on: bool, limit: Option<u32>| {
            if on {
                let n = c.fetch_add(1, Ordering::Relaxed) + 1;
                limit.is_some_and(|l| n >= l)
            } else {
                c.store(0, Ordering::Relaxed);
                false
            }
        };
        let a = bump(&self.consecutive_5xx, five, od.consecutive_5xx);
        let b = bump(
            &self.consecutive_gateway,
            gateway,
            od.consecutive_gateway_errors,
        );
        let c = bump(
            &self.consecutive_local,
            local,
            od.consecutive_local_origin_failures,
        );
        a || b || c
    }

    /// Ejects the endpoint from `now` for the base time times its decayed ejection count
    /// plus one; resets its runs.
    pub fn eject(&self, now: u64, od: &OutlierDetection) {
        let last_end = self.ejected_until.load(Ordering::Relaxed);
        let decay = match od.interval_ms {
            0 => 0,
            i => u32::try_from(now.saturating_sub(last_end) / i).unwrap_or(u32::MAX),
        };
        let count = self
            .ejections
            .load(Ordering::Relaxed)
            .saturating_sub(decay)
            .saturating_add(1);
        self.ejections.store(count, Ordering::Relaxed);
        let time = od
            .base_ejection_ms
            .saturating_mul(u64::from(count))
            .min(MAX_EJECTION_MS.max(od.base_ejection_ms));
        self.ejected_until.store(now + time, Ordering::Relaxed);
        for c in [
            &self.consecutive_5xx,
            &self.consecutive_gateway,
            &self.consecutive_local,
        ] {
            c.store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn od() -> OutlierDetection {
        OutlierDetection {
            consecutive_5xx: Some(3),
            consecutive_gateway_errors: Some(2),
            consecutive_local_origin_failures: None,
            interval_ms: 1_000,
            base_ejection_ms: 10_000,
            max_ejection_percent: 50,
        }
    }

    #[test]
    fn a_run_of_failures_reaches_the_threshold_and_a_success_ends_it() {
        let h = Health::default();
        let od = od();
        assert!(!h.record(Outcome::Answered(500), &od));
        assert!(!h.record(Outcome::Answered(500), &od));
        assert!(!h.record(Outcome::Answered(200), &od));
        assert!(!h.record(Outcome::Answered(500), &od));
        assert!(!h.record(Outcome::Answered(500), &od));
        assert!(h.record(Outcome::Answered(500), &od), "three 5xx in a row");
        let h = Health::default();
        assert!(!h.record(Outcome::Answered(503), &od));
        assert!(h.record(Outcome::Local, &od), "two gateway errors in a row");
        let h = Health::default();
        let gateway_only = OutlierDetection {
            consecutive_5xx: None,
            ..od.clone()
        };
        assert!(!h.record(Outcome::Answered(503), &gateway_only));
        // A 500 is a 5xx but not a gateway error: the gateway run starts again.
        assert!(!h.record(Outcome::Answered(500), &gateway_only));
        assert!(!h.record(Outcome::Answered(503), &gateway_only));
        // The 5xx run went on through all three.
        assert!(h.record(Outcome::Answered(500), &od));
    }

    #[test]
    fn ejection_time_grows_with_each_ejection_and_decays_while_in() {
        let h = Health::default();
        let od = od();
        let t0 = 1_000_000;
        h.eject(t0, &od);
        assert!(h.ejected(t0 + 9_999) && !h.ejected(t0 + 10_000));
        // Ejected again at once after it came back: twice as long.
        let t1 = t0 + 10_000;
        h.eject(t1, &od);
        assert!(h.ejected(t1 + 19_999) && !h.ejected(t1 + 20_000));
        // In for two intervals after that: the count decays by two, to 0, then +1.
        let t2 = t1 + 20_000 + 2_000;
        h.eject(t2, &od);
        assert!(!h.ejected(t2 + 10_000));
        assert!(h.available(t2 + 10_000));
        h.check_failing.store(true, Ordering::Relaxed);
        assert!(!h.available(t2 + 10_000));
    }
}
