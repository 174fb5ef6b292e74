//! A background revalidation's claim on the store (`staleWhileRevalidate`). In: the lead of
//! a key whose entry is stale within its window, and a place among the refreshes the store
//! lets run at once. Out: the request fields the background request sends (the entry's
//! validators as its conditions) and the [`Fill`] that stores its answer; the place is
//! given back when the refresh ends (module `lifecycle::refresh` runs it).

use std::sync::Arc;

use http::HeaderMap;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::OwnedSemaphorePermit;

use super::HttpCache;
use super::entry::Entry;
use super::flow::Fill;

/// Background revalidations one proxy runs at once; a stale answer beyond them goes out
/// without one (the next request within the window tries again).
pub(crate) const MAX_REFRESHES: usize = 64;

/// One background revalidation, not yet started.
pub(crate) struct Refresh {
    fill: Box<Fill>,
    stale: Arc<Entry>,
    place: Place,
}

/// A place among the running refreshes (the `tollgate_cache_refreshing` gauge follows).
pub(crate) struct Place {
    _permit: OwnedSemaphorePermit,
    gauge: Gauge,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

impl Place {
    /// A place, when fewer than [`MAX_REFRESHES`] run.
    pub(super) fn take(cache: &HttpCache) -> Option<Self> {
        let permit = cache.refreshes.clone().try_acquire_owned().ok()?;
        cache.metrics.refreshing.inc();
        Some(Self {
            _permit: permit,
            gauge: cache.metrics.refreshing.clone(),
        })
    }
}

impl Refresh {
    pub(super) fn new(fill: Box<Fill>, stale: Arc<Entry>, place: Place) -> Self {
        Self { fill, stale, place }
    }

    /// The background request's fields: the client's, its own conditions replaced by the
    /// entry's validators (none when it has none: the answer is then a whole one).
    pub(crate) fn headers(&self, client: &HeaderMap) -> HeaderMap {
        let mut h = client.clone();
        self.stale.revalidate(&mut h);
        h
    }

    /// What stores the answer, and the place to hold until the refresh ends.
    pub(crate) fn start(self) -> (Box<Fill>, Place) {
        (self.fill, self.place)
    }
}
