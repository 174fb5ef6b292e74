//! One reconcile: stores → compile → publish → (leader) provision → status → events.
//!
//! In: the [`Stores`], what changed ([`Relevance`]), whether this replica leads. Out: tables
//! published to the push server (every replica, so a new leader serves proxies at once; only
//! the leader's push server accepts them, see `controller.rs`); status writes, provisioning
//! and Events (leader only). The compiler's output is kept between
//! reconciles, so a status-only change (often the echo of our own write) costs a comparison,
//! not a compile, and an EndpointSlice-only change skips statuses and provisioning.
//!
//! Overlays on the compiler's statuses, in this order: our controller name on route
//! parents; `status.addresses` from provisioning; Gateway `Programmed` from the push server's
//! sync state (when one is configured): it turns True only when a proxy ACKed the current
//! version; once True it stays True while proxies are connected and none NACKed, so a table
//! change in flight (e.g. new endpoints) does not flap it.
//!
//! Each compile gets the previous one's `last_valid` policies, so a policy that becomes
//! invalid keeps enforcing its last valid version (held in memory: after a restart a
//! still-invalid AuthPolicy closes its targets until fixed).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use gateway_types::gateways::GatewayStatusAddresses;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};
use tollgate_api::ObjectKey;
use tracing::{debug, info, warn};

use super::metrics::{KindResult, Metrics, PathLabel, kind as kind_label};
pub use super::overlay::{enforced, programmed, programmed_true, static_addresses};
use super::provision::{self, ProvisionConfig};
use super::referenced;
use super::status::{self, StatusWrite};
use super::stores::{Relevance, Stores};
use crate::compile::kinds::RouteParent;
use crate::compile::listeners::DEFAULT_ADDRESS;
use crate::compile::{CONTROLLER_NAME, Inputs, Output, compile};
use crate::push::PushServer;
use crate::push::pki::{Ca, ensure_proxy_secret};

/// Default of [`Settings::api_timeout`].
pub const API_CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// How a bounded API call failed: its own error, or no answer in time.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CallError<E> {
    #[error(transparent)]
    Failed(E),
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
}

/// `fut`'s result, or [`CallError::TimedOut`] when it took longer than `limit`.
pub(crate) async fn bounded<T, E>(
    limit: Duration,
    fut: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, CallError<E>> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r.map_err(CallError::Failed),
        Err(_) => Err(CallError::TimedOut(limit)),
    }
}

/// What the reconciler needs besides the stores.
#[derive(Clone)]
pub struct Settings {
    /// `spec.controllerName` of the GatewayClasses this controller owns.
    pub controller_name: String,
    /// Push server, when tables are pushed to proxies.
    pub push: Option<PushServer>,
    /// Provisioning settings, when proxies are provisioned.
    pub provision: Option<ProvisionConfig>,
    /// The push CA, when tables are pushed: each accepted Gateway gets its proxy Secret.
    pub pki: Option<PushPki>,
    /// Longest one API call of a reconcile (a status write, an Event, one Gateway's
    /// provisioning) may take ([`API_CALL_TIMEOUT`]). A request the API server never answers
    /// would otherwise hold the reconcile loop, and with the first reconcile `/readyz`, for as
    /// long as the connection lasts; bounded, the call counts as failed and is retried.
    pub api_timeout: Duration,
}

/// The current push CA, replaced on rotation. Cheap to clone.
#[derive(Clone)]
pub struct PushPki {
    ca: Arc<RwLock<Ca>>,
    generation: Arc<AtomicU64>,
}

