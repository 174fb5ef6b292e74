//! Leader election on a coordination.k8s.io/v1 Lease.
//!
//! In: the Lease's namespace and name, this replica's identity. Out: a `watch` channel that is
//! `true` while this replica leads. Every `renew_period` the elector reads the Lease and:
//! creates it when missing; renews it when it holds it; takes it over when it is free or when
//! its record (holder, renewTime, resourceVersion) has not changed for `lease_duration` as
//! measured by this replica's own clock (client-go's rule, immune to clock skew between
//! replicas). Every write carries the read `resourceVersion`, so two candidates cannot both
//! win; a leader renews with one write from the Lease its last write returned, without
//! reading it first (a 409 then says someone else wrote since). A leader steps down at once
//! when a renewal conflicts (someone else took the Lease) and when `renew_deadline` has passed
//! since it sent its last successful renewal; until then a slow or failed round is retried
//! every `renew_period`, each attempt given the time left (client-go's rule and timings: a
//! 15 s Lease, 10 s deadline, 2 s period, because this host's API server has been measured
//! answering one request in 3-6 s during the conformance suite's bursts). Measured from the
//! renewal's sending, the step-down comes at least `lease_duration - renew_deadline` before
//! another replica may take over. A dead leader is replaced within about 17 s; one that shuts
//! down cleanly releases the Lease ([`Elector::release`]) and is replaced within
//! `renew_period`.
//!
//! [`spawn`] runs the elector on a thread of its own, with its own single-threaded runtime and,
//! given a [`kube::Config`], its own client and connection: a renewal never waits for a worker
//! thread busy compiling, for the client's request queue, or behind the reconciler's status
//! writes on a shared connection (on a busy 2-core host they did, and leaders lost their Lease
//! mid-run). Every round's duration is measured
//! (`tollgate_controller_lease_round_duration_seconds`), with failed rounds and leadership
//! changes counted, so slow renewals show before they cost a leadership.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::sync::{oneshot, watch};
use tracing::{info, warn};

use super::metrics::Metrics;

/// Settings of the elector.
#[derive(Debug, Clone)]
pub struct LeaderConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This replica's identity (pod name).
    pub id: String,
    /// How long a Lease stays valid without renewal.
    pub lease_duration: Duration,
    /// How often the Lease is read and renewed.
    pub renew_period: Duration,
    /// A leader whose renewals have failed this long steps down.
    pub renew_deadline: Duration,
    /// Owner of the Lease, set when this replica creates, renews or takes it (our Deployment:
    /// uninstalling it removes the Lease).
    pub owner: Option<OwnerReference>,
}

impl LeaderConfig {
    /// client-go's timings: 15 s lease, renewed every 2 s, 10 s renew deadline.
    pub fn new(namespace: &str, name: &str, id: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            id: id.to_owned(),
            lease_duration: Duration::from_secs(15),
            renew_period: Duration::from_secs(2),
            renew_deadline: Duration::from_secs(10),
            owner: None,
        }
    }
}

/// A running leader election.
pub struct Elector {
    api: Api<Lease>,
    cfg: LeaderConfig,
    tx: watch::Sender<bool>,
    metrics: Arc<Metrics>,
    /// The last Lease record seen and when it was first seen.
    observed: Option<(String, Instant)>,
    last_renewal: Option<Instant>,
    /// The Lease as our last successful write left it: a leader renews with one write from
    /// it, without reading first (a 409 says someone else wrote since).
    held: Option<Lease>,
}

impl Elector {
    /// An elector; [`Elector::run`] drives it.
    pub fn new(client: Client, cfg: LeaderConfig, metrics: Arc<Metrics>) -> Self {
        let (tx, _) = watch::channel(false);
        Self::with_sender(client, cfg, tx, metrics)
    }

