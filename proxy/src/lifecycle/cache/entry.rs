//! A stored answer. In: the upstream's status, headers (hop-by-hop fields removed) and
//! whole body, with when it was asked and answered. Out: its age and freshness now
//! (RFC 9111 §4.2), the answer it gives a client (with `Age` and `X-Cache`, or a 304 for
//! the client's own conditional request), and the conditional fields that revalidate it.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::header::{AGE, CONTENT_LENGTH, ETAG, IF_MODIFIED_SINCE, IF_NONE_MATCH, LAST_MODIFIED};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode};

use super::control::{Directives, date};
use crate::lifecycle::body::{ProxyBody, empty, full};

/// `X-Cache`: how the answer was found.
pub(crate) static X_CACHE: HeaderName = HeaderName::from_static("x-cache");

/// What one stored answer holds.
#[derive(Debug)]
pub(crate) struct Entry {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub directives: Directives,
    /// Its age when it arrived (§4.2.3 `corrected_initial_age`).
    pub initial_age: Duration,
    /// When it arrived (resident time runs from here).
    pub stored: Instant,
    /// Freshness lifetime, already capped by the rule's `maxTTL`.
    pub lifetime: Duration,
    /// How long past freshness it may answer while being refreshed, or when the upstream fails.
    pub stale_while_revalidate: Duration,
    pub stale_if_error: Duration,
    /// The normalized host and the route label, for purges.
    pub host: Arc<str>,
    pub route: Option<Arc<str>>,
    /// Stored in answer to a request with `Authorization` under an identity key, or one
    /// whose answer allowed it: such requests may be answered from it.
    pub authorized_ok: bool,
    /// What it weighs against the memory bound, measured once it is whole ([`Entry::measure`]):
    /// the store asks on every insert and eviction.
    pub weight: u64,
}

/// How fresh an entry is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Freshness {
    Fresh,
    /// Stale, within `staleWhileRevalidate`.
    StaleRevalidate,
    /// Stale, within `staleIfError` only.
    StaleIfError,
    /// Stale beyond every window (or not to be served stale at all).
    Stale,
}

impl Entry {
    /// Bytes the entry holds in memory, for the bound: the body, the entry itself behind its
    /// `Arc`, its host, the header map's table at its capacity (and its list of repeated
    /// fields), and each field's own allocations, each allocation rounded up to its
    /// allocator size class, with the 32-byte share record `Bytes` adds once an answer has
    /// been served from it. Counting less lets the resident memory outgrow `--cache-size`
    /// (e2e/bench/cache-memory.sh: small answers held about 2.5 times what a count of their
    /// bytes alone said).
    pub(crate) fn measure(&self) -> u64 {
        const BUCKET: usize =
            std::mem::size_of::<HeaderName>() + std::mem::size_of::<HeaderValue>() + 40;
        const EXTRA: usize = 72;
        const SHARED: usize = 32;
        let fields: usize = self
            .headers
            .iter()
            .map(|(n, v)| size_class(n.as_str().len()) + size_class(v.len()) + 2 * SHARED)
            .sum();
        let cap = self.headers.capacity();
        let repeated = self.headers.len() - self.headers.keys_len();
        let extra = if repeated == 0 {
            0
        } else {
            size_class(repeated.next_power_of_two().max(4) * EXTRA)
        };
        let table = size_class(cap * BUCKET) + size_class(cap.next_power_of_two() * 4) + extra;
        (size_class(self.body.len())
            + SHARED
            + size_class(std::mem::size_of::<Self>() + 16)
            + size_class(self.host.len() + 16)
            + table
            + fields) as u64
    }

    /// Its current age (§4.2.3 `current_age`).
    pub(crate) fn age(&self) -> Duration {
        self.initial_age + self.stored.elapsed()
    }

