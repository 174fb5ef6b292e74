//! Active health checks. In: after each snapshot is swapped in, its balancers
//! ([`HealthChecker::sync`], called by `Proxy::apply`): each backend's `healthCheck`
//! settings, protocol and endpoint states. Out: the `check_failing` flag of each checked
//! endpoint's [`EndpointState`] (read by the balancer on every pick), the metrics
//! `tollgate_health_checks_total{result}`, `tollgate_health_check_transitions_total{to}` and
//! `tollgate_backend_healthy_endpoints{backend}`, and one info log line per transition.
//!
//! One task per (backend, endpoint) of the backends that have health checks: only
//! endpoints the proxy routes to are probed, and none twice. A task probes (module `probe`)
//! every interval plus up to a tenth of jitter, the first soon after it starts (within a
//! tenth of the interval, so the endpoints of a new table do not all fire at once). It takes
//! a healthy endpoint out after `unhealthy_threshold` failures in a row and brings a failing
//! one back after `healthy_threshold` passes in a row; a new endpoint starts healthy
//! (EndpointSlice readiness already let it in). The verdict lives in the endpoint's state, so
//! it holds across snapshots, and a task started again for new settings goes on from it.
//!
//! A task holds its endpoint only weakly and ends by itself once the endpoint's state is
//! dropped; `sync` also stops the tasks of endpoints, backends or settings that went away,
//! and clears the verdict of an endpoint whose backend is no longer checked (nothing would
//! ever bring it back otherwise).

mod probe;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::task::JoinHandle;
use tollgate_api::BackendProtocol;
use tollgate_api::backend::HealthCheck;

use crate::FastMap;
use crate::metrics::Metrics;
use crate::upstream::tls::TlsClient;
use crate::upstream::{Balancer, EndpointState};
use probe::ProbeError;

/// Shortest interval between two checks of an endpoint, whatever the table says: a zero
/// interval must not turn a checker into a flood.
const MIN_INTERVAL: Duration = Duration::from_millis(10);

/// A change of an endpoint's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transition {
    /// Passed `healthy_threshold` checks in a row: back in.
    Healthy,
    /// Failed `unhealthy_threshold` checks in a row: out.
    Unhealthy,
}

/// The threshold state machine of one endpoint.
#[derive(Debug, Clone)]
pub(crate) struct Verdicts {
    healthy: bool,
    /// Results in a row that disagree with `healthy`.
    run: u32,
    unhealthy_threshold: u32,
    healthy_threshold: u32,
}

impl Verdicts {
    /// Starts from `healthy`, with `check`'s thresholds (0 counts as 1).
    pub fn new(healthy: bool, check: &HealthCheck) -> Self {
        Self {
            healthy,
            run: 0,
            unhealthy_threshold: check.unhealthy_threshold.max(1),
            healthy_threshold: check.healthy_threshold.max(1),
        }
    }

    /// Counts one check; `Some` when it changed the verdict.
    pub fn record(&mut self, passed: bool) -> Option<Transition> {
        if passed == self.healthy {
            self.run = 0;
            return None;
        }
        self.run = self.run.saturating_add(1);
        let threshold = if self.healthy {
            self.unhealthy_threshold
        } else {
            self.healthy_threshold
        };
        if self.run < threshold {
            return None;
        }
        self.healthy = passed;
        self.run = 0;
        Some(if passed {
            Transition::Healthy
        } else {
            Transition::Unhealthy
        })
    }
}

/// What one task checks.
#[derive(Debug, PartialEq, Eq)]
struct Spec {
    /// The backend key (for the gauge and logs).
    backend: String,
    protocol: BackendProtocol,
    check: HealthCheck,
    /// TLS to the endpoints (BackendTLSPolicy): probes are made over it.
    tls: Option<Arc<TlsClient>>,
}

/// The live balancer of a checked backend, for the healthy-endpoints gauge; pointed at the
/// new balancer with every snapshot, and held weakly so an old snapshot is not kept alive.
type Live = Arc<Mutex<Weak<Balancer>>>;

