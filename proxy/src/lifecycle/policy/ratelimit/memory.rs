//! Counters in this process: the default storage, and the fallback of the Redis storages.
//!
//! In: the rates of a limit, a counter key and `now`. Out: a [`Decision`]. The map is split
//! in [`SHARDS`] shards, each behind its own mutex, chosen by a hash of the key; a decision
//! holds one shard's lock for one hash lookup and a few integer operations, and never across
//! an `.await`, so replicas of the same key serialise (which is what makes the count exact)
//! while different keys rarely contend. The key is hashed once per decision (SipHash with a
//! random key, so clients cannot aim collisions at one slot): some bits pick the shard, the
//! shard's map uses the same hash as it is.
//!
//! Memory stays bounded by the keys in use: each entry carries the time from which it is as
//! good as fresh ([`super::algo::idle_ttl`]), and a shard drops such entries whenever it has
//! doubled in size since its last sweep or a sweep is [`SWEEP_EVERY_MS`] old. An expired
//! entry that is looked up again before a sweep is simply started afresh.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::algo::{self, Cost, RateState, Spec};
use super::decision::Decision;

/// Number of shards (a power of two).
pub(crate) const SHARDS: usize = 64;
/// A shard is swept at least this often (in its own time: when it is used).
pub(crate) const SWEEP_EVERY_MS: i64 = 10_000;
/// Below this many entries a shard does not sweep on growth.
const MIN_SWEEP_LEN: usize = 256;

/// One counter: the rates it was counted for, their states, and when it expires.
#[derive(Debug)]
struct Entry {
    specs: Vec<Spec>,
    states: Vec<RateState>,
    expires_at: i64,
}

/// A key and its hash.
#[derive(Debug)]
struct Key {
    hash: u64,
    key: Box<str>,
}

/// A key as a map looks it up: [`Key`], or a hash and a borrowed key.
trait Lookup {
    fn hash_value(&self) -> u64;
    fn key(&self) -> &str;
}

impl Lookup for Key {
    fn hash_value(&self) -> u64 {
        self.hash
    }

    fn key(&self) -> &str {
        &self.key
    }
}

impl Lookup for (u64, &str) {
    fn hash_value(&self) -> u64 {
        self.0
    }

    fn key(&self) -> &str {
        self.1
    }
}

impl<'a> Borrow<dyn Lookup + 'a> for Key {
    fn borrow(&self) -> &(dyn Lookup + 'a) {
        self
    }
}

impl Hash for dyn Lookup + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash_value());
    }
}

impl PartialEq for dyn Lookup + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.hash_value() == other.hash_value() && self.key() == other.key()
    }
}

impl Eq for dyn Lookup + '_ {}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        (self as &dyn Lookup) == (other as &dyn Lookup)
    }
}

impl Eq for Key {}

/// The hasher of a shard's map: the key's hash, as computed already.
#[derive(Debug, Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used (see `Hash for dyn Lookup`); fold anything else in.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[derive(Debug, Default)]
struct Shard {
    map: HashMap<Key, Entry, BuildHasherDefault<Prehashed>>,
    sweep_at_len: usize,
    last_sweep: i64,
}

impl Shard {
    fn sweep_if_due(&mut self, now: i64) {
        if self.map.len() >= self.sweep_at_len.max(MIN_SWEEP_LEN)
            || now - self.last_sweep >= SWEEP_EVERY_MS
        {
            self.sweep(now);
        }
    }

    fn sweep(&mut self, now: i64) {
        self.map.retain(|_, e| e.expires_at > now);
        self.sweep_at_len = 2 * self.map.len();
        self.last_sweep = now;
    }
}

