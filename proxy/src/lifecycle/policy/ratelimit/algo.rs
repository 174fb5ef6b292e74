//! The counting algorithms, pure: a state, a rate and a time in, a state and a verdict out.
//!
//! In: a [`Spec`] (algorithm, limit, window), a [`RateState`] and the time `now` in unix
//! milliseconds. Out: the advanced state, whether a request of some cost fits, and the numbers
//! a [`Decision`] reports. No clock, no I/O, no allocation: the memory store, the Redis script
//! (`ratelimit.lua`, which mirrors [`Spec::fresh`], [`Spec::advance`], [`Spec::admits_n`],
//! [`Spec::consume`], [`Spec::record`], [`add`] and [`Spec::idle_ttl`] line by line) and the
//! cached store all run these same rules, so a counter means the same thing wherever it lives.
//!
//! A request asks a counter for room for `need` units and, admitted, counts `take`
//! ([`Cost`]): a plain request 1 and 1; a `cost.request` of `n` asks `max(n, 1)` and counts
//! `n` (a free request still needs a counter that is not full); a `cost.response` asks 1
//! and counts nothing, its cost being [added](add) once the response is known, whether it
//! fits or not (the request was served: the next one pays).
//!
//! Every state is three integers (`a`, `b`, `c`) so that it round-trips through one Redis hash
//! unchanged:
//!
//! | algorithm      | `a`                          | `b`                     | `c`                  |
//! |----------------|------------------------------|-------------------------|----------------------|
//! | fixed window   | start of the window          | requests in it          | unused               |
//! | sliding window | start of the current window  | requests in current     | requests in previous |
//! | token bucket   | tokens × window (see below)  | time of the last refill | unused               |
//!
//! Windows are aligned on multiples of the window length since the epoch, so every replica
//! agrees on where a window starts without talking to the others. The token bucket counts in
//! units of 1/`window_ms` token, so a refill of `limit / window_ms` tokens per millisecond is
//! exactly `limit` units per millisecond and nothing is ever rounded.
//!
//! Arithmetic is exact as long as `limit × window_ms` stays below 2^53 (the Redis script
//! computes in Lua doubles); [`Spec::new`] refuses larger rates.

use std::time::Duration;

use tollgate_api::policy::{Algorithm, Rate};

use super::decision::Decision;

/// The largest `limit × window_ms` computed exactly in the Redis script (Lua doubles).
pub(crate) const MAX_EXACT: u64 = 1 << 53;

/// One rate of a limit, ready to count with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Spec {
    /// Counting algorithm.
    pub alg: Algorithm,
    /// Requests per window.
    pub limit: i64,
    /// Window length in milliseconds, at least 1.
    pub window: i64,
}

/// The counting state of one rate of one counter; the meaning of the fields depends on the
/// algorithm (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct RateState {
    pub a: i64,
    pub b: i64,
    pub c: i64,
}

/// Requests a cached replica admitted and has not yet recorded in Redis: `hits` requests from
/// `at` on, all in the same window of every windowed rate (a new segment starts when one of
/// them rolls over), so they can be recorded in the window they happened in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    pub at: i64,
    pub hits: i64,
}

/// What one rate reports about a counter at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Report {
    /// Requests that would still be admitted now.
    pub remaining: u64,
    /// Milliseconds until the counter resets (window end, or bucket full).
    pub reset_ms: u64,
    /// Milliseconds until one more request fits; `None` when one fits now.
    pub retry_ms: Option<u64>,
}

impl Spec {
    /// The spec of `rate`, or `None` when its window is zero or it is too large to count
    /// exactly (see [`MAX_EXACT`]).
    pub fn new(alg: Algorithm, rate: &Rate) -> Option<Self> {
        if rate.window_ms == 0 || rate.limit.checked_mul(rate.window_ms)? >= MAX_EXACT {
            return None;
        }
        Some(Self {
            alg,
            limit: i64::try_from(rate.limit).ok()?,
            window: i64::try_from(rate.window_ms).ok()?,
        })
    }

