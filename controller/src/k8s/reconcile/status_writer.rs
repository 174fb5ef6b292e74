//! The StatusWriter, on the leader: [`final_status`] (pure) computes every object's status
//! from the compiled one, the proxies' sync and provisioning; then the writes that bring the
//! live objects there go out by server-side apply, a bounded number per pass, and a Warning
//! Event for each condition a write turns False.
//!
//! In: the compiled [`Output`], the [`Stores`], the push server's sync state. Out: status
//! writes and Events; an [`Outcome`] saying whether to come back (a write failed, more are due).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures_util::StreamExt;
use gateway_types::gateways::GatewayStatusAddresses;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};
use tollgate_api::ObjectKey;
use tracing::{debug, info, warn};

use super::{CallError, Outcome, bounded};
use crate::compile::Output;
use crate::k8s::metrics::{KindResult, Metrics, kind as kind_label};
use crate::k8s::overlay::{enforced, programmed, programmed_true, static_addresses};
use crate::k8s::provision;
use crate::k8s::status::{self, StatusWrite};
use crate::k8s::stores::Stores;
use crate::push::{PushServer, SyncState};

/// Most status writes one pass sends, so that a mass update (10k routes on first start) never
/// holds table publishing back for long: the loop interleaves other reconciles between passes.
const WRITES_PER_PASS: usize = 256;

/// What a Gateway's final status depends on besides the compiler.
#[derive(Debug, Clone, Default)]
pub struct GatewayFacts {
    /// Provisioning only: the IPs the Gateway's `spec.addresses` request, and the addresses
    /// its proxy Service has (the load balancer's, else the cluster IPs).
    pub provisioned: Option<(Vec<String>, Vec<GatewayStatusAddresses>)>,
    /// Pushing only: the push server's sync state of the Gateway's proxies.
    pub sync: Option<SyncState>,
    /// The live Gateway's `Programmed` is True (so a table change in flight does not lower it).
    pub live_programmed: bool,
}

/// Every object's final status. Pure: the compiled statuses with, per Gateway, the addresses
/// provisioning gave it (`Programmed=False`, `AddressNotUsable`, while a requested one is not
/// assigned) and `Programmed` from its proxies' sync (True once one runs the current version;
/// once True, kept while proxies are connected and none refused a version); then each policy
/// `Enforced` only on the Gateways that are Programmed. `pushing`: tables go to proxies, so
/// Programmed and Enforced wait for them (facts without `sync` count as no proxy).
pub fn final_status(
    compiled: &Output,
    facts: &BTreeMap<ObjectKey, GatewayFacts>,
    pushing: bool,
) -> Output {
    let mut out = compiled.clone();
    let none = GatewayFacts::default();
    for (key, st) in &mut out.gateways {
        let f = facts.get(key).unwrap_or(&none);
        if let Some((requested, assigned)) = &f.provisioned {
            static_addresses(st, requested, assigned.clone());
        }
        if pushing {
            let sync = f.sync.clone().unwrap_or_default();
            programmed(st, &sync, f.live_programmed);
        }
    }
    if pushing {
        let programmed: BTreeSet<ObjectKey> = out
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
            .chain(out.cache_policies.values_mut())
        {
            enforced(st, &programmed);
        }
    }
    out
}

/// The facts of every Gateway of `compiled`, read from the stores and the push server.
pub(super) fn gateway_facts(
    compiled: &Output,
    stores: &Stores,
    push: Option<&PushServer>,
    provisioning: bool,
) -> BTreeMap<ObjectKey, GatewayFacts> {
    let mut facts = BTreeMap::new();
    for key in compiled.gateways.keys() {
        let live = stores
            .gateways
            .get(&ObjectRef::new(&key.name).within(&key.namespace));
        let live = live.as_deref().and_then(|g| g.as_ok());
        let provisioned = provisioning.then(|| {
            let requested = live.map(provision::requested_addresses).unwrap_or_default();
            let service = provision::object_name(&key.name);
            let assigned = stores
                .services
                .get(&ObjectRef::new(&service).within(&key.namespace))
                .and_then(|s| s.as_ok().map(provision::addresses))
                .unwrap_or_default();
            (requested, assigned)
        });
        let live_programmed = live
            .and_then(|g| g.status.as_ref())
            .is_some_and(programmed_true);
        facts.insert(
            key.clone(),
            GatewayFacts {
                provisioned,
                sync: push.map(|p| p.sync(key)),
                live_programmed,
            },
        );
    }
    facts
}

