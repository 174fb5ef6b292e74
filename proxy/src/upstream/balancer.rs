//! Choosing an endpoint of a backend. In: the backend's endpoints and settings from the
//! table (with each endpoint's state carried over from the previous snapshot), and per pick
//! the request's hash key when the balancer hashes (an expression key is compiled here, once
//! per table: [`KeyExpr`]). Out: an [`EndpointGuard`] (one in-flight slot on the endpoint,
//! its pool), or none when the backend has no endpoint.
//!
//! A backend with outlier detection or active health checks skips endpoints that are out
//! (module `outlier`), unless fewer than its panic threshold are available: then every
//! endpoint is used again. A backend with neither reads no clock and no health state.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::uri::Authority;
use tollgate_api::backend::{BackendSettings, HashOn, OutlierDetection};
use tollgate_api::{Backend, BackendProtocol, LoadBalancer};

use crate::lifecycle::affinity::KeyExpr;
use crate::lifecycle::policy::cel::CelError;
use crate::upstream::Upstream;
use crate::upstream::breaker::Breaker;
use crate::upstream::hash::Ring;
use crate::upstream::outlier::{Health, Outcome, now_ms};
use crate::upstream::pool::EndpointPool;
use crate::upstream::tls::TlsClient;

/// A consistent hash's endpoint may carry at most this share above the mean in-flight load
/// (percent, "consistent hashing with bounded loads"): one hot key cannot overload it.
const HASH_LOAD_FACTOR_PERCENT: usize = 125;

/// One endpoint, its in-flight request count, pool and health.
#[derive(Debug)]
pub(crate) struct EndpointState {
    /// Where to connect.
    pub addr: SocketAddr,
    /// `ip:port` as a URI authority (IPv6 bracketed).
    pub authority: Authority,
    in_flight: AtomicUsize,
    /// Idle HTTP/1.1 connections to `addr`.
    pub(crate) pool: Arc<EndpointPool>,
    /// Ejections and health-check verdicts (kept by address when a pool changes).
    pub health: Arc<Health>,
}

/// Holds one in-flight slot on an endpoint until dropped.
#[derive(Debug)]
pub(crate) struct EndpointGuard(Arc<EndpointState>);

