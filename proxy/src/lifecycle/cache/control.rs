//! `Cache-Control` and the freshness arithmetic of RFC 9111. In: request or response
//! headers. Out: the directives ([`Directives`]), an answer's freshness lifetime (§4.2.1,
//! with a policy's default for heuristically cacheable statuses) and its age on arrival
//! (§4.2.3).

use std::time::{Duration, SystemTime};

use http::header::{AGE, CACHE_CONTROL, DATE, EXPIRES, PRAGMA};
use http::{HeaderMap, StatusCode};

/// The `Cache-Control` directives a shared cache acts on. A qualified `no-cache="f"` or
/// `private="f"` is read as the unqualified one (RFC 9111 §5.2.2.4 allows it: stricter).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Directives {
    pub no_store: bool,
    pub no_cache: bool,
    pub private: bool,
    pub public: bool,
    pub must_revalidate: bool,
    pub proxy_revalidate: bool,
    pub max_age: Option<u64>,
    pub s_maxage: Option<u64>,
    /// An argument that is not a number: RFC 9111 §4.2.1 says treat the answer as stale.
    pub invalid_age: bool,
}

impl Directives {
    /// Every `Cache-Control` field of `headers` (names case-insensitive, unknown ones
    /// ignored). A request's `Pragma: no-cache` without `Cache-Control` is `no-cache`.
    pub(crate) fn parse(headers: &HeaderMap) -> Self {
        let mut d = Self::default();
        let mut any = false;
        for value in headers.get_all(CACHE_CONTROL) {
            any = true;
            let Ok(text) = value.to_str() else {
                // Unreadable: assume the worst.
                d.no_store = true;
                continue;
            };
            for item in text.split(',') {
                let (name, arg) = match item.split_once('=') {
                    Some((n, a)) => (n.trim(), Some(a.trim().trim_matches('"'))),
                    None => (item.trim(), None),
                };
                let secs = || arg.and_then(|a| a.parse::<u64>().ok());
                match name.to_ascii_lowercase().as_str() {
                    "no-store" => d.no_store = true,
                    "no-cache" => d.no_cache = true,
                    "private" => d.private = true,
                    "public" => d.public = true,
                    "must-revalidate" => d.must_revalidate = true,
                    "proxy-revalidate" => d.proxy_revalidate = true,
                    "max-age" => match secs() {
                        Some(s) => d.max_age = Some(d.max_age.map_or(s, |m| m.min(s))),
                        None => d.invalid_age = true,
                    },
                    "s-maxage" => match secs() {
                        Some(s) => d.s_maxage = Some(d.s_maxage.map_or(s, |m| m.min(s))),
                        None => d.invalid_age = true,
                    },
                    _ => {}
                }
            }
        }
        if !any
            && headers.get_all(PRAGMA).iter().any(|v| {
                v.to_str()
                    .is_ok_and(|s| s.to_ascii_lowercase().contains("no-cache"))
            })
        {
            d.no_cache = true;
        }
        d
    }

    /// A stale copy must not be served without revalidation (`must-revalidate`, and for a
    /// shared cache `proxy-revalidate` and `s-maxage`, RFC 9111 §5.2.2.8).
    pub(crate) fn no_stale(&self) -> bool {
        self.must_revalidate || self.proxy_revalidate || self.s_maxage.is_some()
    }

    /// A request with `Authorization` may be answered from this stored answer (RFC 9111
    /// §3.5).
    pub(crate) fn allows_authorized(&self) -> bool {
        self.public || self.s_maxage.is_some() || self.must_revalidate
    }
}

/// Statuses RFC 9110 §15.1 calls heuristically cacheable: stored without explicit
/// freshness (with the policy's `defaultTTL`).
pub(crate) fn heuristically_cacheable(status: StatusCode) -> bool {
    matches!(
        status.as_u16(),
        200 | 203 | 204 | 300 | 301 | 308 | 404 | 405 | 410 | 414 | 501
    )
}

/// Statuses this cache may store at all: final, and understood without a range
/// implementation (no 206) or a body of another request (no 304).
pub(crate) fn understood(status: StatusCode) -> bool {
    let s = status.as_u16();
    (200..600).contains(&s) && s != 206 && s != 304
}

/// An HTTP date field, `None` when absent or malformed.
pub(crate) fn date(headers: &HeaderMap, name: http::HeaderName) -> Option<SystemTime> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| httpdate::parse_http_date(s).ok())
}

