//! Shared-cache metrics (module `lifecycle::cache`): answers by outcome (`hit`, `miss`,
//! `stale`, `bypass`), requests that waited for another's upstream fetch (coalesced),
//! background revalidations (started, running), answers not stored for the buffering bound,
//! entries evicted for room, and the bytes stored. Registered with the others under
//! `tollgate_`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels of `tollgate_cache_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

/// The cache's handles, resolved once (cloning shares them).
#[derive(Debug, Clone, Default)]
pub(crate) struct CacheMetrics {
    requests: Family<OutcomeLabels, Counter>,
    pub hits: Counter,
    pub misses: Counter,
    pub stale: Counter,
    pub bypass: Counter,
    pub coalesced: Counter,
    /// Background revalidations started, and running now.
    pub refreshes: Counter,
    pub refreshing: Gauge,
    pub evictions: Counter,
    /// Answers streamed unstored because too many bytes were being stored at once.
    pub buffer_full: Counter,
    pub bytes: Gauge,
}

impl CacheMetrics {
    pub(crate) fn new() -> Self {
        let requests = Family::<OutcomeLabels, Counter>::default();
        let of = |outcome| requests.get_or_create(&OutcomeLabels { outcome }).clone();
        Self {
            hits: of("hit"),
            misses: of("miss"),
            stale: of("stale"),
            bypass: of("bypass"),
            requests,
            coalesced: Counter::default(),
            refreshes: Counter::default(),
            refreshing: Gauge::default(),
            evictions: Counter::default(),
            buffer_full: Counter::default(),
            bytes: Gauge::default(),
        }
    }

    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "cache_requests",
            "Requests on cached routes by outcome (hit, miss, stale, bypass)",
            self.requests.clone(),
        );
        registry.register(
            "cache_coalesced",
            "Requests that waited for another request's upstream fetch of the same key",
            self.coalesced.clone(),
        );
        registry.register(
            "cache_refreshes",
            "Background revalidations of stale entries started (staleWhileRevalidate)",
            self.refreshes.clone(),
        );
        registry.register(
            "cache_refreshing",
            "Background revalidations running now",
            self.refreshing.clone(),
        );
        registry.register(
            "cache_evictions",
            "Cache entries evicted to stay under the memory bound",
            self.evictions.clone(),
        );
        registry.register(
            "cache_buffer_full",
            "Answers not stored because the bytes being stored at once reached their bound",
            self.buffer_full.clone(),
        );
        registry.register(
            "cache_bytes",
            "Bytes held by the shared cache (bodies, headers and keys)",
            self.bytes.clone(),
        );
    }
}