impl EndpointGuard {
    fn new(ep: Arc<EndpointState>) -> Self {
        ep.in_flight.fetch_add(1, Ordering::Relaxed);
        Self(ep)
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &EndpointState {
        &self.0
    }
}

impl Drop for EndpointGuard {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Endpoints of one backend and how to choose among them.
#[derive(Debug)]
pub(crate) struct Balancer {
    /// The table's backend key (the `backend` label of its metrics).
    pub key: Arc<str>,
    /// Protocol spoken to the endpoints.
    pub protocol: BackendProtocol,
    lb: LoadBalancer,
    pub(crate) endpoints: Vec<Arc<EndpointState>>,
    next: AtomicUsize,
    /// Round robin over the endpoints up, for the turns of those out.
    spill: AtomicUsize,
    /// The BackendPolicy settings.
    pub settings: BackendSettings,
    /// TLS to the endpoints (BackendTLSPolicy), as their pools make it.
    pub(crate) tls: Option<Arc<TlsClient>>,
    /// Some endpoint may be out (outlier detection or health checks configured).
    guarded: bool,
    /// The circuit breaker, when a limit is set.
    pub breaker: Option<Arc<Breaker>>,
    /// The retry budget, when one is set.
    pub budget: Option<Arc<crate::upstream::budget::Budget>>,
    /// The hash ring of a `ConsistentHash` balancer.
    ring: Option<Ring>,
    /// The compiled key of a hash on an expression ([`HashOn::Expression`]).
    pub key_expr: Option<KeyExpr>,
    /// Each endpoint's hash, as a session token names it (module `affinity`).
    ids: Vec<u64>,
    /// Ejection decisions, one at a time (so `max_ejection_percent` holds under races).
    eject: std::sync::Mutex<()>,
}

impl Balancer {
    /// Builds a balancer, reusing endpoint state (in-flight counts, pools, health), the
    /// breaker and a compiled key expression from `prev` for what stays. Endpoints whose IP
    /// does not parse are skipped (the compiler emits only IPs); a key expression that does
    /// not compile (the compiler checks it: a table from a newer compiler) refuses the table.
    pub fn build(
        backend: &Backend,
        prev: Option<&Balancer>,
        upstream: &Upstream,
    ) -> Result<Self, CelError> {
        // Before any endpoint state: a table refused for it leaves nothing behind.
        let key_expr = match &backend.settings.hash {
            Some(HashOn::Expression(src)) => Some(
                match prev
                    .and_then(|p| p.key_expr.as_ref())
                    .filter(|k| k.source() == src)
                {
                    Some(same) => same.clone(),
                    None => KeyExpr::compile(src)?,
                },
            ),
            _ => None,
        };
        // Endpoints the proxy starts with are not new: slow start is for those added later.
        let joined = if prev.is_some() { now_ms() } else { 0 };
        let tls = backend.tls.as_ref().map(|t| upstream.tls.get(t));
        let endpoints: Vec<Arc<EndpointState>> = backend
            .endpoints
            .iter()
            .filter_map(|e| {
                let ip: IpAddr = match e.ip.parse() {
                    Ok(ip) => ip,
                    Err(_) => {
                        tracing::warn!(ip = %e.ip, "skipping endpoint with invalid IP");
                        return None;
                    }
                };
                let addr = SocketAddr::new(ip, e.port);
                // Kept while its pool's settings stay (new settings: a new pool, fresh state).
                if let Some(old) = prev
                    .filter(|p| {
                        let pool = |c: &tollgate_api::backend::Connection| {
                            (
                                c.connect_timeout_ms,
                                c.idle_timeout_ms,
                                c.max_requests_per_connection,
                                c.tcp_keepalive_idle_ms,
                            )
                        };
                        pool(&p.settings.connection) == pool(&backend.settings.connection)
                    })
                    // An endpoint whose TLS settings changed starts afresh (a pool of its own).
                    .and_then(|p| {
                        p.endpoints
                            .iter()
                            .find(|o| o.addr == addr && o.pool.tls_client() == tls.as_ref())
                    })
                {
                    return Some(old.clone());
                }
                let authority = Authority::try_from(addr.to_string()).ok()?;
                // New pool settings make a new endpoint state, but its health stays.
                let health = prev
                    .and_then(|p| p.endpoints.iter().find(|o| o.addr == addr))
                    .map_or_else(
                        || {
                            let h = Health::default();
                            h.joined.store(joined, Ordering::Relaxed);
                            Arc::new(h)
                        },
                        |o| o.health.clone(),
                    );
                Some(Arc::new(EndpointState {
                    addr,
                    authority,
                    in_flight: AtomicUsize::new(0),
                    pool: upstream
                        .pools
                        .pool_with(addr, &backend.settings.connection, tls.clone()),
                    health,
                }))
            })
            .collect();
        let settings = backend.settings.clone();
        let breaker = match prev.and_then(|p| p.breaker.as_ref()) {
            Some(b) if b.limits == settings.circuit_breaker => Some(b.clone()),
            _ => Breaker::new(&settings.circuit_breaker),
        };
        let budget =
            settings
                .retry_budget
                .as_ref()
                .map(|cfg| match prev.and_then(|p| p.budget.as_ref()) {
                    Some(b)
                        if b.config.percent == cfg.percent
                            && b.config.interval_ms == cfg.interval_ms.max(1)
                            && b.config.min_retries == cfg.min_retries
                            && b.config.min_interval_ms == cfg.min_interval_ms.max(1) =>
                    {
                        b.clone()
                    }
                    _ => crate::upstream::budget::Budget::new(cfg),
                });
        let ring = (backend.load_balancer == LoadBalancer::ConsistentHash).then(|| {
            let keys: Vec<String> = endpoints.iter().map(|e| e.addr.to_string()).collect();
            Ring::build(&keys)
        });
        let ids = endpoints
            .iter()
            .map(|e| crate::upstream::hash::hash(e.addr.to_string().as_bytes()))
            .collect();
        Ok(Self {
            key: Arc::from(""),
            ids,
            protocol: backend.protocol,
            lb: backend.load_balancer,
            endpoints,
            next: AtomicUsize::new(0),
            spill: AtomicUsize::new(0),
            guarded: settings.outlier.is_some() || settings.health_check.is_some(),
            settings,
            tls,
            breaker,
            budget,
            ring,
            key_expr,
            eject: std::sync::Mutex::new(()),
        })
    }

    /// Picks an endpoint; `None` when there are none.
    pub fn pick(&self) -> Option<EndpointGuard> {
        self.pick_keyed(None)
    }

