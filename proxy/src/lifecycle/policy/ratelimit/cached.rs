//! Counters decided locally and shared through Redis in batches: [`super::Storage::RedisCached`].
//!
//! In: the rates of a limit, a counter key and `now` per request; a flush every
//! `flush_interval`. Out: a [`Decision`] per request, taken without a network call.
//!
//! Each replica keeps, per counter, a *view*: the counter's state as Redis last returned it,
//! plus the requests this replica admitted since (its *pending* hits, in [`Segment`]s so each
//! lands in the window it happened in). A request is decided on the view, so a replica
//! counts its own traffic exactly and everyone else's as of its last sync. A flush sends every
//! counter's pending hits in one script call per counter (concurrent calls, pipelined on the
//! multiplexed connection) and replaces the view with what Redis returns (the global count,
//! everyone's flushed hits included) plus the hits admitted while the call was in flight.
//!
//! A counter is synced before a decision (the request waits one round trip) only when this
//! replica has never synced it or has not for two flush intervals: its first request after a
//! restart or an idle period sees the global count, not zero.
//!
//! # Overshoot bound
//!
//! Replicas admit against views that miss the other replicas' recent admits, so the global
//! count can pass the limit. With `R` replicas and `A` the most requests one replica admits
//! on one counter during three flush intervals, a counter never exceeds
//! `limit + (R − 1) × A`, and never `R × limit` whatever the traffic (each replica's view
//! counts all of its own admits). Why: a view
//! is at most two intervals old when used, and another replica's admits reach Redis within
//! one interval, so a view misses at most three intervals of each other replica's admits.
//! When every replica flushes at the same instants (the integration test), a view misses at
//! most the admits since the previous flush round and the one before it. A token bucket may
//! go into debt by the same amount, repaid by refill before it admits again.
//!
//! While Redis is down the views simply keep counting local traffic (the fallback: never
//! unlimited) and pending hits wait, at most [`MAX_SEGMENTS`] per counter, until it is back.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use futures_util::future::join_all;

use super::Clock;
use super::algo::{self, Cost, RateState, Segment, Spec};
use super::decision::Decision;
use super::memory::SHARDS;
use super::redis::{Op, RedisBackend};

/// Pending segments kept per counter while Redis is unreachable; older ones are dropped
/// (they belong to windows long gone unless windows are shorter than the outage).
pub(crate) const MAX_SEGMENTS: usize = 8;
/// Counters synced concurrently in one flush batch.
const FLUSH_BATCH: usize = 256;

#[derive(Debug)]
struct View {
    specs: Vec<Spec>,
    states: Vec<RateState>,
    pending: Vec<Segment>,
    /// When Redis last returned this counter (clock ms), `None` = never.
    synced_at: Option<i64>,
    expires_at: i64,
}

impl View {
    fn new(specs: &[Spec], now: i64) -> Self {
        Self {
            specs: specs.to_vec(),
            states: specs.iter().map(|s| s.fresh(now)).collect(),
            pending: Vec::new(),
            synced_at: None,
            expires_at: now,
        }
    }

    /// Notes `hits` units counted at `now` for the next flush.
    fn push_hits(&mut self, now: i64, hits: i64) {
        if hits <= 0 {
            return;
        }
        match self.pending.last_mut() {
            Some(last) if algo::same_segment(&self.specs, last.at, now) => {
                last.hits = last.hits.saturating_add(hits)
            }
            _ => {
                self.pending.push(Segment { at: now, hits });
                if self.pending.len() > MAX_SEGMENTS {
                    self.pending.remove(0);
                }
            }
        }
    }

    fn expiry(&self, now: i64) -> i64 {
        now + algo::idle_ttl(&self.specs, &self.states, now)
    }
}

#[derive(Debug)]
struct Entry {
    view: Mutex<View>,
    /// Held across a sync of this counter so syncs never overlap (their answers would race).
    gate: tokio::sync::Mutex<()>,
}

impl Entry {
    fn view(&self) -> MutexGuard<'_, View> {
        self.view.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Counters of one shard, by key.
type Shard = HashMap<String, Arc<Entry>>;

/// The cached store.
#[derive(Debug)]
pub(crate) struct CachedStore {
    backend: Arc<RedisBackend>,
    shards: Box<[Mutex<Shard>]>,
    hasher: super::KeyHasher,
    flush_interval: Duration,
    clock: Arc<dyn Clock>,
    /// Set once the background flusher runs (started by the first decision, which is the
    /// first moment a tokio runtime is certain to exist).
    flusher: AtomicBool,
    this: Weak<CachedStore>,
}

impl CachedStore {
    /// The store; its flusher runs from the first decision on.
    pub fn new(
        backend: Arc<RedisBackend>,
        flush_interval: Duration,
        clock: Arc<dyn Clock>,
    ) -> Arc<Self> {
        Arc::new_cyclic(|this| Self {
            backend,
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: super::KeyHasher::new(),
            flush_interval,
            clock,
            flusher: AtomicBool::new(false),
            this: this.clone(),
        })
    }

    fn start_flusher(&self) {
        if self.flusher.load(Ordering::Relaxed) || self.flusher.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(flush_loop(self.this.clone(), self.flush_interval));
        }
    }

