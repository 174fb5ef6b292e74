//! How long, and how slowly, a client may send a request body. In: the proxy's limits and
//! the request's HTTP version ([`BodyPace::for_request`]), then, as the body flows, the bytes
//! that arrive and when the proxy starts waiting on the client ([`Pacer`]). Out: the instant
//! the body is cut at if nothing more arrives, and why ([`Cut`]); `body::LimitedBody` arms
//! one timer for it.
//!
//! Three bounds, one deadline: the idle timeout (no byte for so long), the total deadline
//! (the whole body within so long of its start) and the minimum rate. The rate is a bucket
//! of `min_rate × window` bytes of credit, full at the start: waiting on the client drains it
//! at `min_rate` bytes per second, bytes received fill it again (never above full). An empty
//! bucket cuts the body. So a client may fall behind the pace by at most one window's worth,
//! a fast start buys at most one window of pause, and one byte every 20 s is cut about one
//! window in. Only time spent waiting on the client drains it: while the upstream does not
//! read (back-pressure) the proxy does not poll the body, and the client is not to blame.
//!
//! Why a bucket and not per-window counts: it needs no timer of its own and no clock read per
//! frame that arrives without a wait, only per wait (a body arriving faster than the
//! upstream reads it never waits).

use std::time::Duration;

use http::Version;
use tokio::time::Instant;

use crate::limits::Limits;
use crate::metrics::ClientTimeoutKind;

/// Why a request body was cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cut {
    /// Nothing arrived for the idle timeout.
    Idle,
    /// The bucket of the minimum rate ran dry.
    Slow,
    /// Not whole by the total deadline.
    Deadline,
}

impl Cut {
    /// The metric kind of this cut.
    pub fn kind(self) -> ClientTimeoutKind {
        match self {
            Self::Idle => ClientTimeoutKind::BodyIdle,
            Self::Slow => ClientTimeoutKind::BodyRate,
            Self::Deadline => ClientTimeoutKind::BodyDeadline,
        }
    }

    /// The access log's word for it: the metric's `kind`.
    pub fn as_str(self) -> &'static str {
        self.kind().as_str()
    }
}

/// The bounds on one request body.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyPace {
    /// No byte for this long while more is due: cut.
    pub idle: Duration,
    /// The whole body within this long of its start.
    pub total: Duration,
    /// The total deadline stops once the answer has started (HTTP/2: a stream the upstream
    /// answers, a gRPC stream, may go on).
    pub total_until_answer: bool,
    /// Least bytes per second; 0: no minimum.
    pub min_rate: u64,
    /// Credit of the minimum rate, in bytes (`min_rate × window`).
    pub capacity: u64,
}

impl BodyPace {
    /// The bounds for a request of `version`: HTTP/1.x bodies get the idle timeout, the
    /// total deadline and the minimum rate; HTTP/2 bodies, which may rightly pause (gRPC
    /// streams), the stream idle timeout and the total deadline until the answer starts.
    pub fn for_request(limits: &Limits, version: Version) -> Self {
        if version >= Version::HTTP_2 {
            return Self {
                idle: limits.http2_stream_idle_timeout,
                total: limits.request_body_timeout,
                total_until_answer: true,
                min_rate: 0,
                capacity: 0,
            };
        }
        let window_ms =
            u64::try_from(limits.request_body_rate_window.as_millis()).unwrap_or(u64::MAX);
        Self {
            idle: limits.request_body_idle_timeout,
            total: limits.request_body_timeout,
            total_until_answer: false,
            min_rate: limits.request_body_min_rate,
            capacity: limits.request_body_min_rate.saturating_mul(window_ms) / 1000,
        }
    }
}

/// One body's progress against its [`BodyPace`].
#[derive(Debug)]
pub(crate) struct Pacer {
    pace: BodyPace,
    started: Instant,
    /// Bytes of credit left (see the module doc).
    credit: u64,
    /// When the proxy began waiting on the client; `None` while it is not waiting.
    waiting_since: Option<Instant>,
}

impl Pacer {
    /// A body starting at `now`, its credit full.
    pub fn new(pace: BodyPace, now: Instant) -> Self {
        Self {
            credit: pace.capacity,
            pace,
            started: now,
            waiting_since: None,
        }
    }

    /// `len` bytes arrived; `now` is asked only when the proxy was waiting for them.
    pub fn received(&mut self, len: u64, now: impl FnOnce() -> Instant) {
        if self.pace.min_rate == 0 {
            self.waiting_since = None;
            return;
        }
        if let Some(since) = self.waiting_since.take() {
            self.credit = self.credit.saturating_sub(self.drained(now() - since));
        }
        self.credit = self.credit.saturating_add(len).min(self.pace.capacity);
    }

    /// The proxy waits on the client (from `now`, unless it already was): when the body is
    /// cut if nothing arrives, and why. `answered`: the upstream's answer has started.
    pub fn waiting(&mut self, now: Instant, answered: bool) -> (Instant, Cut) {
        let since = *self.waiting_since.get_or_insert(now);
        let mut cut = (since + self.pace.idle, Cut::Idle);
        if self.pace.min_rate > 0 {
            let empty_in = Duration::from_nanos(
                u64::try_from(
                    u128::from(self.credit) * 1_000_000_000 / u128::from(self.pace.min_rate),
                )
                .unwrap_or(u64::MAX),
            );
            let empty = since.checked_add(empty_in).unwrap_or(cut.0);
            if empty < cut.0 {
                cut = (empty, Cut::Slow);
            }
        }
        if !(answered && self.pace.total_until_answer) {
            let end = self.started + self.pace.total;
            if end < cut.0 {
                cut = (end, Cut::Deadline);
            }
        }
        cut
    }