    pub(crate) fn freshness(&self) -> Freshness {
        let age = self.age();
        // `no-cache`: every use is a revalidation (§5.2.2.4).
        if age < self.lifetime && !self.directives.no_cache {
            return Freshness::Fresh;
        }
        if self.directives.no_stale() || self.directives.no_cache {
            return Freshness::Stale;
        }
        let past = age.saturating_sub(self.lifetime);
        if past < self.stale_while_revalidate {
            Freshness::StaleRevalidate
        } else if past < self.stale_if_error {
            Freshness::StaleIfError
        } else {
            Freshness::Stale
        }
    }

    /// Within `staleIfError` now (an upstream failure may be answered from it).
    pub(crate) fn serves_on_error(&self) -> bool {
        !self.directives.no_stale()
            && !self.directives.no_cache
            && self.age().saturating_sub(self.lifetime) < self.stale_if_error
    }

    /// It has a validator to revalidate with.
    pub(crate) fn validators(&self) -> bool {
        self.headers.contains_key(ETAG) || self.headers.contains_key(LAST_MODIFIED)
    }

    /// Sets the request's conditional fields to revalidate this entry (the client's own
    /// are answered from the entry afterwards, module `flow`).
    pub(crate) fn revalidate(&self, request: &mut HeaderMap) {
        request.remove(IF_NONE_MATCH);
        request.remove(IF_MODIFIED_SINCE);
        request.remove(http::header::IF_MATCH);
        request.remove(http::header::IF_UNMODIFIED_SINCE);
        if let Some(etag) = self.headers.get(ETAG) {
            request.insert(IF_NONE_MATCH, etag.clone());
        }
        if let Some(lm) = self.headers.get(LAST_MODIFIED) {
            request.insert(IF_MODIFIED_SINCE, lm.clone());
        }
    }

    /// A copy refreshed by a 304 (§4.3.4): its headers updated from the 304's (but not the
    /// framing), its age starting again.
    pub(crate) fn refreshed(&self, not_modified: &HeaderMap, fresh: Fresh) -> Entry {
        let mut headers = self.headers.clone();
        for name in not_modified.keys() {
            if name == CONTENT_LENGTH || *name == http::header::TRANSFER_ENCODING {
                continue;
            }
            headers.remove(name);
            for v in not_modified.get_all(name) {
                headers.append(name.clone(), v.clone());
            }
        }
        let directives = Directives::parse(&headers);
        let mut entry = Entry {
            status: self.status,
            headers: compact(&headers),
            body: self.body.clone(),
            directives,
            initial_age: fresh.initial_age,
            stored: Instant::now(),
            lifetime: fresh.lifetime,
            stale_while_revalidate: self.stale_while_revalidate,
            stale_if_error: self.stale_if_error,
            host: self.host.clone(),
            route: self.route.clone(),
            authorized_ok: self.authorized_ok,
            weight: 0,
        };
        entry.weight = entry.measure();
        entry
    }

    /// The answer to `method` with `X-Cache: outcome`: the stored one, or 304 when the
    /// client's own conditional fields match it (RFC 9110 §13.1.2, §13.1.3).
    pub(crate) fn answer(
        &self,
        method: &Method,
        request: &HeaderMap,
        outcome: &'static str,
    ) -> Response<ProxyBody> {
        let not_modified = self.matches_conditional(request);
        let body = if not_modified || *method == Method::HEAD {
            empty()
        } else {
            full(self.body.clone())
        };
        let mut resp = Response::new(body);
        *resp.status_mut() = if not_modified {
            StatusCode::NOT_MODIFIED
        } else {
            self.status
        };
        let h = resp.headers_mut();
        h.clone_from(&self.headers);
        if not_modified {
            h.remove(CONTENT_LENGTH);
        }
        h.insert(AGE, HeaderValue::from(self.age().as_secs()));
        h.insert(X_CACHE.clone(), HeaderValue::from_static(outcome));
        resp
    }

