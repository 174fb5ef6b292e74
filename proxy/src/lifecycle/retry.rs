//! Retries (HTTPRoute `rules[].retry`, GEP-1731). In: the route's [`Retry`], the request's
//! method, and each upstream attempt's outcome. Out: whether another attempt may go, why
//! (the `reason` of `tollgate_upstream_retries_total` and the access log's `retried`), and
//! how long to wait first.
//!
//! What is retried: a connection that could not be made, for any request (nothing reached
//! the backend); a connection that failed after the request went out, or a backend timeout,
//! only for an idempotent method (RFC 9110 §9.2.2: the backend may have acted on it); an
//! answer whose status the route lists, for any method (the backend said it failed). Only
//! a request whose body the proxy holds is sent again (module `call`).

use std::time::Duration;

use http::{Method, StatusCode};
use tollgate_api::Retry;

use crate::lifecycle::call::Failure;

/// Longest wait between two attempts, whatever the doubling reaches.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// Why an attempt is made again (a label of `tollgate_upstream_retries_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RetryReason {
    /// No connection could be made.
    Connect,
    /// The connection failed after the request went out.
    Reset,
    /// The attempt outlasted the rule's `backendRequest` timeout.
    Timeout,
    /// The answer's status is one the rule retries.
    Status,
}

impl RetryReason {
    /// The metric label and access log word.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Reset => "reset",
            Self::Timeout => "timeout",
            Self::Status => "status",
        }
    }
}

/// One request's retries: how many are left and what may be retried.
#[derive(Debug)]
pub(crate) struct Retrier<'a> {
    policy: &'a Retry,
    idempotent: bool,
    /// Retries made so far.
    made: u32,
}

impl<'a> Retrier<'a> {
    /// Retries of a `method` request under `policy`.
    pub fn new(policy: &'a Retry, method: &Method) -> Self {
        Self {
            policy,
            idempotent: method.is_idempotent(),
            made: 0,
        }
    }

    /// True when no retry is left: the next attempt is the last.
    pub fn exhausted(&self) -> bool {
        self.made >= self.policy.attempts
    }

    /// Whether an attempt that failed with `f` goes again, and why.
    pub fn after_failure(&self, f: &Failure) -> Option<RetryReason> {
        let reason = match f {
            Failure::Upstream(e) if e.is_connect() => RetryReason::Connect,
            Failure::Upstream(_) if self.idempotent => RetryReason::Reset,
            Failure::Timeout if self.idempotent => RetryReason::Timeout,
            Failure::Upstream(_) | Failure::Timeout | Failure::BodyRead => return None,
        };
        (!self.exhausted()).then_some(reason)
    }

    /// Whether an attempt answered with `status` goes again.
    pub fn after_answer(&self, status: StatusCode) -> Option<RetryReason> {
        (!self.exhausted() && self.policy.codes.contains(&status.as_u16()))
            .then_some(RetryReason::Status)
    }

    /// Counts a retry and says how long to wait before it: the rule's `backoff`, doubled
    /// for each retry before it, plus up to a quarter more of jitter so that clients
    /// failed together do not come back together; never below the `backoff`.
    pub fn next(&mut self) -> Duration {
        self.made += 1;
        let base = Duration::from_millis(self.policy.backoff_ms);
        let doubled = base
            .saturating_mul(1 << (self.made - 1).min(16))
            .min(MAX_BACKOFF.max(base));
        let jitter_ms = u64::try_from(doubled.as_millis() / 4).unwrap_or(0);
        doubled + Duration::from_millis(fastrand::u64(..=jitter_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::h1::H1Error;
    use crate::upstream::pool::UpstreamError;

    fn policy(attempts: u32, codes: &[u16]) -> Retry {
        Retry {
            attempts,
            backoff_ms: 100,
            codes: codes.to_vec(),
        }
    }

    fn connect() -> Failure {
        Failure::Upstream(UpstreamError::Connect(
            std::io::ErrorKind::ConnectionRefused.into(),
        ))
    }

    fn connect_timeout() -> Failure {
        Failure::Upstream(UpstreamError::Connect(std::io::ErrorKind::TimedOut.into()))
    }

    fn reset() -> Failure {
        Failure::Upstream(UpstreamError::H1(H1Error::Closed))
    }

    #[test]
    fn a_failed_connect_is_retried_for_any_method_until_attempts_run_out() {
        let p = policy(2, &[]);
        let mut r = Retrier::new(&p, &Method::POST);
        assert_eq!(r.after_failure(&connect()), Some(RetryReason::Connect));
        r.next();
        assert_eq!(r.after_failure(&connect()), Some(RetryReason::Connect));
        r.next();
        assert!(r.exhausted());
        assert_eq!(r.after_failure(&connect()), None);
    }

    #[test]
    fn timeouts_and_resets_are_retried_only_for_idempotent_methods() {
        let p = policy(1, &[]);
        for m in [Method::GET, Method::HEAD, Method::PUT, Method::DELETE] {
            let r = Retrier::new(&p, &m);
            assert_eq!(
                r.after_failure(&Failure::Timeout),
                Some(RetryReason::Timeout)
            );
            assert_eq!(r.after_failure(&reset()), Some(RetryReason::Reset));
        }
        for m in [Method::POST, Method::PATCH] {
            let r = Retrier::new(&p, &m);
            assert_eq!(r.after_failure(&Failure::Timeout), None, "{m}");
            assert_eq!(r.after_failure(&reset()), None, "{m}");
        }
        // A timed-out connect is a connect failure: nothing was sent.
        let r = Retrier::new(&p, &Method::POST);
        assert_eq!(
            r.after_failure(&connect_timeout()),
            Some(RetryReason::Connect)
        );
        assert_eq!(r.after_failure(&Failure::BodyRead), None);
    }

    #[test]
    fn only_listed_statuses_are_retried() {
        let p = policy(1, &[500, 503]);
        let r = Retrier::new(&p, &Method::POST);
        assert_eq!(
            r.after_answer(StatusCode::INTERNAL_SERVER_ERROR),
            Some(RetryReason::Status)
        );
        assert_eq!(r.after_answer(StatusCode::BAD_GATEWAY), None);
        assert_eq!(r.after_answer(StatusCode::OK), None);
    }

    #[test]
    fn backoff_doubles_from_the_minimum_with_bounded_jitter() {
        let p = policy(10, &[]);
        let mut r = Retrier::new(&p, &Method::GET);
        for want in [100u64, 200, 400, 800] {
            let got = r.next().as_millis();
            let want = u128::from(want);
            assert!(got >= want && got <= want + want / 4, "{got} vs {want}");
        }
        for _ in 0..6 {
            assert!(r.next() <= MAX_BACKOFF + MAX_BACKOFF / 4);
        }
        let zero = Retry { backoff_ms: 0, ..p };
        assert_eq!(Retrier::new(&zero, &Method::GET).next(), Duration::ZERO);
    }
}