    /// The letter the Redis script knows the algorithm by.
    pub fn alg_code(&self) -> &'static str {
        match self.alg {
            Algorithm::FixedWindow => "f",
            Algorithm::SlidingWindow => "s",
            Algorithm::TokenBucket => "t",
        }
    }

    /// Token-bucket capacity in units (one token = `window` units).
    fn capacity(&self) -> i64 {
        self.limit * self.window
    }

    /// Start of the window containing `t`.
    pub fn align(&self, t: i64) -> i64 {
        t - t.rem_euclid(self.window)
    }

    /// A counter nobody has used yet: an empty window, a full bucket.
    pub fn fresh(&self, now: i64) -> RateState {
        match self.alg {
            Algorithm::FixedWindow | Algorithm::SlidingWindow => RateState {
                a: self.align(now),
                b: 0,
                c: 0,
            },
            Algorithm::TokenBucket => RateState {
                a: self.capacity(),
                b: now,
                c: 0,
            },
        }
    }

    /// Moves `s` forward to `now`: rolls windows over, refills the bucket. Time never runs
    /// backwards for a counter: a `now` behind the state (another replica's clock is ahead)
    /// counts in the state's current window and refills nothing.
    pub fn advance(&self, s: &mut RateState, now: i64) {
        match self.alg {
            Algorithm::FixedWindow => {
                let start = self.align(now);
                if start > s.a {
                    *s = RateState {
                        a: start,
                        b: 0,
                        c: 0,
                    };
                }
            }
            Algorithm::SlidingWindow => {
                let start = self.align(now);
                if start == s.a + self.window {
                    *s = RateState {
                        a: start,
                        b: 0,
                        c: s.b,
                    };
                } else if start > s.a + self.window {
                    *s = RateState {
                        a: start,
                        b: 0,
                        c: 0,
                    };
                }
            }
            Algorithm::TokenBucket => {
                if now > s.b {
                    let refill = i128::from(now - s.b) * i128::from(self.limit);
                    let tokens = (i128::from(s.a) + refill).min(i128::from(self.capacity()));
                    // `tokens` is at most the capacity, which fits.
                    s.a = i64::try_from(tokens).unwrap_or(i64::MAX);
                    s.b = now;
                }
            }
        }
    }

    /// Milliseconds into the current window, within `0..=window`.
    fn elapsed(&self, s: &RateState, now: i64) -> i64 {
        (now - s.a).clamp(0, self.window)
    }

    /// Sliding window: the weighted count (previous × the fraction of it still inside the
    /// sliding window + current), scaled by `window` so it stays an integer.
    fn weighted(&self, s: &RateState, now: i64) -> i128 {
        let e = self.elapsed(s, now);
        i128::from(s.c) * i128::from(self.window - e) + i128::from(s.b) * i128::from(self.window)
    }

    /// Whether `n` more units (a request's cost, at least 1; a plain request is 1) fit in
    /// `s` (already advanced to `now`).
    pub fn admits_n(&self, s: &RateState, now: i64, n: i64) -> bool {
        let (n, w) = (i128::from(n), i128::from(self.window));
        match self.alg {
            Algorithm::FixedWindow => i128::from(s.b) + n <= i128::from(self.limit),
            Algorithm::SlidingWindow => self.weighted(s, now) + n * w <= i128::from(self.limit) * w,
            Algorithm::TokenBucket => i128::from(s.a) >= n * w,
        }
    }

    /// Counts `n` requests, whether they fit or not (the caller decided).
    pub fn consume(&self, s: &mut RateState, n: i64) {
        match self.alg {
            Algorithm::FixedWindow | Algorithm::SlidingWindow => s.b = s.b.saturating_add(n),
            Algorithm::TokenBucket => s.a = s.a.saturating_sub(n.saturating_mul(self.window)),
        }
    }

    /// Counts `n` requests admitted elsewhere at time `at` (a cached replica's flush): like
    /// [`Self::advance`] then [`Self::consume`], except that hits of a window the state has
    /// already left go to the previous window (sliding) or nowhere (fixed, or older).
    pub fn record(&self, s: &mut RateState, at: i64, n: i64) {
        match self.alg {
            Algorithm::FixedWindow => {
                if self.align(at) >= s.a {
                    self.advance(s, at);
                    self.consume(s, n);
                }
            }
            Algorithm::SlidingWindow => {
                let start = self.align(at);
                if start >= s.a {
                    self.advance(s, at);
                    self.consume(s, n);
                } else if start == s.a - self.window {
                    s.c += n;
                }
            }
            Algorithm::TokenBucket => {
                self.advance(s, at);
                self.consume(s, n);
            }
        }
    }

    /// Milliseconds after `now` from which `s` is indistinguishable from [`Self::fresh`], so
    /// the counter can be forgotten (memory) or expire (Redis `PEXPIRE`).
    pub fn idle_ttl(&self, s: &RateState, now: i64) -> i64 {
        let ttl = match self.alg {
            Algorithm::FixedWindow => s.a + self.window - now,
            Algorithm::SlidingWindow => s.a + 2 * self.window - now,
            Algorithm::TokenBucket => ceil_div(self.capacity() - s.a, self.limit),
        };
        ttl.max(0)
    }

    /// The numbers of `s` at `now` (`s` advanced to `now`, consumed if admitted), for a
    /// request that needs room for `need` units: `retry_ms` is the wait until `need` fit
    /// (the window length when they never will).
    pub fn report_n(&self, s: &RateState, now: i64, need: i64) -> Report {
        let w = self.window;
        match self.alg {
            Algorithm::FixedWindow => {
                let reset = (s.a + w - now).max(0);
                Report {
                    remaining: to_u64(self.limit - s.b),
                    reset_ms: to_u64(reset),
                    retry_ms: (!self.admits_n(s, now, need)).then(|| to_u64(reset.max(1))),
                }
            }
            Algorithm::SlidingWindow => {
                let free = i128::from(self.limit) * i128::from(w) - self.weighted(s, now);
                let remaining = free.max(0) / i128::from(w);
                let reset = (s.a + w - now).max(0);
                Report {
                    remaining: u64::try_from(remaining).unwrap_or(u64::MAX),
                    reset_ms: to_u64(reset),
                    retry_ms: (!self.admits_n(s, now, need))
                        .then(|| to_u64(self.sliding_retry(s, now, need))),
                }
            }
            Algorithm::TokenBucket => {
                let retry = if self.limit > 0 {
                    let missing = i128::from(need) * i128::from(w) - i128::from(s.a);
                    i64::try_from(missing).map_or(i64::MAX, |m| ceil_div(m, self.limit))
                } else {
                    w
                };
                Report {
                    remaining: to_u64(s.a / w),
                    reset_ms: to_u64(ceil_div(self.capacity() - s.a, self.limit.max(1))),
                    retry_ms: (!self.admits_n(s, now, need)).then(|| to_u64(retry.max(1))),
                }
            }
        }
    }

    /// Sliding window, a request needing `n` units denied at `now`: the wait until the
    /// weighted count leaves room for them. Exact: [`Self::admits_n`] holds at
    /// `now + result` and not one ms earlier (unless that falls in a later window, where it
    /// holds at the window start). `n` over the limit never fits: the window length.
    fn sliding_retry(&self, s: &RateState, now: i64, n: i64) -> i64 {
        let (w, l) = (i128::from(self.window), i128::from(self.limit));
        let e = i128::from(self.elapsed(s, now));
        let (b, c, n) = (i128::from(s.b), i128::from(s.c), i128::from(n));
        if l <= 0 || n > l {
            return self.window;
        }
        let wait = if b + n <= l && c > 0 {
            // Room comes within this window, once enough of the previous one slid out:
            // c × (w − e') ≤ (l − b − n) × w.
            let slack = (l - b - n) * w / c;
            (w - slack - e).max(1)
        } else {
            // Not before the next window, where the current count becomes the previous one:
            // b × (w − t) ≤ (l − n) × w.
            let t = if b > 0 {
                (w - (l - n) * w / b).max(0)
            } else {
                0
            };
            (w - e) + t
        };
        i64::try_from(wait).unwrap_or(i64::MAX)
    }
}