/// The sharded in-memory counters.
#[derive(Debug)]
pub(crate) struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    hasher: super::KeyHasher,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    pub fn new() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            hasher: super::KeyHasher::new(),
        }
    }

    fn shard(&self, hash: u64) -> MutexGuard<'_, Shard> {
        // The length is a power of two. Bits 32 and up pick the shard: the map inside uses
        // the low bits (slot) and the top seven (tag) of the same hash.
        let i = ((hash >> 32) as usize) & (SHARDS - 1);
        // A panic while holding the lock cannot leave a counter half-written in a way that
        // matters (a few integers), so a poisoned shard is used as it is.
        self.shards[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Decides one request on the counter `key`.
    #[cfg(test)]
    pub fn check(&self, specs: &[Spec], key: &str, now: i64) -> Decision {
        self.check_hashed(specs, key, self.hasher.hash(key), now, Cost::ONE)
    }

    /// [`Self::check`] for a request of cost `cost`.
    pub fn check_cost(&self, specs: &[Spec], key: &str, now: i64, cost: Cost) -> Decision {
        self.check_hashed(specs, key, self.hasher.hash(key), now, cost)
    }

    /// Counts `units` on the counter `key` after the fact (see [`algo::add`]); the numbers
    /// after.
    pub fn add(&self, specs: &[Spec], key: &str, now: i64, units: i64) -> Decision {
        let hash = self.hasher.hash(key);
        self.with_entry(specs, key, hash, now, |entry| {
            algo::add(&entry.specs, &mut entry.states, now, units);
            entry.expires_at = now + algo::idle_ttl(&entry.specs, &entry.states, now);
            algo::decision(&entry.specs, &entry.states, now, true)
        })
    }

    /// [`Self::check_cost`] with the key's hash computed already (a limit's
    /// [`CompiledLimit::key_hash`](super::CompiledLimit::key_hash)): `hash` must be
    /// `KeyHasher::new().hash(key)`.
    pub fn check_hashed(
        &self,
        specs: &[Spec],
        key: &str,
        hash: u64,
        now: i64,
        cost: Cost,
    ) -> Decision {
        self.with_entry(specs, key, hash, now, |entry| decide(entry, now, cost))
    }

    /// Runs `f` on the live entry of `key` (created fresh when missing, reconfigured or
    /// expired) under its shard's lock.
    fn with_entry(
        &self,
        specs: &[Spec],
        key: &str,
        hash: u64,
        now: i64,
        f: impl FnOnce(&mut Entry) -> Decision,
    ) -> Decision {
        debug_assert_eq!(hash, self.hasher.hash(key), "not the key's hash");
        let mut shard = self.shard(hash);
        shard.sweep_if_due(now);
        match shard.map.get_mut(&(hash, key) as &dyn Lookup) {
            Some(entry) => {
                // Other rates (the limit was reconfigured), or idle long enough to be
                // fresh: start over.
                if entry.specs != specs || entry.expires_at <= now {
                    *entry = fresh_entry(specs, now);
                }
                f(entry)
            }
            None => {
                let mut entry = fresh_entry(specs, now);
                let d = f(&mut entry);
                shard.map.insert(
                    Key {
                        hash,
                        key: key.into(),
                    },
                    entry,
                );
                d
            }
        }
    }

    /// Entries held (expired ones included until swept).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).map.len())
            .sum()
    }

    /// Drops every expired entry now.
    #[cfg(test)]
    pub fn sweep(&self, now: i64) {
        for s in self.shards.iter() {
            s.lock().unwrap_or_else(PoisonError::into_inner).sweep(now);
        }
    }
}

fn decide(entry: &mut Entry, now: i64, cost: Cost) -> Decision {
    let allowed = algo::decide_cost(&entry.specs, &mut entry.states, now, cost);
    entry.expires_at = now + algo::idle_ttl(&entry.specs, &entry.states, now);
    algo::decision_n(&entry.specs, &entry.states, now, allowed, cost.need)
}

