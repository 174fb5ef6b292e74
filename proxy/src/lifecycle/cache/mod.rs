//! The shared HTTP cache (RFC 9111) of CachePolicy rules. In: requests on a rule with a
//! `cache` setting, after its policies admitted them (authentication and rate limits run
//! first, so a hit is authorized and counted), and the upstream's answers to those that
//! went on. Out: answers from the store (`X-Cache: HIT` or `STALE`, with `Age`), or the
//! upstream's (`MISS`, `BYPASS`), stored on the way when RFC 9111 and the rule allow.
//!
//! One store per [`HttpCache`] with one memory bound (bytes of bodies, headers and keys;
//! answers being copied for storage take at most a quarter more, module `fill`),
//! kept by quick_cache (S3-FIFO: a key seen once does not push out the ones in use, so a
//! scan of cold keys cannot flush the cache). Concurrent misses of one key make one
//! upstream request ([`flight`]); the others wait for it, no longer than the lock wait or
//! the request's deadline. A stale entry within `staleWhileRevalidate` answers at once and
//! hands a [`Refresh`] to module `lifecycle::refresh`, which revalidates it in the
//! background. The store keeps the identity body the upstream sent: compression (module
//! `compress`) runs per client after it, as for any other answer.
//!
//! Modules: `control` (Cache-Control, freshness, age), `key` (keys, Vary), `entry` (a
//! stored answer), `flight` (coalescing), `fill` (storing a body as it streams), `flow`
//! (the decisions of one request), `ticket` (a background revalidation's claim).

mod control;
mod entry;
mod fill;
mod flight;
mod flow;
mod key;
mod ticket;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use http::HeaderName;
use quick_cache::sync::Cache;
use quick_cache::{DefaultHashBuilder, Lifecycle, Weighter};

pub(crate) use flow::{Fill, Look, Request, finish_failed, look, response_filters};
pub(crate) use ticket::Refresh;

use crate::lifecycle::affinity::KeyExpr;
use crate::metrics::{CacheMetrics, Metrics};

/// What the store holds under a key: an answer, or for an answer with `Vary` the names
/// whose values select its variants (each stored under its secondary key).
#[derive(Debug, Clone)]
enum Slot {
    Entry(Arc<entry::Entry>),
    Vary(Arc<[HeaderName]>),
}

#[derive(Debug, Clone, Copy)]
struct Bytes;

/// quick_cache's shards: each holds a quarter of the bound.
const SHARDS: usize = 4;

/// What quick_cache keeps per key beside it: its slot (key, value, state), the table's index
/// and the ghost of an evicted key.
const SLOT_BYTES: u64 = 96;

impl Weighter<String, Slot> for Bytes {
    fn weight(&self, key: &String, val: &Slot) -> u64 {
        entry::size_class(key.capacity()) as u64
            + SLOT_BYTES
            + match val {
                Slot::Entry(e) => e.weight,
                Slot::Vary(names) => 64 + names.len() as u64 * 32,
            }
    }
}

/// Counts entries evicted for room.
#[derive(Debug, Clone)]
struct Evictions(prometheus_client::metrics::counter::Counter);

impl Lifecycle<String, Slot> for Evictions {
    type RequestState = ();

    fn on_evict(&self, _: &mut (), _key: String, _val: Slot) {
        self.0.inc();
    }
}

/// The proxy's shared cache: one memory bound for every route and Gateway it serves.
pub struct HttpCache {
    store: Cache<String, Slot, Bytes, DefaultHashBuilder, Evictions>,
    flights: flight::Flights,
    /// Key expressions compiled once per source (`None`: it does not compile).
    exprs: Mutex<HashMap<String, Option<Arc<KeyExpr>>>>,
    metrics: CacheMetrics,
    /// Moves on every purge and table swap: an answer fetched before it is not stored
    /// after it (a purged or re-scoped key is not filled from a request of the old scope).
    generation: AtomicU64,
    /// Bytes of answers being copied for storage now (outside the store until whole), and
    /// their bound: a quarter of the store's.
    buffering: AtomicU64,
    buffer_bound: u64,
    /// Places for background revalidations ([`ticket::MAX_REFRESHES`]).
    refreshes: Arc<tokio::sync::Semaphore>,
}

impl std::fmt::Debug for HttpCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpCache")
            .field("capacity", &self.store.capacity())
            .field("weight", &self.store.weight())
            .finish_non_exhaustive()
    }
}

/// What a purge removes: every entry matching all the fields given.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Purge {
    /// The normalized host (lower case, no port).
    pub host: Option<String>,
    /// The route, `namespace/name`.
    pub route: Option<String>,
    /// A prefix of the key, `METHOD scheme://host/path?query`.
    pub prefix: Option<String>,
}

