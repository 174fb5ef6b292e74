//! The decision cache of one external rule. In: a key ([`key`]: SHA-256 of the rule id and
//! every attribute the service is shown) and the service's decision. Out: the decision again
//! while it is younger than the rule's `cacheTTL`. Bounded by quick_cache (CLOCK-Pro
//! eviction); an expired entry is replaced on the next miss.

use std::time::{Duration, Instant};

use ::http::{HeaderMap, HeaderName};
use sha2::{Digest, Sha256};

use super::{CheckInput, Decision};

/// A bounded map from attribute digests to decisions with their expiry.
pub(super) struct DecisionCache {
    entries: quick_cache::sync::Cache<[u8; 32], (Instant, Decision)>,
    ttl: Duration,
}

impl std::fmt::Debug for DecisionCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecisionCache")
            .field("ttl", &self.ttl)
            .field("entries", &self.entries.len())
            .finish()
    }
}

impl DecisionCache {
    pub(super) fn new(capacity: usize, ttl: Duration) -> Self {
        Self {
            entries: quick_cache::sync::Cache::new(capacity.max(1)),
            ttl,
        }
    }

    /// The live decision under `key`.
    pub(super) fn get(&self, key: &[u8; 32]) -> Option<Decision> {
        let (expires, d) = self.entries.get(key)?;
        (Instant::now() < expires).then_some(d)
    }

    pub(super) fn insert(&self, key: [u8; 32], d: Decision) {
        self.entries.insert(key, (Instant::now() + self.ttl, d));
    }
}

/// The digest of everything a check shows the service (but the client's port): rule id,
/// method, scheme, host, path with query, the client's IP, the forwarded headers (`names`; all of them when empty and
/// the protocol forwards all) and the body. Each part is length-prefixed, so no two
/// different requests share a key by shifting bytes from one part to the next.
pub(super) fn key(id: &str, input: &CheckInput<'_>, names: &[HeaderName]) -> [u8; 32] {
    let mut h = Sha256::new();
    let mut part = |b: &[u8]| {
        h.update((b.len() as u64).to_le_bytes());
        h.update(b);
    };
    part(id.as_bytes());
    part(input.method.as_str().as_bytes());
    part(input.scheme.as_bytes());
    part(input.host.as_bytes());
    part(input.target.as_bytes());
    match input.peer.ip() {
        std::net::IpAddr::V4(a) => part(&a.octets()),
        std::net::IpAddr::V6(a) => part(&a.octets()),
    }
    let mut headers = |map: &HeaderMap, name: &HeaderName| {
        for v in map.get_all(name) {
            part(name.as_str().as_bytes());
            part(v.as_bytes());
        }
    };
    if names.is_empty() {
        for name in input.headers.keys() {
            headers(input.headers, name);
        }
    } else {
        for name in names {
            headers(input.headers, name);
        }
    }
    part(b"body");
    part(input.body.map_or(&[][..], |b| &b[..]));
    h.finalize().into()
}