fn fresh_entry(specs: &[Spec], now: i64) -> Entry {
    Entry {
        specs: specs.to_vec(),
        states: specs.iter().map(|s| s.fresh(now)).collect(),
        expires_at: now,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tollgate_api::policy::{Algorithm, Rate};

    use super::*;

    fn specs(alg: Algorithm, limit: u64, window_ms: u64) -> Vec<Spec> {
        vec![Spec::new(alg, &Rate { limit, window_ms }).unwrap()]
    }

    #[test]
    fn counts_per_key() {
        let m = MemoryStore::new();
        let s = specs(Algorithm::FixedWindow, 2, 1_000);
        let admitted = |key: &str| (0..5).filter(|_| m.check(&s, key, 100).allowed).count();
        assert_eq!(admitted("a"), 2);
        assert_eq!(admitted("b"), 2);
        assert_eq!(admitted("a"), 0);
    }

    #[test]
    fn keys_with_the_same_hash_are_told_apart() {
        let m = MemoryStore::new();
        let s = specs(Algorithm::FixedWindow, 1, 1_000);
        let mut shard = m.shard(7);
        for key in ["a", "b"] {
            let mut e = fresh_entry(&s, 0);
            decide(&mut e, 0, Cost::ONE);
            shard.map.insert(
                Key {
                    hash: 7,
                    key: key.into(),
                },
                e,
            );
        }
        assert_eq!(shard.map.len(), 2);
        assert!(shard.map.get_mut(&(7_u64, "a") as &dyn Lookup).is_some());
        assert!(shard.map.get_mut(&(7_u64, "c") as &dyn Lookup).is_none());
        assert!(shard.map.get_mut(&(8_u64, "a") as &dyn Lookup).is_none());
    }

    #[test]
    fn a_reconfigured_limit_starts_its_counters_afresh() {
        let m = MemoryStore::new();
        let s2 = specs(Algorithm::FixedWindow, 2, 1_000);
        let s3 = specs(Algorithm::FixedWindow, 3, 1_000);
        assert_eq!((0..5).filter(|_| m.check(&s2, "k", 0).allowed).count(), 2);
        assert_eq!((0..5).filter(|_| m.check(&s3, "k", 0).allowed).count(), 3);
    }

    #[test]
    fn idle_keys_are_dropped_so_memory_stays_bounded() {
        let m = MemoryStore::new();
        let s = specs(Algorithm::SlidingWindow, 5, 1_000);
        for i in 0..10_000 {
            m.check(&s, &format!("client-{i}"), 0);
        }
        assert_eq!(m.len(), 10_000);
        // Two windows later every one of them is as good as fresh; new traffic sweeps them
        // out as it comes (a shard whose last sweep is old sweeps on its next use; with 50
        // keys per shard on average, every shard is used).
        let later = SHARDS * 50;
        for i in 0..later {
            m.check(&s, &format!("later-{i}"), 2_000 + SWEEP_EVERY_MS);
        }
        assert_eq!(m.len(), later, "only the keys in use remain");
        m.sweep(10 * SWEEP_EVERY_MS);
        assert_eq!(m.len(), 0);
    }

    #[test]
    fn growth_alone_triggers_sweeps() {
        let m = MemoryStore::new();
        let s = specs(Algorithm::FixedWindow, 5, 1_000);
        // Same time throughout (no age-based sweep): each key expires at the next window,
        // at t = 1000; keys are added at t = 1000 in the next window, so the old ones are
        // dropped as shards double.
        for i in 0..20_000 {
            m.check(&s, &format!("a{i}"), 999);
        }
        for i in 0..20_000 {
            m.check(&s, &format!("b{i}"), 1_000);
        }
        assert!(
            m.len() < 40_000,
            "old keys were swept on growth: {}",
            m.len()
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_tasks_on_one_key_admit_exactly_the_limit() {
        let m = Arc::new(MemoryStore::new());
        let s: Arc<[Spec]> = specs(Algorithm::TokenBucket, 37, 60_000).into();
        let tasks: Vec<_> = (0..100)
            .map(|_| {
                let (m, s) = (m.clone(), s.clone());
                tokio::spawn(async move { m.check(&s, "hot", 5).allowed })
            })
            .collect();
        let mut admitted = 0;
        for t in tasks {
            admitted += usize::from(t.await.unwrap());
        }
        assert_eq!(admitted, 37);
    }
}