    /// Picks an endpoint, by `key` (a hash) on a consistent-hash balancer.
    pub fn pick_keyed(&self, key: Option<u64>) -> Option<EndpointGuard> {
        let n = self.endpoints.len();
        if n == 0 {
            return None;
        }
        let now = if self.guarded { now_ms() } else { 0 };
        let idx = match (key, &self.ring) {
            (Some(k), Some(ring)) => self.by_hash(ring, k, now),
            _ => None,
        }
        .unwrap_or_else(|| self.by_algorithm(n, now));
        self.endpoints.get(idx).cloned().map(EndpointGuard::new)
    }

    /// The endpoint a session names (by its hash), when it is still here and available.
    pub fn pick_session(&self, id: u64) -> Option<EndpointGuard> {
        let i = self.ids.iter().position(|&x| x == id)?;
        let now = if self.guarded { now_ms() } else { 0 };
        self.up(i, now)
            .then(|| self.endpoints.get(i).cloned().map(EndpointGuard::new))
            .flatten()
    }

    /// The hash a session token names `endpoint` by.
    pub fn session_id(&self, endpoint: &EndpointState) -> u64 {
        self.endpoints
            .iter()
            .position(|e| e.addr == endpoint.addr)
            .and_then(|i| self.ids.get(i).copied())
            .unwrap_or_else(|| crate::upstream::hash::hash(endpoint.addr.to_string().as_bytes()))
    }

    /// Whether endpoint `i` may be picked at `now`.
    fn up(&self, i: usize, now: u64) -> bool {
        !self.guarded || self.endpoints[i].health.available(now)
    }

    /// Round robin, random or power of two choices over the available endpoints.
    fn by_algorithm(&self, n: usize, now: u64) -> usize {
        if n == 1 {
            return 0;
        }
        let load = |i: usize| self.load(i, now);
        let first = match self.lb {
            LoadBalancer::RoundRobin => self.next.fetch_add(1, Ordering::Relaxed) % n,
            LoadBalancer::Random => fastrand::usize(..n),
            LoadBalancer::LeastRequest | LoadBalancer::ConsistentHash => {
                // Power of two choices: two distinct random endpoints, the lighter (and up) wins.
                let a = fastrand::usize(..n);
                let b = (a + 1 + fastrand::usize(..n - 1)) % n;
                match (self.up(a, now), self.up(b, now)) {
                    (true, true) if load(b) < load(a) => b,
                    (true, _) => a,
                    (false, true) => b,
                    (false, false) => a,
                }
            }
        };
        if self.up(first, now) {
            return first;
        }
        // The turn of an endpoint that is out goes to one of those up, evenly (not always
        // to the next in order, which would carry twice its share).
        // At random: drawn over the whole range, as `k` is taken modulo the number of those
        // up (a draw below `n` would favour the first of them whenever that number does not
        // divide `n`).
        let k = match self.lb {
            LoadBalancer::RoundRobin => self.spill.fetch_add(1, Ordering::Relaxed),
            _ => fastrand::usize(..),
        };
        self.nth_up(k, n, now).unwrap_or(first)
    }

    /// The `k`-th (modulo their number) available endpoint, unless fewer than the panic
    /// threshold are available (then `None`: any endpoint will do).
    fn nth_up(&self, k: usize, n: usize, now: u64) -> Option<usize> {
        let up = (0..n).filter(|&i| self.up(i, now)).count();
        if up == 0 || up * 100 < self.settings.panic_threshold_percent as usize * n {
            return None;
        }
        (0..n).filter(|&i| self.up(i, now)).nth(k % up)
    }

    /// In-flight load, weighed up for an endpoint still in its slow-start window.
    fn load(&self, i: usize, now: u64) -> usize {
        let e = &self.endpoints[i];
        let load = e.in_flight.load(Ordering::Relaxed);
        let Some(window) = self.settings.connection.slow_start_ms.filter(|w| *w > 0) else {
            return load;
        };
        let joined = e.health.joined.load(Ordering::Relaxed);
        let now = if now == 0 { now_ms() } else { now };
        let age = now.saturating_sub(joined);
        if joined == 0 || age >= window {
            return load;
        }
        // A tenth of the way in, it counts ten times its load.
        let age = age.max(window / 10).max(1);
        usize::try_from((load as u64 + 1) * window / age).unwrap_or(usize::MAX)
    }