/// What a snapshot asks to be checked: by (backend key, endpoint address), the endpoint's
/// state and the settings.
type Wanted<'a> = HashMap<(String, SocketAddr), (&'a Arc<EndpointState>, Arc<Spec>)>;

/// A poisoned lock still guards valid data here: nothing panics while holding one.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A running task, as the checker keeps it.
#[derive(Debug)]
struct Task {
    endpoint: Weak<EndpointState>,
    spec: Arc<Spec>,
    /// Set when the task must change nothing more. The task holds it while it writes the
    /// verdict and metrics, so once `stop` has set it no write of the task can follow (an
    /// abort alone lands only at the task's next await).
    stopped: Arc<Mutex<bool>>,
    handle: JoinHandle<()>,
}

impl Task {
    fn stop(&self) {
        *lock(&self.stopped) = true;
        self.handle.abort();
    }

    /// Still running, for this very endpoint state and these settings.
    fn serves(&self, endpoint: &Arc<EndpointState>, spec: &Spec) -> bool {
        std::ptr::eq(self.endpoint.as_ptr(), Arc::as_ptr(endpoint))
            && *self.spec == *spec
            && !self.handle.is_finished()
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Tasks keyed by (backend key, endpoint address), and the live balancer of every backend on
/// the healthy-endpoints gauge.
#[derive(Debug, Default)]
struct State {
    tasks: HashMap<(String, SocketAddr), Task>,
    live: FastMap<String, Live>,
}

/// Starts, keeps and stops the health-check tasks to match each snapshot.
#[derive(Debug)]
pub(crate) struct HealthChecker {
    metrics: Arc<Metrics>,
    state: Mutex<State>,
}

impl HealthChecker {
    /// A checker with no task (needs no runtime until the first [`Self::sync`]).
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            metrics,
            state: Mutex::new(State::default()),
        }
    }

    /// Makes the tasks match `backends` (the live snapshot's): one per endpoint of each
    /// backend with health checks, started when missing, stopped when its endpoint,
    /// backend or settings went away; then sets the healthy-endpoints gauge of every backend
    /// with outlier detection or health checks and drops the series of the others.
    pub fn sync(&self, backends: &FastMap<String, Arc<Balancer>>) {
        let mut state = lock(&self.state);
        let mut wanted = Wanted::new();
        for (key, b) in backends {
            let Some(check) = &b.settings.health_check else {
                continue;
            };
            let spec = Arc::new(Spec {
                backend: key.clone(),
                protocol: b.protocol,
                check: check.clone(),
                tls: b.tls.clone(),
            });
            for ep in &b.endpoints {
                wanted.insert((key.clone(), ep.addr), (ep, spec.clone()));
            }
        }

        // Stopped before the gauge is touched, so no stopped task can set a series again.
        state.tasks.retain(|k, task| match wanted.get(k) {
            Some((ep, spec)) => task.serves(ep, spec),
            None => {
                task.stop();
                // The backend is no longer checked (or the endpoint is gone, when this is
                // moot): a verdict nothing will revise must not keep the endpoint out.
                if let Some(ep) = task.endpoint.upgrade() {
                    ep.health.check_failing.store(false, Ordering::Relaxed);
                }
                false
            }
        });

        let mut live = FastMap::default();
        for (key, b) in backends {
            if b.settings.outlier.is_none() && b.settings.health_check.is_none() {
                continue;
            }
            let slot = state.live.remove(key).unwrap_or_default();
            {
                // Held while setting, so a task's update cannot land between the two.
                let mut current = lock(&slot);
                *current = Arc::downgrade(b);
                self.metrics
                    .backend()
                    .set_healthy_endpoints(key, b.availability().0);
            }
            live.insert(key.clone(), slot);
        }
        for gone in state.live.keys() {
            self.metrics.backend().remove_healthy_endpoints(gone);
        }
        state.live = live;

        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("no async runtime: health checks not started");
            return;
        };
        for (k, (ep, spec)) in wanted {
            if state.tasks.contains_key(&k) {
                continue;
            }
            let stopped = Arc::new(Mutex::new(false));
            let checker = Checker {
                endpoint: Arc::downgrade(ep),
                spec: spec.clone(),
                stopped: stopped.clone(),
                live: state.live.get(&k.0).cloned().unwrap_or_default(),
                metrics: self.metrics.clone(),
            };
            let handle = runtime.spawn(checker.run());
            let task = Task {
                endpoint: Arc::downgrade(ep),
                spec,
                stopped,
                handle,
            };
            state.tasks.insert(k, task);
        }
    }

    /// Stops every task (the proxy is shutting down).
    pub fn stop(&self) {
        lock(&self.state).tasks.clear();
    }
}