impl HttpCache {
    /// A cache holding at most `bytes`, counting into `metrics`.
    pub fn new(bytes: u64, metrics: &Metrics) -> Arc<Self> {
        let m = metrics.cache().clone();
        let items = usize::try_from(bytes / 4096).unwrap_or(usize::MAX).max(64);
        // quick_cache refuses an item heavier than its shard's share of the bound; its
        // default of four shards per CPU would, on a large node, refuse answers far smaller
        // than `maxEntryBytes`. Four shards admit what the buffering bound (a quarter of
        // the cache) lets through.
        let mut options = quick_cache::OptionsBuilder::new();
        options
            .estimated_items_capacity(items)
            .weight_capacity(bytes)
            .shards(SHARDS);
        let store = match options.build() {
            Ok(o) => Cache::with_options(
                o,
                Bytes,
                DefaultHashBuilder::default(),
                Evictions(m.evictions.clone()),
            ),
            Err(_) => Cache::with(
                items,
                bytes,
                Bytes,
                DefaultHashBuilder::default(),
                Evictions(m.evictions.clone()),
            ),
        };
        Arc::new(Self {
            store,
            flights: flight::Flights::default(),
            exprs: Mutex::new(HashMap::new()),
            metrics: m,
            generation: AtomicU64::new(0),
            buffering: AtomicU64::new(0),
            buffer_bound: bytes / 4,
            refreshes: Arc::new(tokio::sync::Semaphore::new(ticket::MAX_REFRESHES)),
        })
    }

    /// Removes what `p` names (a purge naming nothing removes everything); the number of
    /// entries removed.
    pub fn purge(&self, p: &Purge) -> usize {
        // Before the removal: a fill that checks the generation after inserting (`insert`)
        // either sees this one or inserted before the removal below runs.
        self.generation.fetch_add(1, Ordering::SeqCst);
        let before = self.store.len();
        let host = p.host.as_deref().map(str::to_ascii_lowercase);
        self.store.retain(|key, slot| {
            let (entry_host, route) = match slot {
                Slot::Entry(e) => (Some(&*e.host), e.route.as_deref()),
                // A Vary marker goes with its prefix or host (its variants follow by key).
                Slot::Vary(_) => (None, None),
            };
            let hit = p.prefix.as_deref().is_none_or(|pre| key.starts_with(pre))
                && host.as_deref().is_none_or(|h| {
                    entry_host.map_or_else(|| key_host(key) == Some(h), |eh| eh == h)
                })
                && p.route.as_deref().is_none_or(|r| route == Some(r));
            !hit
        });
        self.metrics.bytes.set(self.weight());
        before.saturating_sub(self.store.len())
    }

    /// Entries held (answers and Vary markers).
    pub fn len(&self) -> usize {
        self.store.len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.store.is_empty()
    }

    fn weight(&self) -> i64 {
        i64::try_from(self.store.weight()).unwrap_or(i64::MAX)
    }

    /// Takes `n` more bytes of the buffering bound; false (nothing taken) beyond it.
    fn reserve(&self, n: u64) -> bool {
        self.buffering
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                cur.checked_add(n).filter(|&t| t <= self.buffer_bound)
            })
            .is_ok()
    }

    /// Gives back `n` bytes [`HttpCache::reserve`] took.
    fn release(&self, n: u64) {
        self.buffering.fetch_sub(n, Ordering::AcqRel);
    }

    /// The routing table changed: answers fetched under the old one are not stored.
    pub(crate) fn table_changed(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// The generation a fetch starting now stores under.
    fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Stores `slot` under `key` unless the generation moved on from `generation` (a purge
    /// or a table swap since the fetch began); false when it did.
    fn insert(&self, generation: u64, key: String, slot: Slot) -> bool {
        if self.generation() != generation {
            return false;
        }
        self.store.insert(key.clone(), slot);
        // A purge between the check and the insert: undo it (the purge's removal may
        // have run before the insert).
        if self.generation() != generation {
            self.store.remove(&key);
            self.metrics.bytes.set(self.weight());
            return false;
        }
        self.metrics.bytes.set(self.weight());
        true
    }

    fn get(&self, key: &str) -> Option<Slot> {
        self.store.get(key)
    }

    /// The compiled key expression of `source`.
    fn expr(&self, source: &str) -> Option<Arc<KeyExpr>> {
        let mut exprs = match self.exprs.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(e) = exprs.get(source) {
            return e.clone();
        }
        // Bounded by the configuration, not by traffic.
        let e = KeyExpr::compile(source).ok().map(Arc::new);
        exprs.insert(source.to_owned(), e.clone());
        e
    }
}

/// The host of a key `METHOD scheme://host/...`.
fn key_host(key: &str) -> Option<&str> {
    let rest = key.split_once("://")?.1;
    Some(rest.split(['/', '?', ' ']).next().unwrap_or(rest))
}

/// The default memory bound of a proxy's cache (`--cache-size`): small enough to go
/// unnoticed beside the proxy, and used only by routes a CachePolicy names.
pub const DEFAULT_CACHE_SIZE: &str = "64Mi";

/// A size as `--cache-size` takes it: bytes, or with a suffix `Ki`, `Mi`, `Gi` (powers of
/// 1024) or `k`, `M`, `G` (powers of 1000), as Kubernetes quantities; `0` is no cache.
pub fn parse_cache_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?}: expected a number of bytes, e.g. 256Mi"))?;
    let mult: u64 = match unit {
        "" => 1,
        "k" => 1000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        _ => {
            return Err(format!(
                "{s:?}: unknown unit {unit:?} (Ki, Mi, Gi, k, M, G)"
            ));
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s:?}: too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_cache_size("256Mi"), Ok(256 << 20));
        assert_eq!(parse_cache_size("1G"), Ok(1_000_000_000));
        assert_eq!(parse_cache_size("0"), Ok(0));
        assert!(parse_cache_size("12Q").is_err());
        assert!(parse_cache_size("Mi").is_err());
    }

    #[test]
    fn key_hosts() {
        assert_eq!(key_host("GET http://a.example/x?y"), Some("a.example"));
        assert_eq!(key_host("GET http://a.example?y"), Some("a.example"));
    }
}