    fn with_sender(
        client: Client,
        cfg: LeaderConfig,
        tx: watch::Sender<bool>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            api: Api::namespaced(client, &cfg.namespace),
            cfg,
            tx,
            metrics,
            observed: None,
            last_renewal: None,
            held: None,
        }
    }

    /// Whether this replica leads, now and as it changes.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.tx.subscribe()
    }

    /// Runs until the task is dropped.
    pub async fn run(&mut self) {
        loop {
            self.tick().await;
            tokio::time::sleep(self.cfg.renew_period).await;
        }
    }

    /// One round: read, then create, renew or take over the Lease.
    pub async fn tick(&mut self) {
        let leading = *self.tx.borrow();
        let started = Instant::now();
        // A leader's attempt may take what is left of the renew deadline since its last
        // renewal was sent, so a request the API server never answers cannot keep it leading
        // after its Lease ran out; a follower's attempt is bounded by the deadline alone.
        let budget = match (leading, self.last_renewal) {
            (true, Some(sent)) => {
                (sent + self.cfg.renew_deadline).saturating_duration_since(started)
            }
            _ => self.cfg.renew_deadline,
        };
        let result = if budget.is_zero() {
            None
        } else {
            Some(tokio::time::timeout(budget, self.try_acquire_or_renew()).await)
        };
        let took = started.elapsed();
        self.metrics
            .lease_round_duration
            .observe(took.as_secs_f64());
        if took > self.cfg.renew_period {
            warn!(lease = %self.cfg.name, took_ms = took.as_millis(), leading, "slow lease round");
        }
        let renewed = matches!(result, Some(Ok(Ok(true))));
        let now_leading = match result {
            Some(Ok(Ok(l))) => l,
            failed => {
                self.metrics.lease_round_failures.inc();
                match failed {
                    Some(Ok(Err(e))) => {
                        warn!(lease = %self.cfg.name, error = %e, leading, "lease update failed");
                    }
                    _ => warn!(lease = %self.cfg.name, leading, "lease update timed out"),
                }
                // Still within the deadline: the next round tries again.
                leading
                    && self
                        .last_renewal
                        .is_some_and(|sent| sent.elapsed() < self.cfg.renew_deadline)
            }
        };
        if renewed {
            // The attempt's start, not its answer: the API server wrote the renewal after
            // it was sent, so the deadline counted from here ends before the Lease does.
            self.last_renewal = Some(started);
        }
        if now_leading != leading {
            info!(lease = %self.cfg.name, id = %self.cfg.id, leading = now_leading, "leadership changed");
            self.metrics.leadership_changes.inc();
            self.metrics.leader.set(i64::from(now_leading));
            self.tx.send_replace(now_leading);
        }
    }

    async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let now = MicroTime(Timestamp::now());
        let secs = i32::try_from(self.cfg.lease_duration.as_secs()).unwrap_or(i32::MAX);
        if let Some(mut lease) = self.held.take() {
            // Renewal: one request instead of a read and a write.
            if let Some(spec) = lease.spec.as_mut() {
                spec.renew_time = Some(now);
                spec.lease_duration_seconds = Some(secs);
            }
            let written = self
                .api
                .replace(&self.cfg.name, &PostParams::default(), &lease)
                .await;
            return self.wrote(written);
        }
        let Some(mut lease) = self.api.get_opt(&self.cfg.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.cfg.name.clone()),
                    namespace: Some(self.cfg.namespace.clone()),
                    owner_references: self.cfg.owner.clone().map(|o| vec![o]),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.cfg.id.clone()),
                    lease_duration_seconds: Some(secs),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            let written = self.api.create(&PostParams::default(), &lease).await;
            return self.wrote(written);
        };
        let record = lease.metadata.resource_version.clone().unwrap_or_default();
        if self.observed.as_ref().is_none_or(|(r, _)| *r != record) {
            self.observed = Some((record, Instant::now()));
        }
        // A Lease created before we knew our Deployment gets it as an owner with the next
        // write of ours (a renewal or a take-over): no extra request.
        if let Some(owners) =
            self.cfg.owner.as_ref().and_then(|o| {
                super::owner::with_owner(lease.metadata.owner_references.as_deref(), o)
            })
        {
            lease.metadata.owner_references = Some(owners);
        }
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        if holder == self.cfg.id {
            spec.renew_time = Some(now);
            spec.lease_duration_seconds = Some(secs);
            let written = self
                .api
                .replace(&self.cfg.name, &PostParams::default(), &lease)
                .await;
            return self.wrote(written);
        }
        let duration = spec
            .lease_duration_seconds
            .map_or(self.cfg.lease_duration, |s| {
                Duration::from_secs(u64::try_from(s).unwrap_or(0))
            });
        let expired = self
            .observed
            .as_ref()
            .is_some_and(|(_, seen)| seen.elapsed() > duration);
        if !holder.is_empty() && !expired {
            return Ok(false);
        }
        info!(lease = %self.cfg.name, previous = %holder, id = %self.cfg.id, "taking over the lease");
        spec.holder_identity = Some(self.cfg.id.clone());
        spec.acquire_time = Some(now.clone());
        spec.renew_time = Some(now);
        spec.lease_duration_seconds = Some(secs);
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        let written = self
            .api
            .replace(&self.cfg.name, &PostParams::default(), &lease)
            .await;
        self.wrote(written)
    }

    /// Keeps the Lease a write returned for the next renewal; a 409 (someone else wrote
    /// first) means "not leader"; other errors propagate (the next round reads again).
    fn wrote(&mut self, r: Result<Lease, kube::Error>) -> Result<bool, kube::Error> {
        match r {
            Ok(lease) => {
                self.held = Some(lease);
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the Lease up if this replica holds it, so another takes over at once.
    pub async fn release(&mut self) {
        if !*self.tx.borrow() {
            return;
        }
        self.tx.send_replace(false);
        self.metrics.leader.set(0);
        let Ok(Some(mut lease)) = self.api.get_opt(&self.cfg.name).await else {
            return;
        };
        let Some(spec) = lease.spec.as_mut() else {
            return;
        };
        if spec.holder_identity.as_deref() != Some(self.cfg.id.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        match self
            .api
            .replace(&self.cfg.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => info!(lease = %self.cfg.name, "lease released"),
            Err(e) => warn!(lease = %self.cfg.name, error = %e, "lease not released"),
        }
    }
}

/// The client the elector talks to the API server with.
pub enum LeaseClient {
    /// A client of its own, built from this configuration on the elector's thread: its own
    /// connection and request queue. What `tollgate controller` uses.
    Own(Box<kube::Config>),
    /// The controller's client (shares its connection and queue).
    Shared(Client),
}

/// A running elector ([`spawn`]): whether this replica leads, and how to stop it.
pub struct Running {
    /// `true` while this replica leads.
    pub leading: watch::Receiver<bool>,
    stop: oneshot::Sender<()>,
    done: oneshot::Receiver<()>,
}

impl Running {
    /// Stops the elector, which releases the Lease if it holds it; waits up to 5 s for that.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(5), self.done).await;
    }
}

/// Why the elector could not start.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// No thread or runtime for it.
    #[error("starting the leader-election thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// Runs an elector on a thread of its own with a single-threaded runtime (see the module
/// docs), until [`Running::stop`].
pub fn spawn(
    client: LeaseClient,
    cfg: LeaderConfig,
    metrics: Arc<Metrics>,
) -> Result<Running, SpawnError> {
    let (tx, leading) = watch::channel(false);
    let (stop, mut stopped) = oneshot::channel::<()>();
    let (finished, done) = oneshot::channel::<()>();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("leader-election".to_owned())
        .spawn(move || {
            runtime.block_on(async move {
                let client = match client {
                    LeaseClient::Shared(c) => c,
                    LeaseClient::Own(config) => match Client::try_from(*config) {
                        Ok(c) => c,
                        Err(e) => {
                            // Never leads: the other replicas do, and this one serves as a
                            // follower; the error says why.
                            warn!(error = %e, "no client for leader election; this replica will not lead");
                            let _ = stopped.await;
                            return;
                        }
                    },
                };
                let mut elector = Elector::with_sender(client, cfg, tx, metrics);
                tokio::select! {
                    () = elector.run() => {}
                    _ = &mut stopped => {}
                }
                elector.release().await;
            });
            let _ = finished.send(());
        })?;
    Ok(Running {
        leading,
        stop,
        done,
    })
}
