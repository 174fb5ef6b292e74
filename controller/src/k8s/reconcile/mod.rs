//! One reconcile, in three parts: the [`publisher`] (every replica: snapshot, compile,
//! publish each Gateway's table to the push server, so a new leader serves proxies at once),
//! then on the leader the [`provisioner`] (each Gateway's proxy objects: desired, applied,
//! drift reverted, removed with the Gateway) and the [`status_writer`] (one pure function,
//! [`final_status`], computes each object's status from the compiled one, the proxies' sync
//! and provisioning; server-side apply and Events). What is owed afterwards, and how soon the
//! loop comes back for it, is the [`Outcome`]: the one place retries and backoff are decided.
//!
//! With tracing on ([`Settings::tracing`]), each sampled reconcile is one `reconcile` span
//! (what it did: path, Gateways and routes compiled, tables published, statuses written,
//! provisioning, the error if any) with a child span per phase it ran: `snapshot`, `compile`,
//! `push`, `provision`, `status`. Off, or for a reconcile the sampler drops, no span work.
//!
//! In: the [`Stores`], what changed ([`Relevance`]), whether this replica leads. The
//! compiled output is kept between reconciles, so a status-only change (often the echo of our
//! own write) costs a comparison, not a compile, and an EndpointSlice-only change skips
//! statuses and provisioning.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use kube::Client;
use tollgate_proxy::otel::{Span, TraceSettings, Tracer};
use tracing::debug;

use super::metrics::{Metrics, PathLabel};
pub use super::overlay::{enforced, programmed, programmed_true, static_addresses};
use super::provision::ProvisionConfig;
use super::stores::{Kinds, Relevance, Stores};
use crate::compile::Output;
use crate::push::PushServer;
use crate::push::pki::Ca;

mod outcome;
mod provisioner;
mod publisher;
mod status_writer;

pub use outcome::{Outcome, REPROVISION_RETRY, STATUS_RETRY, UNREADABLE_GRACE};
pub use provisioner::PROVISION_BUDGET;
use publisher::count;
pub use publisher::{compile_next, name_parents, own_classes};
pub use status_writer::{GatewayFacts, final_status};

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
    /// OTLP export of reconcile spans; `None`: tracing off.
    pub tracing: Option<TraceSettings>,
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

    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }
}

/// What started a reconcile, for its span.
#[derive(Debug, Clone, Copy, Default)]
pub struct Trigger {
    /// `start`, `watch` (changes of the watched objects), `leadership`, `proxies` (their
    /// sync with the push server), `retry` (work owed); empty: not said.
    pub cause: &'static str,
    /// The kinds of the changes a `watch` reconcile covers.
    pub kinds: Kinds,
}

/// The reconciler's state between reconciles: its three parts.
pub struct Reconciler {
    publisher: publisher::Publisher,
    provisioner: provisioner::Provisioner,
    statuses: status_writer::StatusWriter,
    push: Option<PushServer>,
    metrics: Arc<Metrics>,
    tracer: Option<Arc<Tracer>>,
}

impl Reconciler {
    /// A reconciler over `stores`; events are reported as `id`. With [`Settings::tracing`],
    /// starts the span export task on the current runtime.
    pub fn new(
        client: Client,
        stores: Stores,
        settings: Settings,
        metrics: Arc<Metrics>,
        id: &str,
    ) -> Self {
        let provisioning = settings.provision.is_some();
        let tracer = settings.tracing.as_ref().and_then(|t| {
            Tracer::start_as(
                t,
                metrics.trace_spans_dropped.clone(),
                "tollgate-controller",
            )
        });
        Self {
            publisher: publisher::Publisher::new(
                client.clone(),
                stores,
                settings.controller_name.clone(),
                settings.push.clone(),
                provisioning,
            ),
            provisioner: provisioner::Provisioner::new(
                client.clone(),
                settings.provision,
                settings.pki,
                settings.api_timeout,
            ),
            statuses: status_writer::StatusWriter::new(
                client,
                settings.controller_name,
                settings.api_timeout,
                id,
            ),
            push: settings.push,
            metrics,
            tracer,
        }
    }

    /// The last compiled output (with our controller name).
    pub fn compiled(&self) -> &Output {
        self.publisher.compiled()
    }