fn ceil_div(n: i64, d: i64) -> i64 {
    if n <= 0 || d <= 0 {
        return 0;
    }
    (n + d - 1) / d
}

fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// Decides one request against every rate of a limit: each rate is advanced to `now`; the
/// request is admitted only if every rate has room, and only then is it counted, in every
/// rate. A denied request consumes nothing anywhere, so a long window that refuses does not
/// drain a short one that would have admitted.
#[cfg(test)]
pub(crate) fn decide(specs: &[Spec], states: &mut [RateState], now: i64) -> bool {
    decide_cost(specs, states, now, Cost::ONE)
}

/// What one request asks of a counter: room for `need` units (at least 1) to be admitted,
/// then `take` units counted (0 when its cost is known only after the response).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cost {
    pub need: i64,
    pub take: i64,
}

impl Cost {
    /// A plain request: room for one, counts one.
    pub const ONE: Cost = Cost { need: 1, take: 1 };
}

/// [`decide`] for a request of cost `cost`: admitted when every rate has room for
/// `cost.need` units, and then `cost.take` units are counted in every rate.
pub(crate) fn decide_cost(specs: &[Spec], states: &mut [RateState], now: i64, cost: Cost) -> bool {
    for (spec, state) in specs.iter().zip(states.iter_mut()) {
        spec.advance(state, now);
    }
    let allowed = specs
        .iter()
        .zip(states.iter())
        .all(|(spec, state)| spec.admits_n(state, now, cost.need));
    if allowed {
        for (spec, state) in specs.iter().zip(states.iter_mut()) {
            spec.consume(state, cost.take);
        }
    }
    allowed
}