impl PushPki {
    /// Shares `ca`.
    pub fn new(ca: Ca) -> Self {
        Self {
            ca: Arc::new(RwLock::new(ca)),
            generation: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The current CA.
    pub fn current(&self) -> Ca {
        self.ca
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Installs a rotated CA; proxy Secrets are reissued at the next reconcile.
    pub fn replace(&self, ca: Ca) {
        *self.ca.write().unwrap_or_else(PoisonError::into_inner) = ca;
        self.generation.fetch_add(1, Ordering::Relaxed);
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }
}

/// A Gateway's last provisioning attempt.
#[derive(Debug, Clone)]
struct Provisioned {
    /// What it applied; `None` when it failed (objects may exist in part).
    fingerprint: Option<String>,
    /// When it started.
    at: Instant,
}

/// Provisioned objects are applied again at least this often (they are not watched: a
/// deleted Deployment comes back within this period).
const REPROVISION: Duration = Duration::from_secs(300);

/// How long one reconcile goes on starting provisioning work: past it, the Gateways not
/// reached are left for the next full reconcile ([`REPROVISION_RETRY`] later; least recently
/// attempted first), so an API server or admission webhook that answers slowly holds status
/// writes and the next table publication back by about this much (plus the calls in flight),
/// not by its delay times the number of Gateways.
pub const PROVISION_BUDGET: Duration = Duration::from_secs(10);

/// The reconciler's state between reconciles.
pub struct Reconciler {
    client: Client,
    stores: Stores,
    /// Payloads of referenced objects the watches stored without them.
    fetched: referenced::Fetched,
    /// Since when a referenced object could not be read (`None` while all can).
    unreadable_since: Option<Instant>,
    settings: Settings,
    metrics: Arc<Metrics>,
    recorder: Recorder,
    compiled: Output,
    versions: BTreeMap<ObjectKey, u64>,
    provisioned: BTreeMap<ObjectKey, Provisioned>,
    /// resourceVersion each written object had when we planned its write: until the watch
    /// brings a newer one (the echo of our write), planning it again would be a duplicate.
    written: BTreeMap<(&'static str, ObjectKey), String>,
}

/// What a reconcile asks of the loop.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Some write failed or conflicted: reconcile statuses again soon.
    pub retry: bool,
    /// More writes are due than one pass sends: run another status pass right away (after
    /// the loop had a chance to handle other changes, e.g. endpoints).
    pub more: bool,
    /// Provisioning (or a proxy's TLS Secret) failed for some Gateway: run a full reconcile
    /// again after a pause (a status pass does not provision).
    pub reprovision: bool,
    /// A referenced Secret or ConfigMap could not be read: nothing was published, written or
    /// provisioned (see [`UNREADABLE_GRACE`]); run a full reconcile again soon.
    pub incomplete: bool,
    /// A referenced object unreadable past [`UNREADABLE_GRACE`] was compiled without its
    /// payload: run a full reconcile again after a pause, to read it once it can be.
    pub unread: bool,
}

/// How long a referenced object that cannot be read (an API server failing or slow to answer,
/// as during a control-plane restart) holds back publishing, status writes and provisioning:
/// within it, the tables and statuses in place stay (proxies keep serving the listeners that
/// name the object); past it, the controller compiles without the object, which rejects those
/// listeners, rather than hold every other change back for good.
pub const UNREADABLE_GRACE: Duration = Duration::from_secs(30);

/// Pause before statuses are compared again after a failed or conflicting write.
pub const STATUS_RETRY: Duration = Duration::from_secs(1);

/// Pause before a full reconcile retries a failed provisioning (it recompiles everything, so
/// less eagerly than a status retry).
pub const REPROVISION_RETRY: Duration = Duration::from_secs(5);

impl Outcome {
    /// The work still owed once a reconcile of `relevance` returned `next`, `self` being what
    /// was owed before it: only a pass that writes statuses (Status, Full) settles `retry` and
    /// `more`, only a Full pass settles `reprovision`; a pass that does not do that work (an
    /// endpoints pass among a stream of EndpointSlice changes) leaves it owed.
    pub fn after(self, relevance: Relevance, next: Outcome) -> Outcome {
        if next.incomplete {
            // It stopped before doing any of that work.
            return Outcome {
                incomplete: true,
                ..self
            };
        }
        let statuses = relevance.covers(Relevance::Status);
        let full = relevance == Relevance::Full;
        Outcome {
            retry: next.retry || (!statuses && self.retry),
            more: next.more || (!statuses && self.more),
            reprovision: next.reprovision || (!full && self.reprovision),
            incomplete: !full && self.incomplete,
            unread: next.unread || (!full && self.unread),
        }
    }

    /// The reconcile this owed work asks for and how soon; `None` when nothing is owed.
    pub fn wants(&self) -> Option<(Duration, Relevance)> {
        let relevance = if self.reprovision || self.incomplete || self.unread {
            Relevance::Full
        } else {
            Relevance::Status
        };
        // A pass that failed pauses before the next, even with more writes due: failures that
        // come back at once (an API server refusing connections) must not spin the loop.
        if self.retry || self.incomplete {
            Some((STATUS_RETRY, relevance))
        } else if self.more {
            Some((Duration::ZERO, relevance))
        } else if self.reprovision || self.unread {
            Some((REPROVISION_RETRY, relevance))
        } else {
            None
        }
    }
}

/// Most status writes one pass sends, so that a mass update (10k routes on first start) never
/// holds table publishing back for long: the loop interleaves other reconciles between passes.
const WRITES_PER_PASS: usize = 256;

impl Reconciler {
    /// A reconciler over `stores`; events are reported as `id`.
    pub fn new(
        client: Client,
        stores: Stores,
        settings: Settings,
        metrics: Arc<Metrics>,
        id: &str,
    ) -> Self {
        let reporter = kube::runtime::events::Reporter {
            controller: "tollgate-controller".to_owned(),
            instance: Some(id.to_owned()),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            stores,
            fetched: referenced::Fetched::default(),
            unreadable_since: None,
            settings,
            metrics,
            compiled: Output::default(),
            versions: BTreeMap::new(),
            provisioned: BTreeMap::new(),
            written: BTreeMap::new(),
        }
    }

    /// The last compiled output (with our controller name).
    pub fn compiled(&self) -> &Output {
        &self.compiled
    }

    /// Runs one reconcile.
    pub async fn reconcile(&mut self, relevance: Relevance, leading: bool) -> Outcome {
        let started = Instant::now();
        let path = match relevance {
            Relevance::Full => "full",
            Relevance::Endpoints => "endpoints",
            Relevance::Status => "status",
        };
        let mut unread = false;
        if relevance >= Relevance::Endpoints {
            let mut inputs = self.stores.inputs(Time(Timestamp::now()));
            if self.settings.provision.is_some() {
                // A listener there would take the provisioned proxy's admin port.
                inputs.reserved_ports = u16::try_from(provision::desired::ADMIN_PORT)
                    .into_iter()
                    .collect();
            }
            own_classes(&mut inputs, &self.settings.controller_name);
            let refs = referenced::references(&inputs);
            self.stores.referenced.replace(refs.clone());
            unread = match self.fetched.fill(&self.client, &mut inputs, &refs).await {
                Ok(()) => {
                    self.unreadable_since = None;
                    false
                }
                Err(e) => {
                    let since = *self.unreadable_since.get_or_insert(started);
                    if since.elapsed() < UNREADABLE_GRACE {
                        warn!(error = %e, "a referenced object could not be read: tables, statuses and proxies stay as they are; retrying");
                        return Outcome {
                            incomplete: true,
                            ..Outcome::default()
                        };
                    }
                    warn!(error = %e, grace_s = UNREADABLE_GRACE.as_secs(), "a referenced object is still unreadable: compiling without it (the listeners naming it are rejected)");
                    true
                }
            };
            let snapshot = started.elapsed();
            let out = compile_next(&self.compiled, &mut inputs, &self.settings.controller_name);
            drop(inputs);
            let compiled = started.elapsed();
            self.publish(&out);
            self.compiled = out;
            debug!(
                snapshot_ms = snapshot.as_millis(),
                compile_ms = (compiled - snapshot).as_millis(),
                "compiled"
            );
        }
        let mut outcome = Outcome::default();
        if relevance != Relevance::Endpoints && leading {
            let provisioned = relevance != Relevance::Full || self.provision().await;
            outcome = self.write_statuses().await;
            outcome.reprovision = !provisioned;
        }
        outcome.unread = unread;
        self.metrics
            .reconciles
            .get_or_create(&PathLabel {
                path: path.to_owned(),
            })
            .inc();
        let took = started.elapsed();
        self.metrics.reconcile_duration.observe(took.as_secs_f64());
        debug!(path, leading, took_ms = took.as_millis(), "reconciled");
        outcome
    }

    fn publish(&mut self, out: &Output) {
        self.metrics
            .gateways
            .set(i64::try_from(out.tables.len()).unwrap_or(i64::MAX));
        let Some(push) = &self.settings.push else {
            return;
        };
        let provisioned = self.settings.provision.is_some();
        for (key, table) in &out.tables {
            let mut table = table.clone();
            if provisioned {
                // A provisioned proxy listens on every address of its pod: the Gateway's
                // `spec.addresses` are its Service's (load balancer) business.
                for p in &mut table.ports {
                    DEFAULT_ADDRESS.clone_into(&mut p.address);
                }
            }
            let v = push.publish(key, table);
            let old = self.versions.insert(key.clone(), v);
            if old != Some(v) {
                self.metrics.pushed_versions.inc();
                info!(gateway = %key, version = v, "route table published");
            }
        }
        let gone: Vec<ObjectKey> = self
            .versions
            .keys()
            .filter(|k| !out.tables.contains_key(*k))
            .cloned()
            .collect();
        for key in gone {
            push.remove(&key);
            self.versions.remove(&key);
        }
    }

    /// The compiled output with the provisioning and push overlays.
    fn desired(&self) -> Output {
        let mut out = self.compiled.clone();
        let mut connected = 0;
        let mut in_sync = 0;
        for (key, st) in &mut out.gateways {
            let live = self
                .stores
                .gateways
                .get(&ObjectRef::new(&key.name).within(&key.namespace));
            let live = live.as_deref().and_then(|g| g.as_ok());
            if self.settings.provision.is_some() {
                let requested = live.map(provision::requested_addresses).unwrap_or_default();
                static_addresses(st, &requested, self.addresses(key));
            }
            if let Some(push) = &self.settings.push {
                let sync = push.sync(key);
                connected += i64::from(sync.connected);
                in_sync += i64::from(sync.in_sync);
                let live_true = live
                    .and_then(|g| g.status.as_ref())
                    .is_some_and(programmed_true);
                programmed(st, &sync, live_true);
            }
        }
        self.metrics.connected_proxies.set(connected);
        self.metrics.in_sync_proxies.set(in_sync);
        if self.settings.push.is_some() {
            let programmed: std::collections::BTreeSet<ObjectKey> = out
                .gateways
                .iter()
                .filter(|(_, s)| programmed_true(s))
                .map(|(k, _)| k.clone())
                .collect();
            for st in out
                .rate_limit_policies
                .values_mut()
                .chain(out.auth_policies.values_mut())
                .chain(out.client_policies.values_mut())
            {
                enforced(st, &programmed);
            }
        }
        out
    }

    /// The resourceVersion of an object of ours, as the store has it.
    fn live_version(&self, kind: &str, key: &ObjectKey) -> Option<String> {
        match kind {
            "GatewayClass" => self
                .stores
                .gateway_classes
                .get(&ObjectRef::new(&key.name))
                .and_then(|o| o.resource_version()),
            "Gateway" => self
                .stores
                .gateways
                .get(&ObjectRef::new(&key.name).within(&key.namespace))
                .and_then(|o| o.resource_version()),
            "GRPCRoute" => self
                .stores
                .grpc_routes
                .get(&ObjectRef::new(&key.name).within(&key.namespace))
                .and_then(|o| o.resource_version()),
            "TLSRoute" => self
                .stores
                .tls_routes
                .get(&ObjectRef::new(&key.name).within(&key.namespace))
                .and_then(|o| o.resource_version()),
            "TCPRoute" => self
                .stores
                .tcp_routes
                .get(&ObjectRef::new(&key.name).within(&key.namespace))
                .and_then(|o| o.resource_version()),
            "UDPRoute" => self
                .stores
                .udp_routes
                .get(&ObjectRef::new(&key.name).within(&key.namespace))
                .and_then(|o| o.resource_version()),
            "ListenerSet" => self
                .stores
                .listener_sets
                .get(&ObjectRef::new(&key.name).within(&key.namespace))
                .and_then(|o| o.resource_version()),
            "RateLimitPolicy" => self
                .stores
                .rate_limit_policies
                .get(&ObjectRef::new(&key.name).within(&key.namespace))
                .and_then(|o| o.resource_version()),
            "AuthPolicy" => self
                .stores
                .auth_policies
                .get(&ObjectRef::new(&key.name).within(&key.namespace))
                .and_then(|o| o.resource_version()),
            "ClientPolicy" => self
                .stores
                .client_policies
                .get(&ObjectRef::new(&key.name).within(&key.namespace))
                .and_then(|o| o.resource_version()),
            "BackendPolicy" => self
                .stores
                .backend_policies
                .get(&ObjectRef::new(&key.name).within(&key.namespace))
                .and_then(|o| o.resource_version()),
            "BackendTLSPolicy" => self
                .stores
                .backend_tls_policies
                .get(&ObjectRef::new(&key.name).within(&key.namespace))
                .and_then(|o| o.resource_version()),
            "XBackendTrafficPolicy" => self
                .stores
                .backend_traffic_policies
                .get(&ObjectRef::new(&key.name).within(&key.namespace))
                .and_then(|o| o.resource_version()),
            _ => self
                .stores
                .http_routes
                .get(&ObjectRef::new(&key.name).within(&key.namespace))
                .and_then(|o| o.resource_version()),
        }
    }

    /// `status.addresses` of a provisioned Gateway, from its proxy Service as watched.
    fn addresses(&self, gateway: &ObjectKey) -> Vec<GatewayStatusAddresses> {
        let name = provision::object_name(&gateway.name);
        let r = ObjectRef::new(&name).within(&gateway.namespace);
        self.stores
            .services
            .get(&r)
            .and_then(|s| s.as_ok().map(provision::addresses))
            .unwrap_or_default()
    }

    async fn write_statuses(&mut self) -> Outcome {
        let desired = self.desired();
        let mut writes = status::plan(&desired, &self.stores, &self.settings.controller_name);
        // Skip writes whose echo has not arrived yet; forget echoes that have.
        let live: Vec<Option<String>> = writes
            .iter()
            .map(|w| self.live_version(w.kind(), &w.key()))
            .collect();
        let mut planned = Vec::with_capacity(writes.len());
        for (w, rv) in writes.drain(..).zip(live) {
            let id = (w.kind(), w.key());
            match (self.written.get(&id), &rv) {
                (Some(done), Some(rv)) if done == rv => continue,
                (Some(_), _) => {
                    self.written.remove(&id);
                }
                _ => {}
            }
            planned.push((w, rv));
        }
        // Keep only entries still waiting for their echo (bounded by recent writes).
        let written = std::mem::take(&mut self.written);
        self.written = written
            .into_iter()
            .filter(|((kind, key), rv)| self.live_version(kind, key).as_ref() == Some(rv))
            .collect();
        if planned.is_empty() {
            return Outcome::default();
        }
        let mut outcome = Outcome {
            more: planned.len() > WRITES_PER_PASS,
            ..Outcome::default()
        };
        planned.truncate(WRITES_PER_PASS);
        info!(
            writes = planned.len(),
            more = outcome.more,
            "writing statuses"
        );
        let jobs = planned.into_iter().map(|(w, rv)| {
            let rejections = status::new_rejections(&w, &self.stores);
            let client = self.client.clone();
            let manager = self.settings.controller_name.clone();
            let limit = self.settings.api_timeout;
            async move {
                let r = bounded(limit, status::apply(&client, &w, &manager)).await;
                (w, rv, rejections, r)
            }
        });
        let results: Vec<_> = futures_util::stream::iter(jobs)
            .buffer_unordered(16)
            .collect()
            .await;
        for (w, rv, rejections, r) in results {
            let result = match &r {
                Ok(()) => "ok",
                Err(CallError::Failed(kube::Error::Api(s))) if s.code == 409 => "conflict",
                Err(CallError::Failed(_)) => "error",
                Err(CallError::TimedOut(_)) => "timeout",
            };
            self.metrics
                .status_writes
                .get_or_create(&KindResult {
                    kind: w.kind().to_owned(),
                    result: result.to_owned(),
                })
                .inc();
            match r {
                Ok(()) => {
                    debug!(kind = w.kind(), object = %w.key(), "status written");
                    if let Some(rv) = rv {
                        self.written.insert((w.kind(), w.key()), rv);
                    }
                    self.publish_events(&w, &rejections).await;
                }
                Err(e) => {
                    outcome.retry = true;
                    warn!(kind = w.kind(), object = %w.key(), error = %e, "status write failed; will retry");
                }
            }
        }
        outcome
    }

    async fn publish_events(&self, w: &StatusWrite, rejections: &[status::NewRejection]) {
        if rejections.is_empty() {
            return;
        }
        let key = w.key();
        let uid = match w {
            StatusWrite::GatewayClass { name, .. } => self
                .stores
                .gateway_classes
                .get(&ObjectRef::new(name))
                .and_then(|o| o.uid()),
            StatusWrite::Release { .. } => None,
            StatusWrite::Gateway { .. } => self
                .stores
                .gateways
                .get(&ObjectRef::new(&key.name).within(&key.namespace))
                .and_then(|o| o.uid()),
            StatusWrite::HttpRoute { .. } => self
                .stores
                .http_routes
                .get(&ObjectRef::new(&key.name).within(&key.namespace))
                .and_then(|o| o.uid()),
            StatusWrite::GrpcRoute { .. } => self
                .stores
                .grpc_routes
                .get(&ObjectRef::new(&key.name).within(&key.namespace))
                .and_then(|o| o.uid()),
            StatusWrite::TlsRoute { .. } => self
                .stores
                .tls_routes
                .get(&ObjectRef::new(&key.name).within(&key.namespace))
                .and_then(|o| o.uid()),
            StatusWrite::TcpRoute { .. } => self
                .stores
                .tcp_routes
                .get(&ObjectRef::new(&key.name).within(&key.namespace))
                .and_then(|o| o.uid()),
            StatusWrite::UdpRoute { .. } => self
                .stores
                .udp_routes
                .get(&ObjectRef::new(&key.name).within(&key.namespace))
                .and_then(|o| o.uid()),
            StatusWrite::ListenerSet { .. } => self
                .stores
                .listener_sets
                .get(&ObjectRef::new(&key.name).within(&key.namespace))
                .and_then(|o| o.uid()),
            StatusWrite::BackendTlsPolicy { .. } => self
                .stores
                .backend_tls_policies
                .get(&ObjectRef::new(&key.name).within(&key.namespace))
                .and_then(|o| o.uid()),
            StatusWrite::TrafficPolicy { .. } => self
                .stores
                .backend_traffic_policies
                .get(&ObjectRef::new(&key.name).within(&key.namespace))
                .and_then(|o| o.uid()),
            StatusWrite::Policy { kind, .. } => {
                let (name, ns) = (key.name.as_str(), key.namespace.as_str());
                if *kind == "RateLimitPolicy" {
                    let r = ObjectRef::new(name).within(ns);
                    self.stores
                        .rate_limit_policies
                        .get(&r)
                        .and_then(|o| o.uid())
                } else if *kind == "ClientPolicy" {
                    let r = ObjectRef::new(name).within(ns);
                    self.stores.client_policies.get(&r).and_then(|o| o.uid())
                } else if *kind == "BackendPolicy" {
                    let r = ObjectRef::new(name).within(ns);
                    self.stores.backend_policies.get(&r).and_then(|o| o.uid())
                } else {
                    let r = ObjectRef::new(name).within(ns);
                    self.stores.auth_policies.get(&r).and_then(|o| o.uid())
                }
            }
        };
        let api_version = match w {
            StatusWrite::TrafficPolicy { .. } => super::traffic_status::API_VERSION,
            StatusWrite::Policy { .. } => "tollgate.dev/v1alpha1",
            _ => "gateway.networking.k8s.io/v1",
        };
        let reference = ObjectReference {
            api_version: Some(api_version.to_owned()),
            kind: Some(w.kind().to_owned()),
            name: Some(key.name.clone()),
            namespace: (!key.namespace.is_empty()).then(|| key.namespace.clone()),
            uid,
            ..ObjectReference::default()
        };
        for r in rejections {
            let mut note = String::new();
            if let Some(p) = &r.part {
                note.push_str(p);
                note.push_str(": ");
            }
            note.push_str(&format!("{}=False: {}", r.condition, r.message));
            note.truncate(1000);
            let ev = Event {
                type_: EventType::Warning,
                reason: r.reason.clone(),
                note: Some(note),
                action: "Reconcile".to_owned(),
                secondary: None,
            };
            match bounded(
                self.settings.api_timeout,
                self.recorder.publish(&ev, &reference),
            )
            .await
            {
                Err(e) => warn!(object = %key, error = %e, "event not published"),
                Ok(()) => {
                    self.metrics
                        .events
                        .get_or_create(&kind_label(w.kind()))
                        .inc();
                }
            }
        }
    }

    /// Provisions accepted Gateways (and, with a push server, issues their proxy Secrets)
    /// whose spec or metadata changed, after a CA rotation, and every [`REPROVISION`]; then
    /// deprovisions Gateways that lost their table. Addresses are read from the watched
    /// Service at each status pass, so a load balancer's late address lands without
    /// provisioning again.
    /// Returns whether every Gateway that needed it was (de)provisioned.
    async fn provision(&mut self) -> bool {
        let cfg = self.settings.provision.clone();
        let pki = self.settings.pki.clone();
        if cfg.is_none() && pki.is_none() {
            return true;
        }
        let mut all_done = true;
        let gone: Vec<ObjectKey> = self
            .provisioned
            .keys()
            .filter(|k| !self.compiled.tables.contains_key(*k))
            .cloned()
            .collect();
        // Removals first (of what any attempt may have created, failed ones included), on a
        // budget of their own: a Gateway whose provisioning hangs must not keep a deleted
        // one's objects alive.
        let removing = Instant::now();
        for key in gone {
            if removing.elapsed() >= PROVISION_BUDGET {
                all_done = false;
                break;
            }
            if cfg.is_some()
                && let Err(e) = bounded(
                    self.settings.api_timeout,
                    provision::deprovision(&self.client, &key.namespace, &key.name),
                )
                .await
            {
                warn!(gateway = %key, error = %e, "deprovisioning failed; will retry");
                all_done = false;
                continue;
            }
            info!(gateway = %key, "proxy deprovisioned");
            self.provisioned.remove(&key);
        }
        let started = Instant::now();
        let mut keys: Vec<ObjectKey> = self.compiled.tables.keys().cloned().collect();
        // Least recently attempted first (never attempted before all): when the budget stops
        // a pass, the next one goes on with the Gateways this one did not reach.
        keys.sort_by_key(|k| self.provisioned.get(k).map(|p| p.at));
        for key in keys {
            let r = ObjectRef::new(&key.name).within(&key.namespace);
            let Some(gw) = self
                .stores
                .gateways
                .get(&r)
                .and_then(|g| g.as_ok().cloned())
            else {
                continue;
            };
            // Ports ListenerSets add are served as the Gateway's own are.
            let served: Vec<(u16, tollgate_api::Protocol)> = self
                .compiled
                .tables
                .get(&key)
                .map(|t| t.ports.iter().map(|p| (p.port, p.protocol)).collect())
                .unwrap_or_default();
            let fingerprint = format!(
                "{}/{:?}/{:?}/{:?}/{}/{served:?}",
                gw.uid().unwrap_or_default(),
                gw.metadata.generation,
                gw.metadata.labels,
                gw.metadata.annotations,
                pki.as_ref().map_or(0, PushPki::generation),
            );
            let fresh = self.provisioned.get(&key).is_some_and(|p| {
                p.fingerprint.as_ref() == Some(&fingerprint) && p.at.elapsed() < REPROVISION
            });
            if fresh {
                continue;
            }
            if started.elapsed() >= PROVISION_BUDGET {
                all_done = false;
                break;
            }
            let at = Instant::now();
            let mut done = true;
            if let Some(pki) = &pki {
                let ca = pki.current();
                if let Err(e) = bounded(
                    self.settings.api_timeout,
                    ensure_proxy_secret(&self.client, &key.namespace, &key.name, &ca),
                )
                .await
                {
                    warn!(gateway = %key, error = %e, "proxy TLS Secret not issued; will retry");
                    done = false;
                }
            }
            if let Some(cfg) = &cfg {
                match bounded(
                    self.settings.api_timeout,
                    provision::provision(&self.client, cfg, &gw, &served),
                )
                .await
                {
                    Ok(addresses) => {
                        info!(gateway = %key, addresses = addresses.len(), "proxy provisioned");
                    }
                    Err(e) => {
                        warn!(gateway = %key, error = %e, "provisioning failed; will retry");
                        done = false;
                    }
                }
            }
            all_done &= done;
            let fingerprint = done.then_some(fingerprint);
            self.provisioned
                .insert(key, Provisioned { fingerprint, at });
        }
        all_done
    }
}

/// Compiles `inputs` after `previous` (the last compile's output): hands the compiler the
/// policies `previous` found valid, so a policy that became invalid keeps its last valid
/// version (fail closed), and names our controller on route parents.
pub fn compile_next(previous: &Output, inputs: &mut Inputs, controller_name: &str) -> Output {
    inputs.last_valid = previous.last_valid.clone();
    let mut out = compile(inputs);
    name_parents(&mut out, controller_name);
    out
}

/// Makes the compiler treat `controller_name`'s classes as its own and nothing else: the
/// compiler knows one name ([`CONTROLLER_NAME`]); several installs (and parallel tests) each
/// own their name.
pub fn own_classes(inputs: &mut Inputs, controller_name: &str) {
    if controller_name == CONTROLLER_NAME {
        return;
    }
    for c in &mut inputs.gateway_classes {
        c.spec.controller_name = if c.spec.controller_name == controller_name {
            CONTROLLER_NAME.to_owned()
        } else {
            format!("not-ours/{}", c.spec.controller_name)
        };
    }
}

/// Writes `controller_name` into every route parent entry of `out`.
pub fn name_parents(out: &mut Output, controller_name: &str) {
    for p in out.http_routes.values_mut().flat_map(|s| &mut s.parents) {
        p.set_controller_name(controller_name);
    }
    for p in out.grpc_routes.values_mut().flat_map(|s| &mut s.parents) {
        p.set_controller_name(controller_name);
    }
    for p in out.tls_routes.values_mut().flat_map(|s| &mut s.parents) {
        p.set_controller_name(controller_name);
    }
    for p in out.tcp_routes.values_mut().flat_map(|s| &mut s.parents) {
        p.set_controller_name(controller_name);
    }
    for p in out.udp_routes.values_mut().flat_map(|s| &mut s.parents) {
        p.set_controller_name(controller_name);
    }
}

#[cfg(test)]
#[path = "reconcile_tests.rs"]
mod tests;