    /// Runs one reconcile.
    pub async fn reconcile(&mut self, relevance: Relevance, leading: bool) -> Outcome {
        self.reconcile_for(relevance, leading, Trigger::default())
            .await
    }

    /// Runs one reconcile, started by `trigger` (for its span).
    pub async fn reconcile_for(
        &mut self,
        relevance: Relevance,
        leading: bool,
        trigger: Trigger,
    ) -> Outcome {
        let started = Instant::now();
        let path = match relevance {
            Relevance::Full => "full",
            Relevance::Endpoints => "endpoints",
            Relevance::Status => "status",
        };
        let mut span = self.tracer.as_ref().and_then(|t| t.root("reconcile"));
        if let Some(s) = &mut span {
            s.set("tollgate.reconcile.path", path);
            s.set("tollgate.leader", leading);
            if !trigger.cause.is_empty() {
                s.set("tollgate.reconcile.trigger", trigger.cause);
            }
            if trigger.kinds != Kinds::default() {
                s.set("tollgate.reconcile.kinds", trigger.kinds.names());
            }
        }
        let mut unread = false;
        if relevance >= Relevance::Endpoints {
            match self
                .publisher
                .run(started, &self.metrics, span.as_ref())
                .await
            {
                publisher::Published::Held => {
                    if let Some(mut s) = span {
                        s.set("tollgate.reconcile.held", true);
                        s.fail("a referenced object could not be read: nothing published");
                        s.end();
                    }
                    return Outcome {
                        incomplete: true,
                        ..Outcome::default()
                    };
                }
                publisher::Published::Yes { unread: u } => unread = u,
            }
            if let Some(s) = &mut span {
                self.publisher.describe(s);
            }
        }
        let mut outcome = Outcome::default();
        // Status writes made and failed, when this reconcile wrote statuses.
        let mut writes = None;
        if relevance != Relevance::Endpoints && leading {
            let stores = &self.publisher.stores;
            let compiled = self.publisher.compiled();
            let provisioned = if relevance == Relevance::Full {
                let phase = span
                    .as_ref()
                    .filter(|_| self.provisioner.provisions())
                    .map(|s| s.child("provision"));
                let ok = self.provisioner.run(compiled, stores).await;
                if let Some(mut p) = phase {
                    p.set("tollgate.gateways", count(compiled.tables.len()));
                    if !ok {
                        p.fail("provisioning failed for some Gateway");
                    }
                    p.end();
                }
                ok
            } else {
                true
            };
            let phase = span.as_ref().map(|s| s.child("status"));
            let facts = status_writer::gateway_facts(
                compiled,
                stores,
                self.push.as_ref(),
                self.provisioner.provisions(),
            );
            let (connected, in_sync) = facts
                .values()
                .filter_map(|f| f.sync.as_ref())
                .fold((0, 0), |(c, s), sync| {
                    (c + i64::from(sync.connected), s + i64::from(sync.in_sync))
                });
            self.metrics.connected_proxies.set(connected);
            self.metrics.in_sync_proxies.set(in_sync);
            let desired = final_status(compiled, &facts, self.push.is_some());
            outcome = self.statuses.run(&desired, stores, &self.metrics).await;
            outcome.reprovision = !provisioned;
            if let Some(mut p) = phase {
                let (ok, failed) = self.statuses.last_pass();
                writes = Some((ok, failed));
                p.set("tollgate.status.writes", count(ok));
                p.set("tollgate.status.failed", count(failed));
                p.set("tollgate.status.more", outcome.more);
                if failed > 0 {
                    p.fail("status writes failed");
                }
                p.end();
            }
        }
        outcome.unread = unread;
        if let Some(s) = span {
            finish_span(s, outcome, writes);
        }
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
}

/// The reconcile span's summary of the status writes and what is owed, then the span sent.
fn finish_span(mut s: Span, outcome: Outcome, writes: Option<(usize, usize)>) {
    if let Some((ok, failed)) = writes {
        s.set("tollgate.status.writes", count(ok));
        s.set("tollgate.status.failed", count(failed));
    }
    if outcome.unread {
        s.set("tollgate.reconcile.unread", true);
    }
    if outcome.reprovision {
        s.fail("provisioning failed for some Gateway");
    } else if outcome.retry {
        s.fail("status writes failed");
    }
    s.end();
}

#[cfg(test)]
mod tests;