/// Counts `n` units at `now` in every rate, after the fact (a cost known from the
/// response): advanced to `now`, then consumed whether they fit or not (the request was
/// served already; the next one pays).
pub(crate) fn add(specs: &[Spec], states: &mut [RateState], now: i64, n: i64) {
    for (spec, state) in specs.iter().zip(states.iter_mut()) {
        spec.advance(state, now);
        spec.consume(state, n);
    }
}

/// The [`Decision`] after [`decide`]: the most restrictive rate speaks. Admitted: the rate
/// with the fewest requests left (the longest reset on a tie). Denied: among the rates that
/// refused, the one that makes the client wait longest.
pub(crate) fn decision(specs: &[Spec], states: &[RateState], now: i64, allowed: bool) -> Decision {
    decision_n(specs, states, now, allowed, 1)
}

/// [`decision`] for a request that needed room for `need` units (its `Retry-After` is the
/// wait until they fit).
pub(crate) fn decision_n(
    specs: &[Spec],
    states: &[RateState],
    now: i64,
    allowed: bool,
    need: i64,
) -> Decision {
    let mut best: Option<(Spec, Report)> = None;
    for (spec, state) in specs.iter().zip(states) {
        let r = spec.report_n(state, now, need);
        if !allowed && r.retry_ms.is_none() {
            continue;
        }
        let better = match &best {
            None => true,
            Some((_, b)) if allowed => {
                (r.remaining, std::cmp::Reverse(r.reset_ms))
                    < (b.remaining, std::cmp::Reverse(b.reset_ms))
            }
            Some((_, b)) => r.retry_ms > b.retry_ms,
        };
        if better {
            best = Some((*spec, r));
        }
    }
    match best {
        Some((spec, r)) => Decision {
            allowed,
            limit: to_u64(spec.limit),
            remaining: r.remaining,
            reset_after: Duration::from_millis(r.reset_ms),
            retry_after: (!allowed).then(|| Duration::from_millis(r.retry_ms.unwrap_or(1))),
        },
        // No rates (refused at compile time) or states out of step with specs: refuse
        // rather than admit unlimited.
        None => Decision {
            allowed: false,
            limit: 0,
            remaining: 0,
            reset_after: Duration::from_secs(1),
            retry_after: Some(Duration::from_secs(1)),
        },
    }
}

/// Records `segments` into `states` with [`Spec::record`].
pub(crate) fn record(specs: &[Spec], states: &mut [RateState], segments: &[Segment]) {
    for seg in segments {
        for (spec, state) in specs.iter().zip(states.iter_mut()) {
            spec.record(state, seg.at, seg.hits);
        }
    }
}

/// Whether a hit at `now` belongs to the same segment as one at `at` (same window of every
/// windowed rate).
pub(crate) fn same_segment(specs: &[Spec], at: i64, now: i64) -> bool {
    specs.iter().all(|s| match s.alg {
        Algorithm::TokenBucket => true,
        Algorithm::FixedWindow | Algorithm::SlidingWindow => s.align(at) == s.align(now),
    })
}

/// Largest [`Spec::idle_ttl`] over the rates.
pub(crate) fn idle_ttl(specs: &[Spec], states: &[RateState], now: i64) -> i64 {
    specs
        .iter()
        .zip(states)
        .map(|(spec, state)| spec.idle_ttl(state, now))
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
#[path = "algo_tests.rs"]
mod tests;