    /// The client's `If-None-Match` (weak comparison) or, without it, `If-Modified-Since`
    /// holds for this 200: the answer is 304.
    fn matches_conditional(&self, request: &HeaderMap) -> bool {
        if self.status != StatusCode::OK {
            return false;
        }
        if request.contains_key(IF_NONE_MATCH) {
            let Some(etag) = self.headers.get(ETAG).and_then(|v| v.to_str().ok()) else {
                return false;
            };
            let weak = |t: &str| t.trim().trim_start_matches("W/").to_owned();
            let ours = weak(etag);
            return request
                .get_all(IF_NONE_MATCH)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .any(|t| t.trim() == "*" || weak(t) == ours);
        }
        match (
            date(request, IF_MODIFIED_SINCE),
            date(&self.headers, LAST_MODIFIED),
        ) {
            (Some(since), Some(modified)) => modified <= since,
            _ => false,
        }
    }
}

/// Freshness of an answer as it arrives.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fresh {
    pub initial_age: Duration,
    pub lifetime: Duration,
}

impl Fresh {
    /// `lifetime` capped by `max`, with the age of an answer asked at `asked`.
    pub(crate) fn new(
        headers: &HeaderMap,
        lifetime: Duration,
        max: Option<Duration>,
        asked: SystemTime,
    ) -> Self {
        Self {
            initial_age: super::control::initial_age(headers, asked, SystemTime::now()),
            lifetime: max.map_or(lifetime, |m| lifetime.min(m)),
        }
    }
}

/// The bytes an allocation of `n` takes: jemalloc's size classes (16-byte steps to 128, then
/// four classes per doubling), which the system allocator's chunks come close to.
pub(crate) fn size_class(n: usize) -> usize {
    if n <= 128 {
        return n.div_ceil(16) * 16;
    }
    let step = n.next_power_of_two() / 8;
    n.div_ceil(step) * step
}

/// A copy of `headers` in allocations of its own. Header fields parsed off a connection
/// are slices of its read buffer (8 KiB and up): a stored entry holding them would keep the
/// whole buffer alive, many times what its weight counts, and the memory bound would not
/// hold.
pub(crate) fn compact(headers: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        let Ok(name) = HeaderName::from_bytes(name.as_str().as_bytes()) else {
            continue;
        };
        let Ok(mut v) = HeaderValue::from_bytes(value.as_bytes()) else {
            continue;
        };
        v.set_sensitive(value.is_sensitive());
        out.append(name, v);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Header fields hyper parses share the connection's read buffer; the stored copy must
    /// not point into it.
    #[test]
    fn compact_copies_values_out_of_a_shared_buffer() {
        let buffer = Bytes::from(vec![b'a'; 8192]);
        let range = buffer.as_ptr() as usize..buffer.as_ptr() as usize + buffer.len();
        let mut parsed = HeaderMap::new();
        let v = HeaderValue::from_maybe_shared(buffer.slice(0..16)).unwrap();
        assert!(
            range.contains(&(v.as_bytes().as_ptr() as usize)),
            "the test's premise"
        );
        parsed.insert(ETAG, v);
        let mut secret = HeaderValue::from_maybe_shared(buffer.slice(16..32)).unwrap();
        secret.set_sensitive(true);
        parsed.append(HeaderName::from_static("x-custom"), secret);
        let stored = compact(&parsed);
        assert_eq!(stored, parsed);
        for (_, v) in &stored {
            assert!(!range.contains(&(v.as_bytes().as_ptr() as usize)));
        }
        assert!(stored.get("x-custom").unwrap().is_sensitive());
    }

    #[test]
    fn size_classes_follow_the_allocators() {
        let classes: Vec<usize> = [1, 16, 17, 128, 129, 160, 161, 257, 1000, 4097]
            .into_iter()
            .map(size_class)
            .collect();
        assert_eq!(classes, [16, 16, 32, 128, 160, 160, 192, 320, 1024, 5120]);
    }
}