/// Runs `$e` on the watched object of kind `$kind` and key `$key` (`o` names it).
macro_rules! on_object {
    ($stores:expr, $kind:expr, $key:expr, |$o:ident| $e:expr) => {{
        let key: &ObjectKey = $key;
        macro_rules! r {
            () => {
                ObjectRef::new(&key.name).within(&key.namespace)
            };
        }
        let s = $stores;
        match $kind {
            "GatewayClass" => s
                .gateway_classes
                .get(&ObjectRef::new(&key.name))
                .and_then(|$o| $e),
            "Gateway" => s.gateways.get(&r!()).and_then(|$o| $e),
            "GRPCRoute" => s.grpc_routes.get(&r!()).and_then(|$o| $e),
            "TLSRoute" => s.tls_routes.get(&r!()).and_then(|$o| $e),
            "TCPRoute" => s.tcp_routes.get(&r!()).and_then(|$o| $e),
            "UDPRoute" => s.udp_routes.get(&r!()).and_then(|$o| $e),
            "ListenerSet" => s.listener_sets.get(&r!()).and_then(|$o| $e),
            "RateLimitPolicy" => s.rate_limit_policies.get(&r!()).and_then(|$o| $e),
            "AuthPolicy" => s.auth_policies.get(&r!()).and_then(|$o| $e),
            "ClientPolicy" => s.client_policies.get(&r!()).and_then(|$o| $e),
            "BackendPolicy" => s.backend_policies.get(&r!()).and_then(|$o| $e),
            "CachePolicy" => s.cache_policies.get(&r!()).and_then(|$o| $e),
            "BackendTLSPolicy" => s.backend_tls_policies.get(&r!()).and_then(|$o| $e),
            "XBackendTrafficPolicy" => s.backend_traffic_policies.get(&r!()).and_then(|$o| $e),
            _ => s.http_routes.get(&r!()).and_then(|$o| $e),
        }
    }};
}

pub(super) struct StatusWriter {
    client: Client,
    recorder: Recorder,
    manager: String,
    api_timeout: Duration,
    /// resourceVersion each written object had when we planned its write: until the watch
    /// brings a newer one (the echo of our write), planning it again would be a duplicate.
    written: BTreeMap<(&'static str, ObjectKey), String>,
    /// The last pass's writes, (made, failed), for the reconcile span.
    last_pass: (usize, usize),
}

impl StatusWriter {
    pub(super) fn new(client: Client, manager: String, api_timeout: Duration, id: &str) -> Self {
        let reporter = kube::runtime::events::Reporter {
            controller: "tollgate-controller".to_owned(),
            instance: Some(id.to_owned()),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            manager,
            api_timeout,
            written: BTreeMap::new(),
            last_pass: (0, 0),
        }
    }

    /// The writes of the last pass: (made, failed).
    pub(super) fn last_pass(&self) -> (usize, usize) {
        self.last_pass
    }

    /// Writes what `desired` (see [`final_status`]) needs of the live objects.
    pub(super) async fn run(
        &mut self,
        desired: &Output,
        stores: &Stores,
        metrics: &Metrics,
    ) -> Outcome {
        self.last_pass = (0, 0);
        let live_version =
            |kind: &str, key: &ObjectKey| on_object!(stores, kind, key, |o| o.resource_version());
        let mut writes = status::plan(desired, stores, &self.manager);
        let live: Vec<Option<String>> = writes
            .iter()
            .map(|w| live_version(w.kind(), &w.key()))
            .collect();
        // Skip writes whose echo has not arrived yet; forget echoes that have.
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
        self.written
            .retain(|(kind, key), rv| live_version(kind, key).as_ref() == Some(rv));
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
            let rejections = status::new_rejections(&w, stores);
            let client = self.client.clone();
            let manager = self.manager.clone();
            let limit = self.api_timeout;
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
            metrics
                .status_writes
                .get_or_create(&KindResult {
                    kind: w.kind().to_owned(),
                    result: result.to_owned(),
                })
                .inc();
            match r {
                Ok(()) => {
                    self.last_pass.0 += 1;
                    debug!(kind = w.kind(), object = %w.key(), "status written");
                    if let Some(rv) = rv {
                        self.written.insert((w.kind(), w.key()), rv);
                    }
                    self.publish_events(&w, &rejections, stores, metrics).await;
                }
                Err(e) => {
                    self.last_pass.1 += 1;
                    outcome.retry = true;
                    warn!(kind = w.kind(), object = %w.key(), error = %e, "status write failed; will retry");
                }
            }
        }
        outcome
    }

    /// A Warning Event on the written object for each condition the write turned False.
    async fn publish_events(
        &self,
        w: &StatusWrite,
        rejections: &[status::NewRejection],
        stores: &Stores,
        metrics: &Metrics,
    ) {
        if rejections.is_empty() {
            return;
        }
        let key = w.key();
        let uid = match w {
            StatusWrite::Release { .. } => None,
            _ => on_object!(stores, w.kind(), &key, |o| o.uid()),
        };
        let api_version = match w {
            StatusWrite::TrafficPolicy { .. } => crate::k8s::traffic_status::API_VERSION,
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
            match bounded(self.api_timeout, self.recorder.publish(&ev, &reference)).await {
                Err(e) => warn!(object = %key, error = %e, "event not published"),
                Ok(()) => {
                    metrics.events.get_or_create(&kind_label(w.kind())).inc();
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "status_writer_tests.rs"]
mod tests;