/// One endpoint's checking task.
struct Checker {
    endpoint: Weak<EndpointState>,
    spec: Arc<Spec>,
    stopped: Arc<Mutex<bool>>,
    live: Live,
    metrics: Arc<Metrics>,
}

/// Up to a tenth of `interval`, at random.
fn jitter(interval: Duration) -> Duration {
    let tenth = u64::try_from(interval.as_millis() / 10).unwrap_or(u64::MAX);
    Duration::from_millis(fastrand::u64(..=tenth))
}

impl Checker {
    async fn run(self) {
        let Some(ep) = self.endpoint.upgrade() else {
            return;
        };
        let addr = ep.addr;
        let healthy = !ep.health.check_failing.load(Ordering::Relaxed);
        drop(ep);
        let check = &self.spec.check;
        let mut verdicts = Verdicts::new(healthy, check);
        let interval = Duration::from_millis(check.interval_ms).max(MIN_INTERVAL);
        let timeout = Duration::from_millis(check.timeout_ms);
        let mut wait = jitter(interval);
        loop {
            tokio::time::sleep(wait).await;
            let probe = probe::check(
                &check.probe,
                self.spec.protocol,
                addr,
                self.spec.tls.as_deref(),
            );
            let result = tokio::time::timeout(timeout, probe)
                .await
                .unwrap_or(Err(ProbeError::Timeout));
            // The endpoint left every snapshot: nothing to check any more.
            let Some(ep) = self.endpoint.upgrade() else {
                return;
            };
            if !self.record(&ep, &mut verdicts, result) {
                return;
            }
            drop(ep);
            wait = interval + jitter(interval);
        }
    }

    /// Counts one check's `result` on `ep`, and what it changed; false when the task was
    /// stopped (then nothing was changed).
    fn record(
        &self,
        ep: &EndpointState,
        verdicts: &mut Verdicts,
        result: Result<(), ProbeError>,
    ) -> bool {
        let stopped = lock(&self.stopped);
        if *stopped {
            return false;
        }
        let backend = &self.spec.backend;
        self.metrics.backend().health_check(result.is_ok());
        if let Err(e) = &result {
            tracing::debug!(%backend, endpoint = %ep.addr, error = %e, "health check failed");
        }
        match verdicts.record(result.is_ok()) {
            Some(Transition::Unhealthy) => {
                ep.health.check_failing.store(true, Ordering::Relaxed);
                self.metrics.backend().health_transition(false);
                let error = result.err().map(|e| e.to_string()).unwrap_or_default();
                tracing::info!(%backend, endpoint = %ep.addr, %error, "endpoint failed its health checks: taken out");
            }
            Some(Transition::Healthy) => {
                ep.health.check_failing.store(false, Ordering::Relaxed);
                self.metrics.backend().health_transition(true);
                tracing::info!(%backend, endpoint = %ep.addr, "endpoint passes its health checks again: back in");
            }
            None => {}
        }
        // Also picks up ejections by outlier detection and their expiry.
        let live = lock(&self.live);
        if let Some(b) = live.upgrade() {
            self.metrics
                .backend()
                .set_healthy_endpoints(backend, b.availability().0);
        }
        true
    }
}

#[cfg(test)]
mod tests;
