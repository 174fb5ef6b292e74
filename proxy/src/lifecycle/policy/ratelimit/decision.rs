//! The answer of a rate limit and the response headers that carry it.
//!
//! In: a [`Decision`] (from [`super::RateLimiter::check`]). Out: `X-RateLimit-Limit`,
//! `X-RateLimit-Remaining`, `X-RateLimit-Reset` and, on a denial, `Retry-After`, all in whole
//! seconds rounded up (a client that waits the advertised time is never refused for waiting
//! too little).
//!
//! Formatting the numbers is per request, so it is kept cheap: values below [`SMALL`] (most
//! reset times, the numbers of small limits) are clones of values printed once, which
//! allocates nothing; a larger limit is kept per thread once printed (it is the same number
//! request after request); any other number is one allocation of its digits.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::sync::LazyLock;
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

    /// Sets `X-RateLimit-Limit`, `-Remaining`, `-Reset` and, on a denial, `Retry-After` on
    /// `headers`, replacing values of the same names (this runs on every admitted request of a
    /// limited route).
    pub fn insert_headers(&self, headers: &mut HeaderMap) {
        let retry = self.retry_after.filter(|_| !self.allowed);
        // No `reserve`: a full map doubles on the first insert, which leaves room for the rest.
        headers.insert(X_RATELIMIT_LIMIT.clone(), limit_number(self.limit));
        headers.insert(X_RATELIMIT_REMAINING.clone(), number(self.remaining));
        headers.insert(
            X_RATELIMIT_RESET.clone(),
            number(ceil_secs(self.reset_after)),
        );
        if let Some(retry) = retry {
            headers.insert(RETRY_AFTER, number(ceil_secs(retry).max(1)));
        }
    }
}

/// Numbers below this are printed once, at first use.
const SMALL: u64 = 4096;

/// `0` to `SMALL - 1`, as header values over one static string (cloning one copies a pointer).
static SMALL_VALUES: LazyLock<Box<[HeaderValue]>> = LazyLock::new(|| {
    let mut digits = String::new();
    let mut ends = Vec::with_capacity(SMALL as usize);
    for n in 0..SMALL {
        let _ = write!(digits, "{n}");
        ends.push(digits.len());
    }
    // Printed once per process and kept for its lifetime.
    let digits: &'static str = Box::leak(digits.into_boxed_str());
    let mut start = 0;
    ends.into_iter()
        .map(|end| {
            let v = HeaderValue::from_static(&digits[start..end]);
            start = end;
            v
        })
        .collect()
});

/// `n` as a header value: a clone from [`SMALL_VALUES`], else one allocation of exactly the
/// digits (`HeaderValue::from(u64)` makes two).
fn number(n: u64) -> HeaderValue {
    if let Some(v) = usize::try_from(n).ok().and_then(|i| SMALL_VALUES.get(i)) {
        return v.clone();
    }
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    let mut rest = n;
    // Two digits at a time.
    while rest >= 100 {
        let pair = 2 * (rest % 100) as usize;
        rest /= 100;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
    }
    if rest >= 10 {
        let pair = 2 * rest as usize;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
    } else {
        i -= 1;
        buf[i] = b'0' + rest as u8;
    }
    HeaderValue::from_bytes(&buf[i..]).unwrap_or_else(|_| HeaderValue::from(n))
}

const DIGIT_PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
    2021222324252627282930313233343536373839\
    4041424344454647484950515253545556575859\
    6061626364656667686970717273747576777879\
    8081828384858687888990919293949596979899";

thread_local! {
    /// The last limit above [`SMALL`] printed on this thread, and its value.
    static LAST_LIMIT: RefCell<Option<(u64, HeaderValue)>> = const { RefCell::new(None) };
}

/// [`number`] for `X-RateLimit-Limit`: the same few numbers request after request, so the
/// last one printed is kept (a clone shares its bytes).
fn limit_number(n: u64) -> HeaderValue {
    if n < SMALL {
        return number(n);
    }
    LAST_LIMIT.with_borrow_mut(|last| match last {
        Some((m, v)) if *m == n => v.clone(),
        _ => {
            let v = number(n);
            *last = Some((n, v.clone()));
            v
        }
    })
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
        let mut h = HeaderMap::new();
        d(false, 0, 3_000, Some(400)).insert_headers(&mut h);
        assert_eq!(h["x-ratelimit-remaining"], "0");
        assert_eq!(h["x-ratelimit-reset"], "3");
        assert_eq!(h["retry-after"], "1");
        let mut h = HeaderMap::new();
        d(false, 0, 3_000, Some(2_000)).insert_headers(&mut h);
        assert_eq!(h["retry-after"], "2");
    }

    #[test]
    fn numbers_print_the_same_small_or_large() {
        for n in [
            0,
            1,
            9,
            10,
            99,
            3_600,
            SMALL - 1,
            SMALL,
            1_000_000_000,
            u64::MAX,
        ] {
            assert_eq!(number(n), n.to_string(), "{n}");
            assert_eq!(limit_number(n), n.to_string(), "{n}");
            assert_eq!(limit_number(n), n.to_string(), "{n} again");
        }
        for n in (0..100_000).chain([SMALL * 100, 10_000_000_000, 12_300_450_007_890]) {
            assert_eq!(number(n), n.to_string(), "{n}");
        }
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