    pub fn backend(&self) -> &Arc<RedisBackend> {
        &self.backend
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, Shard> {
        let i = (self.hasher.hash(key) as usize) & (SHARDS - 1);
        self.shards[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn stale_after_ms(&self) -> i64 {
        i64::try_from(2 * self.flush_interval.as_millis()).unwrap_or(i64::MAX)
    }

    /// Decides one request of cost `cost` on the counter `key`.
    pub async fn check_cost(&self, specs: &[Spec], key: &str, now: i64, cost: Cost) -> Decision {
        let entry = self.live_entry(specs, key, now).await;
        let mut view = entry.view();
        let view = &mut *view;
        if view.specs != specs {
            // Reconfigured again meanwhile (two tables in flight): decide on a new counter.
            *view = View::new(specs, now);
        }
        let allowed = algo::decide_cost(&view.specs, &mut view.states, now, cost);
        if allowed {
            view.push_hits(now, cost.take);
        }
        view.expires_at = view.expiry(now);
        algo::decision_n(&view.specs, &view.states, now, allowed, cost.need)
    }

    /// Counts `units` on the counter `key` after the fact (see [`algo::add`]), in the view
    /// and in the hits the next flush sends; the numbers after.
    pub async fn add(&self, specs: &[Spec], key: &str, now: i64, units: i64) -> Decision {
        let entry = self.live_entry(specs, key, now).await;
        let mut view = entry.view();
        let view = &mut *view;
        if view.specs != specs {
            *view = View::new(specs, now);
        }
        algo::add(&view.specs, &mut view.states, now, units);
        view.push_hits(now, units);
        view.expires_at = view.expiry(now);
        algo::decision(&view.specs, &view.states, now, true)
    }

    /// The entry of `key`, synced first when this replica never synced it or not lately.
    async fn live_entry(&self, specs: &[Spec], key: &str, now: i64) -> Arc<Entry> {
        self.start_flusher();
        let entry = {
            let mut shard = self.shard(key);
            match shard.get(key) {
                Some(entry) => entry.clone(),
                None => {
                    let entry = Arc::new(Entry {
                        view: Mutex::new(View::new(specs, now)),
                        gate: tokio::sync::Mutex::new(()),
                    });
                    shard.insert(key.to_owned(), entry.clone());
                    entry
                }
            }
        };
        {
            let mut view = entry.view();
            if view.specs != specs {
                // The limit was reconfigured: a new counter, loaded below like any new one
                // (pending hits of the old rates are dropped: nothing reads those any more).
                *view = View::new(specs, now);
            }
        }
        if self.needs_sync(&entry, now) && !self.backend.is_down() {
            let _gate = entry.gate.lock().await;
            // Another request may have synced it while this one waited.
            if self.needs_sync(&entry, now) && !self.backend.is_down() {
                self.sync(key, &entry, now).await;
            }
        }
        entry
    }

    fn needs_sync(&self, entry: &Entry, now: i64) -> bool {
        entry
            .view()
            .synced_at
            .is_none_or(|at| now - at > self.stale_after_ms())
    }

    /// Sends the pending hits of `key` and takes the global state as the new view. The
    /// caller holds the entry's gate.
    async fn sync(&self, key: &str, entry: &Entry, now: i64) {
        let (specs, sent) = {
            let mut view = entry.view();
            (view.specs.clone(), std::mem::take(&mut view.pending))
        };
        let reply = self.backend.call(key, &specs, now, Op::Sync(&sent)).await;
        let mut view = entry.view();
        if view.specs != specs {
            return;
        }
        match reply {
            Some(reply) => {
                // Global state, plus what this replica admitted while the call was out.
                view.states = reply.states;
                let View {
                    specs,
                    states,
                    pending,
                    ..
                } = &mut *view;
                algo::record(specs, states, pending);
                view.synced_at = Some(now);
                view.expires_at = view.expiry(now);
            }
            None => {
                // Keep the hits for the next flush, oldest first.
                let newer = std::mem::replace(&mut view.pending, sent);
                for seg in newer {
                    match view.pending.last_mut() {
                        Some(last) if algo::same_segment(&specs, last.at, seg.at) => {
                            last.hits += seg.hits
                        }
                        _ => view.pending.push(seg),
                    }
                }
                let excess = view.pending.len().saturating_sub(MAX_SEGMENTS);
                view.pending.drain(..excess);
            }
        }
    }

    /// Syncs every counter with pending hits, and forgets idle ones.
    pub async fn flush(&self) {
        let now = i64::try_from(self.clock.now_ms()).unwrap_or(i64::MAX);
        let mut due: Vec<(String, Arc<Entry>)> = Vec::new();
        for shard in self.shards.iter() {
            let mut map = shard.lock().unwrap_or_else(PoisonError::into_inner);
            map.retain(|key, entry| {
                let view = entry.view();
                if !view.pending.is_empty() {
                    due.push((key.clone(), entry.clone()));
                    return true;
                }
                // Idle long enough to be fresh and nobody holds it (a request clones the
                // Arc under this same shard lock): forget it.
                view.expires_at > now || Arc::strong_count(entry) > 1
            });
        }
        if self.backend.is_down() {
            return;
        }
        for batch in due.chunks(FLUSH_BATCH) {
            join_all(batch.iter().map(|(key, entry)| async move {
                // A request is syncing it right now: that sync carries the pending hits.
                if let Ok(_gate) = entry.gate.try_lock() {
                    self.sync(key, entry, now).await;
                }
            }))
            .await;
        }
    }
}

async fn flush_loop(store: Weak<CachedStore>, every: Duration) {
    let mut tick = tokio::time::interval(every.max(Duration::from_millis(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(store) = store.upgrade() else {
            return;
        };
        store.flush().await;
    }
}