    /// The first endpoint on the ring from `key` that is up and under its bounded load.
    fn by_hash(&self, ring: &Ring, key: u64, now: u64) -> Option<usize> {
        let n = self.endpoints.len();
        let total: usize = self
            .endpoints
            .iter()
            .map(|e| e.in_flight.load(Ordering::Relaxed))
            .sum();
        let cap = ((total + 1) * HASH_LOAD_FACTOR_PERCENT).div_ceil(100 * n);
        // Below the panic threshold every endpoint counts as up, as for the other balancers.
        let panic = self.guarded && {
            let up = (0..n).filter(|&i| self.up(i, now)).count();
            up * 100 < self.settings.panic_threshold_percent as usize * n
        };
        // The endpoints seen on the walk: a bit each, on the stack up to 128 endpoints.
        let mut small = [0u64; 2];
        let mut large = if n > 128 {
            vec![0u64; n.div_ceil(64)]
        } else {
            Vec::new()
        };
        let bits: &mut [u64] = if n > 128 { &mut large } else { &mut small };
        let mut seen = 0usize;
        for i in ring.walk(key) {
            let (word, bit) = (i / 64, 1u64 << (i % 64));
            if bits[word] & bit != 0 {
                continue;
            }
            bits[word] |= bit;
            seen += 1;
            if (panic || self.up(i, now))
                && self.endpoints[i].in_flight.load(Ordering::Relaxed) < cap
            {
                return Some(i);
            }
            if seen == n {
                break;
            }
        }
        None
    }

    /// Picks an endpoint for a retry: the balancer's choice when it is not in `tried`, else
    /// an untried endpoint from a random start, else (every endpoint tried) the balancer's
    /// choice; `None` when there are none.
    pub fn pick_untried(&self, tried: &[SocketAddr]) -> Option<EndpointGuard> {
        let first = self.pick()?;
        let n = self.endpoints.len();
        if n == 1 || !tried.contains(&first.endpoint().addr) {
            return Some(first);
        }
        let now = if self.guarded { now_ms() } else { 0 };
        let start = fastrand::usize(..n);
        (0..n)
            .map(|k| (start + k) % n)
            .find(|&i| self.up(i, now) && !tried.contains(&self.endpoints[i].addr))
            .and_then(|i| self.endpoints.get(i))
            .cloned()
            .map(EndpointGuard::new)
            .or(Some(first))
    }

    /// Counts one attempt's outcome on `endpoint` for outlier detection; true when it
    /// ejected the endpoint.
    pub fn record(&self, endpoint: &EndpointState, outcome: Outcome) -> bool {
        let Some(od) = &self.settings.outlier else {
            return false;
        };
        if !endpoint.health.record(outcome, od) {
            return false;
        }
        self.try_eject(endpoint, od)
    }

    /// Ejects `endpoint` unless that takes more than `max_ejection_percent` of the backend
    /// out (one may always go).
    fn try_eject(&self, endpoint: &EndpointState, od: &OutlierDetection) -> bool {
        let _one_at_a_time = self.eject.lock();
        let now = now_ms();
        if endpoint.health.ejected(now) {
            return false;
        }
        let n = self.endpoints.len();
        let ejected = self
            .endpoints
            .iter()
            .filter(|e| e.health.ejected(now))
            .count();
        if ejected > 0 && (ejected + 1) * 100 > od.max_ejection_percent as usize * n {
            return false;
        }
        endpoint.health.eject(now, od);
        tracing::info!(endpoint = %endpoint.addr, "endpoint ejected by outlier detection");
        true
    }

    /// After an ejection: the healthy-endpoints gauge now, and again when the ejection ends
    /// (ejections expire by themselves; a timer, not a request, sees it), unless the
    /// endpoint left every balancer by then.
    pub fn report_ejection(&self, endpoint: &EndpointState, metrics: &Arc<crate::Metrics>) {
        metrics
            .backend()
            .set_healthy_endpoints(&self.key, self.availability().0);
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let wait = endpoint.health.ejected_until().saturating_sub(now_ms());
        let endpoints = self.endpoints.clone();
        let (key, metrics) = (self.key.clone(), metrics.clone());
        handle.spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
            if endpoints.iter().all(|e| Arc::strong_count(e) == 1) {
                return;
            }
            let now = now_ms();
            let up = endpoints.iter().filter(|e| e.health.available(now)).count();
            metrics.backend().set_healthy_endpoints(&key, up);
        });
    }

    /// Endpoints available now, and all of them (for the healthy-endpoints gauge).
    pub fn availability(&self) -> (usize, usize) {
        let now = now_ms();
        let n = self.endpoints.len();
        let up = (0..n)
            .filter(|&i| self.endpoints[i].health.available(now))
            .count();
        (up, n)
    }
}

#[cfg(test)]
#[path = "balancer_tests.rs"]
mod tests;