/// The freshness lifetime (RFC 9111 §4.2.1): `s-maxage`, else `max-age`, else `Expires`
/// minus `Date`, else `default_ttl` for a heuristically cacheable status; `None`: no
/// freshness at all (not storable unless it can be revalidated).
pub(crate) fn lifetime(
    status: StatusCode,
    headers: &HeaderMap,
    d: &Directives,
    default_ttl: Option<Duration>,
) -> Option<Duration> {
    if d.invalid_age {
        return Some(Duration::ZERO);
    }
    if let Some(s) = d.s_maxage.or(d.max_age) {
        return Some(Duration::from_secs(s));
    }
    if headers.contains_key(EXPIRES) {
        // An invalid Expires ("0") means already expired (§5.3).
        let Some(expires) = date(headers, EXPIRES) else {
            return Some(Duration::ZERO);
        };
        let base = date(headers, DATE).unwrap_or_else(SystemTime::now);
        return Some(expires.duration_since(base).unwrap_or(Duration::ZERO));
    }
    default_ttl.filter(|_| heuristically_cacheable(status))
}

/// The answer's age when it arrived (RFC 9111 §4.2.3, `corrected_initial_age`):
/// `request_time` when the request went out, `response_time` when the answer came.
pub(crate) fn initial_age(
    headers: &HeaderMap,
    request_time: SystemTime,
    response_time: SystemTime,
) -> Duration {
    let age_value = headers
        .get(AGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map_or(Duration::ZERO, Duration::from_secs);
    let apparent_age = date(headers, DATE)
        .and_then(|d| response_time.duration_since(d).ok())
        .unwrap_or(Duration::ZERO);
    let response_delay = response_time
        .duration_since(request_time)
        .unwrap_or(Duration::ZERO);
    apparent_age.max(age_value + response_delay)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(*n, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn parses_directives() {
        let d = Directives::parse(&headers(&[
            ("cache-control", "Public, max-age=60"),
            ("cache-control", "s-maxage=\"30\", no-cache=\"set-cookie\""),
        ]));
        assert!(d.public && d.no_cache && !d.no_store);
        assert_eq!((d.max_age, d.s_maxage), (Some(60), Some(30)));
        assert!(d.no_stale() && d.allows_authorized());
        assert!(Directives::parse(&headers(&[("cache-control", "max-age=abc")])).invalid_age);
        assert!(Directives::parse(&headers(&[("pragma", "no-cache")])).no_cache);
    }

    #[test]
    fn lifetime_prefers_s_maxage_then_max_age_then_expires() {
        let ok = StatusCode::OK;
        let ttl = Some(Duration::from_secs(9));
        let h = headers(&[("cache-control", "max-age=5, s-maxage=7")]);
        assert_eq!(
            lifetime(ok, &h, &Directives::parse(&h), ttl),
            Some(Duration::from_secs(7))
        );
        let h = headers(&[
            ("date", "Mon, 07 Dec 2026 10:00:00 GMT"),
            ("expires", "Mon, 07 Dec 2026 10:01:00 GMT"),
        ]);
        assert_eq!(
            lifetime(ok, &h, &Directives::parse(&h), ttl),
            Some(Duration::from_secs(60))
        );
        let h = headers(&[("expires", "0")]);
        assert_eq!(
            lifetime(ok, &h, &Directives::parse(&h), ttl),
            Some(Duration::ZERO)
        );
        let h = HeaderMap::new();
        assert_eq!(lifetime(ok, &h, &Directives::default(), ttl), ttl);
        assert_eq!(lifetime(ok, &h, &Directives::default(), None), None);
        // Not heuristically cacheable: only explicit freshness.
        let created = StatusCode::CREATED;
        assert_eq!(lifetime(created, &h, &Directives::default(), ttl), None);
    }

    #[test]
    fn initial_age_is_the_larger_of_apparent_and_corrected() {
        let t0 = httpdate::parse_http_date("Mon, 07 Dec 2026 10:00:00 GMT").unwrap();
        let h = headers(&[("age", "30"), ("date", "Mon, 07 Dec 2026 09:59:50 GMT")]);
        let got = initial_age(&h, t0, t0 + Duration::from_secs(2));
        assert_eq!(got, Duration::from_secs(32));
        let h = headers(&[("date", "Mon, 07 Dec 2026 09:58:00 GMT")]);
        assert_eq!(initial_age(&h, t0, t0), Duration::from_secs(120));
    }
}
