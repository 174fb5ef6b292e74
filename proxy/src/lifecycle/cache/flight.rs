//! Request coalescing. In: the primary key of a request that missed. Out: either the lead
//! ([`Lead`], the one request that goes upstream for the key) or a wait for the lead to end
//! ([`Wait`]). The lead ends when its answer is stored, found not storable, fails, or its
//! request goes away (the [`Lead`] is dropped), and every waiter then looks again; a waiter
//! never takes the lead's answer from anywhere but the store, so an error is never fanned
//! out.

use std::sync::{Arc, Mutex};

use tokio::sync::watch;

/// The keys being fetched, each with the receiver its waiters clone.
#[derive(Debug, Default)]
pub(super) struct Flights(Mutex<crate::FastMap<String, watch::Receiver<()>>>);

/// The one request fetching a key; dropping it releases the waiters.
#[derive(Debug)]
pub(crate) struct Lead {
    cache: Arc<super::HttpCache>,
    key: String,
    /// Dropped with the lead: every waiter's `changed()` then returns.
    _tx: watch::Sender<()>,
}

impl Drop for Lead {
    fn drop(&mut self) {
        let mut map = self.cache.flights.lock();
        // Ours unless a later lead took the key (ours ended before it: ours is closed).
        if map
            .get(&self.key)
            .is_some_and(|rx| rx.same_channel(&self._tx.subscribe()))
        {
            map.remove(&self.key);
        }
    }
}

/// Another request leads the key: wait for it.
pub(crate) struct Wait(watch::Receiver<()>);

impl Wait {
    /// Until the lead ends.
    pub(crate) async fn done(mut self) {
        // Nothing is ever sent: `Err` is the lead's end (its sender dropped).
        while self.0.changed().await.is_ok() {}
    }
}

impl Flights {
    fn lock(&self) -> std::sync::MutexGuard<'_, crate::FastMap<String, watch::Receiver<()>>> {
        match self.0.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

/// Takes the lead of `key`, or the wait for its lead.
pub(crate) fn lead_or_wait(cache: &Arc<super::HttpCache>, key: &str) -> Result<Lead, Wait> {
    let mut map = cache.flights.lock();
    if let Some(rx) = map.get(key)
        && rx.has_changed().is_ok()
    {
        return Err(Wait(rx.clone()));
    }
    let (tx, rx) = watch::channel(());
    map.insert(key.to_owned(), rx);
    drop(map);
    Ok(Lead {
        cache: cache.clone(),
        key: key.to_owned(),
        _tx: tx,
    })
}

impl Flights {
    /// Some request is fetching `key` now.
    pub(crate) fn busy(&self, key: &str) -> bool {
        self.lock()
            .get(key)
            .is_some_and(|rx| rx.has_changed().is_ok())
    }
}