    /// Credit spent by waiting `d` on the client.
    fn drained(&self, d: Duration) -> u64 {
        u64::try_from(d.as_nanos() * u128::from(self.pace.min_rate) / 1_000_000_000)
            .unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn h1(rate: u64, window: u64, idle: u32, total: u32) -> BodyPace {
        BodyPace {
            idle: idle * S,
            total: total * S,
            total_until_answer: false,
            min_rate: rate,
            capacity: rate * window,
        }
    }

    #[test]
    fn a_silent_client_is_cut_by_whichever_bound_comes_first() {
        let t0 = Instant::now();
        // Window 10 s at 100 B/s: the bucket empties 10 s into a wait, before the idle 60 s.
        let mut p = Pacer::new(h1(100, 10, 60, 300), t0);
        assert_eq!(p.waiting(t0, false), (t0 + 10 * S, Cut::Slow));
        // No minimum: the idle timeout.
        let mut p = Pacer::new(h1(0, 10, 60, 300), t0);
        assert_eq!(p.waiting(t0, false), (t0 + 60 * S, Cut::Idle));
        // Total deadline first.
        let mut p = Pacer::new(h1(0, 10, 60, 30), t0);
        assert_eq!(p.waiting(t0 + 5 * S, false), (t0 + 30 * S, Cut::Deadline));
    }

    #[test]
    fn a_wait_is_counted_from_its_start_not_from_each_poll() {
        let t0 = Instant::now();
        let mut p = Pacer::new(h1(0, 10, 60, 300), t0);
        assert_eq!(p.waiting(t0 + S, false).0, t0 + 61 * S);
        // Polled again, still waiting: the same deadline.
        assert_eq!(p.waiting(t0 + 30 * S, false).0, t0 + 61 * S);
        // Bytes arrived: the next wait starts afresh.
        p.received(1, || t0 + 40 * S);
        assert_eq!(p.waiting(t0 + 50 * S, false).0, t0 + 110 * S);
    }

    #[test]
    fn a_trickle_below_the_rate_drains_the_bucket_and_a_steady_pace_keeps_it() {
        let t0 = Instant::now();
        // 100 B/s over 10 s: 1000 bytes of credit.
        let mut p = Pacer::new(h1(100, 10, 60, 300), t0);
        // One byte every 2 s: each wait drains 200, each byte gives 1 back.
        let mut t = t0;
        let mut cut_at = None;
        for _ in 0..10 {
            let (at, why) = p.waiting(t, false);
            if at <= t + 2 * S {
                cut_at = Some((at, why));
                break;
            }
            t += 2 * S;
            p.received(1, || t);
        }
        let (at, why) = cut_at.expect("the trickle is cut");
        assert_eq!(why, Cut::Slow);
        assert!(at > t0 + 9 * S && at < t0 + 11 * S, "{:?}", at - t0);

        // 150 bytes every second (above 100 B/s) for 100 s: never within reach of a cut.
        let mut p = Pacer::new(h1(100, 10, 60, 300), t0);
        let mut t = t0;
        for _ in 0..100 {
            assert!(p.waiting(t, false).0 > t + 5 * S);
            t += S;
            p.received(150, || t);
        }
    }

    #[test]
    fn a_fast_start_buys_at_most_one_window_of_pause() {
        let t0 = Instant::now();
        let mut p = Pacer::new(h1(100, 10, 600, 3000), t0);
        // A megabyte with no wait at all: the credit stays capped at one window.
        p.received(1 << 20, || unreachable!("no wait, no clock"));
        assert_eq!(p.waiting(t0 + S, false), (t0 + 11 * S, Cut::Slow));
    }

    #[test]
    fn an_http2_body_keeps_no_rate_and_its_deadline_ends_with_the_answer() {
        let limits = Limits {
            max_header_bytes: 0,
            max_header_count: 0,
            max_body_bytes: 0,
            header_read_timeout: S,
            idle_timeout: S,
            max_connections_per_client: None,
            request_timeout: None,
            stream_idle_timeout: S,
            udp_flow_idle_timeout: S,
            udp_max_flows: 1,
            request_body_idle_timeout: 60 * S,
            request_body_timeout: 300 * S,
            request_body_min_rate: 256,
            request_body_rate_window: 60 * S,
            http2_stream_idle_timeout: 1000 * S,
            http2_idle_timeout: S,
            http2_max_concurrent_streams: 1,
            max_upstream_requests_per_connection: 1,
        };
        let h1 = BodyPace::for_request(&limits, Version::HTTP_11);
        assert_eq!((h1.min_rate, h1.capacity, h1.idle), (256, 256 * 60, 60 * S));
        let pace = BodyPace::for_request(&limits, Version::HTTP_2);
        assert_eq!((pace.min_rate, pace.idle), (0, 1000 * S));
        let t0 = Instant::now();
        let mut p = Pacer::new(pace, t0);
        assert_eq!(p.waiting(t0, false), (t0 + 300 * S, Cut::Deadline));
        assert_eq!(p.waiting(t0, true), (t0 + 1000 * S, Cut::Idle));
    }
}
