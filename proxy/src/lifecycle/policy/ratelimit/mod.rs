//! Rate limits: RateLimitPolicy limits enforced per request, counted in this process or in
//! Redis shared by every replica.
//!
//! In: a table's [`tollgate_api::policy::RateLimit`]s, compiled once into
//! [`CompiledLimit`]s; per request, the request's CEL [`Activation`](crate::lifecycle::policy::cel::Activation)
//! (to decide whether a limit [applies](CompiledLimit::applies) and which counter it
//! [falls in](CompiledLimit::key); [`RateLimiter::check_applicable`] does both). Out: a
//! [`Decision`] per applicable limit (admitted or not, with the numbers for the
//! `X-RateLimit-*` and `Retry-After` headers), and [metrics](RateLimitMetrics).
//!
//! A limit counts 1 per request, or a cost: read from the request (`cost.request`,
//! admitted when the whole cost fits), or from the response
//! ([`RateLimiter::check_request`] leaves it [`Pending`]; [`RateLimiter::add_response_costs`]
//! counts it once the response head is known). A `mode: Shadow` limit counts as it would
//! enforced and never refuses: [`Checked`] names it instead.
//!
//! ```no_run
//! # async fn per_request(
//! #     table_limits: &[tollgate_api::policy::RateLimit],
//! #     act: &tollgate_proxy::policy::cel::Activation<'_>,
//! # ) -> Result<(), Box<dyn std::error::Error>> {
//! use tollgate_proxy::policy::ratelimit::{CompiledLimit, RateLimiter, Storage};
//!
//! // Once per deployment (the storage is a proxy setting, not a policy field):
//! let limiter = RateLimiter::new(Storage::redis("redis://redis.tollgate:6379"))?;
//! let mut registry = prometheus_client::registry::Registry::with_prefix("tollgate");
//! limiter.metrics().register(&mut registry);
//! // Once per table:
//! let limits = table_limits.iter().map(CompiledLimit::new).collect::<Result<Vec<_>, _>>()?;
//! // Per request, after authentication: the limits that apply, each on its counter.
//! if let Some(decision) = limiter.check_applicable(&limits, act).await {
//!     if !decision.allowed {
//!         // answer 429; decision.insert_headers(response.headers_mut())
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! Storage is chosen per deployment ([`Storage`]): in memory (default), in Redis with one
//! atomic script call per decision, or cached (decided locally, shared through Redis in
//! batches; see `cached.rs` for the overshoot bound). Whatever happens to Redis, a request
//! gets a decision, never an error and never "unlimited": an unreachable or slow Redis
//! (bounded by [`RedisOptions::call_timeout`]) switches to local counters until it answers
//! again. Counters are keyed by the limit id and the counter values only (`tollgate:rl:` +
//! [`CompiledLimit::key`]), and windows are aligned on the epoch, so replicas sharing Redis
//! count the same thing. Time is each replica's wall clock in milliseconds: clock skew
//! between replicas moves window edges by the skew and never makes a counter run backwards.

mod algo;
mod cached;
mod checked;
mod decision;
mod limit;
mod memory;
mod metrics;
mod redis;
mod redis_url;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use checked::{Checked, Pending};
pub use decision::{Decision, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET};
pub use limit::{CompiledLimit, LimitError};
pub use metrics::RateLimitMetrics;
pub use redis::{KEY_PREFIX, RedisOptions};

use algo::Cost;
use cached::CachedStore;
use checked::fold_decisions;
use memory::MemoryStore;
use redis::{Op, RedisBackend};

use crate::lifecycle::policy::cel::Activation;

/// Why a rate limiter could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RateLimitError {
    /// The Redis address is not one of the accepted forms (password redacted).
    #[error("invalid Redis address `{url}`: {reason}")]
    RedisUrl {
        /// The address, password replaced by `***`.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Where counters live; one choice per proxy deployment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Storage {
    /// In this process (each replica counts alone). The default.
    #[default]
    Memory,
    /// In Redis, one atomic script call per decision (replicas share exact counts).
    Redis {
        /// Address, one of:
        /// - `redis://[[user]:password@]host[:6379][/db]`, `redis+unix:///path[?db=N]`: one
        ///   server;
        /// - `redis+cluster://[[user]:password@]host1[:6379],host2[:6379],...`, or several
        ///   `redis://` URLs separated by commas: Redis Cluster, through these seed nodes;
        /// - `redis+sentinel://[[user]:password@]host1[:26379],host2,.../service[/db]`: the
        ///   master the sentinels name for `service` (asked again on every reconnection);
        ///   the credentials are the Redis servers', the sentinels are contacted without.
        ///
        /// `rediss://` (TLS) is not supported. Passwords are never logged.
        url: String,
        /// Timeouts.
        options: RedisOptions,
    },
    /// Decided locally, shared through Redis every `flush_interval`: about one Redis call
    /// per active counter per interval instead of one per request. The price is overshoot:
    /// with `R` replicas, a counter never exceeds `limit + (R − 1) × A`, where `A` is the
    /// most requests one replica admits on it during three flush intervals (and never
    /// `R × limit`).
    RedisCached {
        /// Address, as for [`Storage::Redis`].
        url: String,
        /// How often local counts are pushed and global counts pulled.
        flush_interval: Duration,
        /// Timeouts.
        options: RedisOptions,
    },
}

