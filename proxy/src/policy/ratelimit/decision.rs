//! The answer of a rate limit and the response headers that carry it.
//!
//! In: a [`Decision`] (from [`super::RateLimiter::check`]). Out: `X-RateLimit-Limit`,
//! `X-RateLimit-Remaining`, `X-RateLimit-Reset` and, on a denial, `Retry-After`, all in whole
//! seconds rounded up (a client that waits the advertised time is never refused for waiting
//! too little).

use std::time::Duration;

use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};

/// `X-RateLimit-Limit`: requests per window of the most restrictive rate.
pub static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`: requests left in it.
pub static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`: seconds until it resets.
pub static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Whether a request is admitted, and the numbers of the most restrictive rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Admitted (and counted) or refused (and counted nowhere).
    pub allowed: bool,
    /// Requests per window of the rate reported.
    pub limit: u64,
    /// Requests that rate still admits now (after this one, when admitted).
    pub remaining: u64,
    /// Time until that rate's window ends (window algorithms) or its bucket is full again.
    pub reset_after: Duration,
    /// On a denial, the time until a request would be admitted; `None` when admitted.
    pub retry_after: Option<Duration>,
}

impl Decision {
    /// Combines the decisions of two limits that both apply to a request: denied if either
    /// denies (the longer wait wins), else the one with fewer requests left.
    pub fn merge(self, other: Decision) -> Decision {
        match (self.allowed, other.allowed) {
            (true, false) => other,
            (false, true) => self,
            (false, false) => {
                if other.retry_after > self.retry_after {
                    other
                } else {
                    self
                }
            }
            (true, true) => {
                if (other.remaining, std::cmp::Reverse(other.reset_after))
                    < (self.remaining, std::cmp::Reverse(self.reset_after))
                {
                    other
                } else {
                    self
                }
            }
        }
    }

    /// The response headers: name and value, `Retry-After` only on a denial.
    pub fn headers(&self) -> Vec<(HeaderName, HeaderValue)> {
        let mut out = Vec::with_capacity(4);
        out.push((X_RATELIMIT_LIMIT.clone(), HeaderValue::from(self.limit)));
        out.push((
            X_RATELIMIT_REMAINING.clone(),
            HeaderValue::from(self.remaining),
        ));
        out.push((
            X_RATELIMIT_RESET.clone(),
            HeaderValue::from(ceil_secs(self.reset_after)),
        ));
        if let Some(retry) = self.retry_after.filter(|_| !self.allowed) {
            out.push((RETRY_AFTER, HeaderValue::from(ceil_secs(retry).max(1))));
        }
        out
    }

    /// Sets [`Self::headers`] on `headers`, replacing values of the same names.
    pub fn insert_headers(&self, headers: &mut HeaderMap) {
        for (name, value) in self.headers() {
            headers.insert(name, value);
        }
    }
}

/// Whole seconds, rounded up.
fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(allowed: bool, remaining: u64, reset_ms: u64, retry_ms: Option<u64>) -> Decision {
        Decision {
            allowed,
            limit: 10,
            remaining,
            reset_after: Duration::from_millis(reset_ms),
            retry_after: retry_ms.map(Duration::from_millis),
        }
    }

    #[test]
    fn headers_of_an_admitted_request_round_reset_up_and_omit_retry_after() {
        let mut h = HeaderMap::new();
        d(true, 7, 1_200, None).insert_headers(&mut h);
        assert_eq!(h["x-ratelimit-limit"], "10");
        assert_eq!(h["x-ratelimit-remaining"], "7");
        assert_eq!(h["x-ratelimit-reset"], "2");
        assert!(!h.contains_key("retry-after"));
    }

    #[test]
    fn headers_of_a_denied_request_carry_retry_after_rounded_up() {
        let h: HeaderMap = d(false, 0, 3_000, Some(400))
            .headers()
            .into_iter()
            .collect();
        assert_eq!(h["x-ratelimit-remaining"], "0");
        assert_eq!(h["x-ratelimit-reset"], "3");
        assert_eq!(h["retry-after"], "1");
        let h: HeaderMap = d(false, 0, 3_000, Some(2_000))
            .headers()
            .into_iter()
            .collect();
        assert_eq!(h["retry-after"], "2");
    }

    #[test]
    fn merge_keeps_the_denial_with_the_longest_wait_else_the_fewest_remaining() {
        let ok5 = d(true, 5, 100, None);
        let ok2 = d(true, 2, 100, None);
        let no1 = d(false, 0, 100, Some(1_000));
        let no3 = d(false, 0, 100, Some(3_000));
        assert_eq!(ok5.merge(ok2), ok2);
        assert_eq!(ok2.merge(ok5), ok2);
        assert_eq!(ok5.merge(no1), no1);
        assert_eq!(no1.merge(ok5), no1);
        assert_eq!(no1.merge(no3), no3);
        assert_eq!(no3.merge(no1), no3);
    }
}