impl Storage {
    /// [`Storage::Redis`] with default timeouts.
    pub fn redis(url: impl Into<String>) -> Self {
        Self::Redis {
            url: url.into(),
            options: RedisOptions::default(),
        }
    }

    /// [`Storage::RedisCached`] with default timeouts.
    pub fn redis_cached(url: impl Into<String>, flush_interval: Duration) -> Self {
        Self::RedisCached {
            url: url.into(),
            flush_interval,
            options: RedisOptions::default(),
        }
    }
}

/// Wall-clock time in unix milliseconds; replaced by a [`ManualClock`] in tests.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Milliseconds since the unix epoch.
    fn now_ms(&self) -> u64;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }
}

/// A clock that moves only when told to.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// A clock showing `ms`.
    pub fn new(ms: u64) -> Self {
        Self(AtomicU64::new(ms))
    }

    /// Sets the time.
    pub fn set(&self, ms: u64) {
        self.0.store(ms, Ordering::SeqCst);
    }

    /// Moves the time forward.
    pub fn advance(&self, d: Duration) {
        self.0.fetch_add(
            u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

#[derive(Debug)]
enum Store {
    Memory(MemoryStore),
    Redis {
        backend: Arc<RedisBackend>,
        /// Counters used while Redis is down; forgotten as they expire once it is back.
        fallback: MemoryStore,
    },
    Cached(Arc<CachedStore>),
}

#[derive(Debug)]
struct Inner {
    store: Store,
    clock: Arc<dyn Clock>,
    metrics: RateLimitMetrics,
}

/// Decides requests against compiled limits. Cheap to clone (shared state).
#[derive(Debug, Clone)]
pub struct RateLimiter {
    inner: Arc<Inner>,
}

impl RateLimiter {
    /// A limiter on `storage`, with the system clock. Redis is connected in the background
    /// (or on the first decision); an unreachable Redis is not an error here, only a
    /// malformed address is.
    pub fn new(storage: Storage) -> Result<Self, RateLimitError> {
        Self::with_clock(storage, Arc::new(SystemClock))
    }

    /// A limiter reading time from `clock`.
    pub fn with_clock(storage: Storage, clock: Arc<dyn Clock>) -> Result<Self, RateLimitError> {
        Self::with_metrics(storage, clock, RateLimitMetrics::new())
    }

    /// An in-memory limiter on the system clock recording into `metrics` (cannot fail: there
    /// is no address to parse).
    pub fn in_memory(metrics: RateLimitMetrics) -> Self {
        Self {
            inner: Arc::new(Inner {
                store: Store::Memory(MemoryStore::new()),
                clock: Arc::new(SystemClock),
                metrics,
            }),
        }
    }

    /// A limiter recording into `metrics` (handles already registered with the proxy's).
    pub fn with_metrics(
        storage: Storage,
        clock: Arc<dyn Clock>,
        metrics: RateLimitMetrics,
    ) -> Result<Self, RateLimitError> {
        let store = match storage {
            Storage::Memory => Store::Memory(MemoryStore::new()),
            Storage::Redis { url, options } => Store::Redis {
                backend: RedisBackend::new(&url, options, metrics.clone())?,
                fallback: MemoryStore::new(),
            },
            Storage::RedisCached {
                url,
                flush_interval,
                options,
            } => Store::Cached(CachedStore::new(
                RedisBackend::new(&url, options, metrics.clone())?,
                flush_interval,
                clock.clone(),
            )),
        };
        Ok(Self {
            inner: Arc::new(Inner {
                store,
                clock,
                metrics,
            }),
        })
    }

    /// The limiter's metrics, to [register](RateLimitMetrics::register) with the proxy's.
    pub fn metrics(&self) -> &RateLimitMetrics {
        &self.inner.metrics
    }

    /// Decides one request on the counter `key` of `limit` (`key` from
    /// [`CompiledLimit::key`]): counts it if admitted. Never fails: without Redis the
    /// decision is taken on local counters.
    pub async fn check(&self, limit: &CompiledLimit, key: &str) -> Decision {
        let now = self.inner.clock.now_ms();
        self.check_at(limit, key, now).await
    }

    /// [`Self::check`] at an explicit time (unix ms), for tests and replays.
    pub async fn check_at(&self, limit: &CompiledLimit, key: &str, now_ms: u64) -> Decision {
        self.check_cost_at(limit, key, now_ms, Cost::ONE).await
    }

    /// [`Self::check_at`] for a request of cost `cost`.
    async fn check_cost_at(
        &self,
        limit: &CompiledLimit,
        key: &str,
        now_ms: u64,
        cost: Cost,
    ) -> Decision {
        let now = i64::try_from(now_ms).unwrap_or(i64::MAX);
        let specs = limit.specs();
        let decision = match &self.inner.store {
            Store::Memory(memory) => {
                return self.check_memory(memory, limit, key, None, now_ms, cost);
            }
            Store::Redis { backend, fallback } => {
                match backend.call(key, specs, now, Op::Check(cost)).await {
                    Some(reply) => {
                        algo::decision_n(specs, &reply.states, now, reply.allowed, cost.need)
                    }
                    None => fallback.check_cost(specs, key, now, cost),
                }
            }
            Store::Cached(cached) => cached.check_cost(specs, key, now, cost).await,
        };
        self.record(limit, decision);
        decision
    }

    /// [`Self::check_at`] on in-memory counters: nothing to await. `hash` is the key's hash
    /// when the caller has it ([`CompiledLimit::key_hash`]).
    fn check_memory(
        &self,
        memory: &MemoryStore,
        limit: &CompiledLimit,
        key: &str,
        hash: Option<u64>,
        now_ms: u64,
        cost: Cost,
    ) -> Decision {
        let now = i64::try_from(now_ms).unwrap_or(i64::MAX);
        let decision = match hash {
            Some(hash) => memory.check_hashed(limit.specs(), key, hash, now, cost),
            None => memory.check_cost(limit.specs(), key, now, cost),
        };
        self.record(limit, decision);
        decision
    }

    fn record(&self, limit: &CompiledLimit, decision: Decision) {
        limit.count_decision(decision.allowed);
        self.inner.metrics.decision_cached(
            limit.metrics_cache(),
            limit.policy_label(),
            decision.allowed,
            limit.is_shadow(),
        );
    }

    /// Counts `units` on the counter `key` of `limit` now, after the fact (a cost read from
    /// the response): whether they fit or not, the request was served; the next one pays.
    /// The numbers after. Never fails: without Redis, on local counters.
    pub async fn add(&self, limit: &CompiledLimit, key: &str, units: i64) -> Decision {
        let now = self.inner.clock.now_ms();
        self.add_at(limit, key, units, now).await
    }

    /// [`Self::add`] at an explicit time (unix ms).
    pub async fn add_at(
        &self,
        limit: &CompiledLimit,
        key: &str,
        units: i64,
        now_ms: u64,
    ) -> Decision {
        let now = i64::try_from(now_ms).unwrap_or(i64::MAX);
        let specs = limit.specs();
        match &self.inner.store {
            Store::Memory(memory) => memory.add(specs, key, now, units),
            Store::Redis { backend, fallback } => {
                match backend.call(key, specs, now, Op::Add(units)).await {
                    Some(reply) => algo::decision(specs, &reply.states, now, true),
                    None => fallback.add(specs, key, now, units),
                }
            }
            Store::Cached(cached) => cached.add(specs, key, now, units).await,
        }
    }

    /// Counts the response costs of the request [`Self::check_request`] left `pending`,
    /// read from its response's `status` and `headers`, but for those that read the body
    /// ([`CompiledLimit::response_body_cap`]), counted by [`Self::add_response_cost`] once it
    /// has ended. The numbers after, merged as [`Checked::decision`] is (enforced limits
    /// only); `None` when there is none.
    pub async fn add_response_costs(
        &self,
        pending: &[Pending<'_>],
        status: u16,
        headers: &http::HeaderMap,
    ) -> Option<Decision> {
        let mut out: Option<Decision> = None;
        for p in pending {
            if p.limit.response_body_cap().is_some() {
                continue;
            }
            let Some(d) = self
                .add_response_cost(p.limit, &p.key, status, headers, None)
                .await
            else {
                continue;
            };
            if !p.limit.is_shadow() {
                out = Some(out.map_or(d, |prev| prev.merge(d)));
            }
        }
        out
    }

    /// Counts the `cost.response` of `limit` on the counter `key`, read from a response's
    /// `status`, `headers` and `body` (the body as JSON, when it was read): a failed
    /// expression counts 1 and is counted in the metrics. The numbers after; `None` when the
    /// limit's cost is not read from the response.
    pub async fn add_response_cost(
        &self,
        limit: &CompiledLimit,
        key: &str,
        status: u16,
        headers: &http::HeaderMap,
        body: Option<&serde_json::Value>,
    ) -> Option<Decision> {
        let (units, failed) = limit.response_cost(status, headers, body)?;
        if failed {
            self.inner.metrics.cost_error(limit.policy_label());
            tracing::debug!(
                limit = limit.id(),
                "rate limit: cost.response did not give a non-negative integer; counted 1"
            );
        }
        Some(self.add(limit, key, units).await)
    }

    /// Decides one request against every applicable limit, in order, stopping at the first
    /// refusal; `None` when `checks` is empty. Limits checked before a refusing one have
    /// counted the request (each limit is atomic on its own, not the set).
    pub async fn check_all<K: AsRef<str>>(
        &self,
        checks: &[(&CompiledLimit, K)],
    ) -> Option<Decision> {
        let mut out: Option<Decision> = None;
        for (limit, key) in checks {
            let d = self.check(limit, key.as_ref()).await;
            out = Some(match out {
                Some(prev) => prev.merge(d),
                None => d,
            });
            if !d.allowed {
                break;
            }
        }
        out
    }

    /// [`Self::check_request`]'s decision alone.
    pub async fn check_applicable(
        &self,
        limits: &[CompiledLimit],
        act: &Activation<'_>,
    ) -> Option<Decision> {
        self.check_request(limits, act).await.decision
    }

    /// Decides the request of `act` on those of `limits` that
    /// [apply](CompiledLimit::applies), each on its [key](CompiledLimit::key) and at its
    /// [cost](CompiledLimit::request_cost): what the policy phase calls. Enforced limits
    /// are decided in order until one refuses (a limit after a refusal is not evaluated);
    /// a shadow limit is counted exactly as it would be enforced, its refusal only noted,
    /// and never stops the limits after it. With in-memory storage nothing awaits and keys
    /// are built in a buffer the thread reuses; otherwise in one buffer per call.
    pub async fn check_request<'l>(
        &self,
        limits: &'l [CompiledLimit],
        act: &Activation<'_>,
    ) -> Checked<'l> {
        if let Store::Memory(memory) = &self.inner.store {
            return KEY_BUFFERS.with_borrow_mut(|buffers| {
                let out = fold_decisions(limits, act, buffers, |limit, key, hash, cost| {
                    if cost.failed {
                        self.cost_failed(limit);
                    }
                    let now = self.inner.clock.now_ms();
                    self.check_memory(memory, limit, key, Some(hash), now, cost.cost)
                });
                buffers.trim();
                out
            });
        }
        let mut key = String::with_capacity(64);
        let mut out = Checked::default();
        for limit in limits {
            if !limit.applies(act) {
                continue;
            }
            key.clear();
            limit.key_into(act, &mut key);
            let cost = self.request_cost(limit, act);
            let now = self.inner.clock.now_ms();
            let d = self.check_cost_at(limit, &key, now, cost).await;
            if out.fold(limit, &key, d) {
                break;
            }
        }
        out
    }

    /// The request's cost on `limit`, a failed expression counted in the metrics.
    fn request_cost(&self, limit: &CompiledLimit, act: &Activation<'_>) -> Cost {
        let c = limit.request_cost(act);
        if c.failed {
            self.cost_failed(limit);
        }
        c.cost
    }

    /// A `cost.request` of `limit` did not give a non-negative integer (it counted 1).
    fn cost_failed(&self, limit: &CompiledLimit) {
        self.inner.metrics.cost_error(limit.policy_label());
        tracing::debug!(
            limit = limit.id(),
            "rate limit: cost.request did not give a non-negative integer; counted 1"
        );
    }

    /// Cached storage: pushes pending counts to Redis and pulls global ones now (the
    /// background flusher does this every flush interval). Other storages: nothing.
    pub async fn flush(&self) {
        if let Store::Cached(cached) = &self.inner.store {
            cached.flush().await;
        }
    }

    /// True while decisions fall back to local counters because Redis is unavailable.
    pub fn in_fallback(&self) -> bool {
        match &self.inner.store {
            Store::Memory(_) => false,
            Store::Redis { backend, .. } => backend.is_down(),
            Store::Cached(cached) => cached.backend().is_down(),
        }
    }
}

/// The hash of counter keys: SipHash-1-3 (keys come from clients, so collisions must not be
/// aimable) under keys drawn once per process from std's random state, over the key's bytes in
/// one call (std's `Hash for str` feeds SipHash twice, which cost more than the rest of a
/// decision's lookup).
///
/// Every key of a limit starts with the limit's own prefix, so a limit keeps a hasher that
/// has read that prefix already ([`KeyHasher::after_prefix`]): per request only the counter
/// values are hashed, and the hash is the same as [`KeyHasher::new`] gives for the whole key.
#[derive(Debug, Clone)]
pub(crate) struct KeyHasher {
    sip: siphasher::sip::SipHasher13,
    /// Bytes of every key this hasher has read already (a multiple of 8).
    skip: usize,
}

/// The process's keys of [`KeyHasher`].
static KEY_HASHER: std::sync::LazyLock<siphasher::sip::SipHasher13> =
    std::sync::LazyLock::new(|| {
        use std::hash::{BuildHasher, RandomState};
        let k0 = RandomState::new().hash_one(0x746f_6c6c_u64);
        let k1 = RandomState::new().hash_one(0x6761_7465_u64);
        siphasher::sip::SipHasher13::new_with_keys(k0, k1)
    });

impl KeyHasher {
    /// The hasher of whole keys.
    pub fn new() -> Self {
        Self {
            sip: *KEY_HASHER,
            skip: 0,
        }
    }

    /// A hasher of keys that start with `prefix`, which has read the whole 8-byte blocks of
    /// `prefix` already (SipHash reads blocks of 8 bytes; the rest is read with each key).
    pub fn after_prefix(prefix: &str) -> Self {
        use std::hash::Hasher as _;
        let skip = prefix.len() - prefix.len() % 8;
        let mut sip = *KEY_HASHER;
        sip.write(prefix.as_bytes().get(..skip).unwrap_or_default());
        Self { sip, skip }
    }

    /// The hash of `key`, which must start with the prefix this hasher was made
    /// [after](Self::after_prefix) (checked in debug builds): the same as
    /// `KeyHasher::new().hash(key)`.
    pub fn hash(&self, key: &str) -> u64 {
        let rest = key.as_bytes().get(self.skip..);
        debug_assert!(rest.is_some(), "key shorter than the prefix read");
        self.sip.hash(rest.unwrap_or_default())
    }
}

thread_local! {
    /// The key buffers of in-memory decisions (never held across an `.await`).
    static KEY_BUFFERS: std::cell::RefCell<KeyBuffers> = const {
        std::cell::RefCell::new(KeyBuffers {
            key: String::new(),
            last: String::new(),
            last_hash: None,
        })
    };
}

/// A key buffer that grew past this (a very long counter value) is not kept.
const MAX_KEPT_KEY_BUFFER: usize = 4096;

/// Where one thread builds counter keys, and the last key it decided with that key's hash:
/// the requests of one client, and every request of a limit without counters, repeat their
/// key, and comparing it costs less than hashing it again.
#[derive(Debug, Default)]
struct KeyBuffers {
    /// The key being built.
    key: String,
    /// The last key built.
    last: String,
    /// Its hash (`None` before the first key).
    last_hash: Option<u64>,
}

impl KeyBuffers {
    /// The key of the request of `act` on `limit`, and its hash
    /// ([`CompiledLimit::key_hash`]).
    fn key_of(&mut self, limit: &CompiledLimit, act: &Activation<'_>) -> (&str, u64) {
        self.key.clear();
        limit.key_into(act, &mut self.key);
        let hash = match self.last_hash {
            Some(hash) if self.key == self.last => hash,
            _ => {
                let hash = limit.key_hash(&self.key);
                std::mem::swap(&mut self.key, &mut self.last);
                self.last_hash = Some(hash);
                hash
            }
        };
        (&self.last, hash)
    }

    /// Drops buffers that grew past [`MAX_KEPT_KEY_BUFFER`].
    fn trim(&mut self) {
        if self.key.capacity().max(self.last.capacity()) > MAX_KEPT_KEY_BUFFER {
            *self = Self::default();
        }
    }
}

#[cfg(test)]
mod tests;
