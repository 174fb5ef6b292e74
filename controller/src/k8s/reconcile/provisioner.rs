//! The Provisioner, on the leader: for each Gateway with a table, the proxy's objects
//! (ServiceAccount, Deployment, Service; with a push server, the proxy's TLS Secret) applied
//! when the Gateway changed, after a CA rotation and every [`REPROVISION`] (which reverts
//! drift: the objects are not watched); the objects of Gateways that lost their table removed.
//!
//! In: the compiled [`Output`] and the watched Gateways. Out: whether every Gateway that
//! needed it was (de)provisioned; addresses are read from the watched Service by the status
//! writer, so a load balancer's late address lands without provisioning again.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};
use tollgate_api::ObjectKey;
use tracing::{info, warn};

use super::{PushPki, bounded};
use crate::compile::Output;
use crate::k8s::provision::{self, ProvisionConfig};
use crate::k8s::stores::Stores;
use crate::push::pki::ensure_proxy_secret;

/// Provisioned objects are applied again at least this often (they are not watched: a
/// deleted Deployment comes back within this period).
const REPROVISION: Duration = Duration::from_secs(300);

/// How long one reconcile goes on starting provisioning work: past it, the Gateways not
/// reached are left for the next full reconcile ([`super::REPROVISION_RETRY`] later; least
/// recently attempted first), so an API server or admission webhook that answers slowly holds
/// status writes and the next table publication back by about this much (plus the calls in
/// flight), not by its delay times the number of Gateways.
pub const PROVISION_BUDGET: Duration = Duration::from_secs(10);

/// A Gateway's last provisioning attempt.
#[derive(Debug, Clone)]
struct Attempt {
    /// What it applied; `None` when it failed (objects may exist in part).
    fingerprint: Option<String>,
    /// When it started.
    at: Instant,
}

pub(super) struct Provisioner {
    client: Client,
    config: Option<ProvisionConfig>,
    pki: Option<PushPki>,
    api_timeout: Duration,
    attempts: BTreeMap<ObjectKey, Attempt>,
}

impl Provisioner {
    pub(super) fn new(
        client: Client,
        config: Option<ProvisionConfig>,
        pki: Option<PushPki>,
        api_timeout: Duration,
    ) -> Self {
        Self {
            client,
            config,
            pki,
            api_timeout,
            attempts: BTreeMap::new(),
        }
    }

    /// Whether proxies are provisioned at all.
    pub(super) fn provisions(&self) -> bool {
        self.config.is_some()
    }

    /// One pass; returns whether every Gateway that needed it was (de)provisioned.
    pub(super) async fn run(&mut self, compiled: &Output, stores: &Stores) -> bool {
        if self.config.is_none() && self.pki.is_none() {
            return true;
        }
        let mut all_done = self.remove_gone(compiled).await;
        let started = Instant::now();
        let mut keys: Vec<ObjectKey> = compiled.tables.keys().cloned().collect();
        // Least recently attempted first (never attempted before all): when the budget stops
        // a pass, the next one goes on with the Gateways this one did not reach.
        keys.sort_by_key(|k| self.attempts.get(k).map(|p| p.at));
        for key in keys {
            let r = ObjectRef::new(&key.name).within(&key.namespace);
            let Some(gw) = stores.gateways.get(&r).and_then(|g| g.as_ok().cloned()) else {
                continue;
            };
            // Ports ListenerSets add are served as the Gateway's own are.
            let served: Vec<(u16, tollgate_api::Protocol)> = compiled
                .tables
                .get(&key)
                .map(|t| t.ports.iter().map(|p| (p.port, p.protocol)).collect())
                .unwrap_or_default();
            let params = compiled.parameters.get(&key);
            let fingerprint = format!(
                "{}/{:?}/{:?}/{:?}/{}/{served:?}/{params:?}",
                gw.uid().unwrap_or_default(),
                gw.metadata.generation,
                gw.metadata.labels,
                gw.metadata.annotations,
                self.pki.as_ref().map_or(0, PushPki::generation),
            );
            let fresh = self.attempts.get(&key).is_some_and(|p| {
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
            let done = self.provision_one(&key, &gw, params, &served).await;
            all_done &= done;
            let fingerprint = done.then_some(fingerprint);
            self.attempts.insert(key, Attempt { fingerprint, at });
        }
        all_done
    }

    /// Removes the objects of Gateways that lost their table (of what any attempt may have
    /// created, failed ones included), first and on a budget of their own: a Gateway whose
    /// provisioning hangs must not keep a deleted one's objects alive.
    async fn remove_gone(&mut self, compiled: &Output) -> bool {
        let gone: Vec<ObjectKey> = self
            .attempts
            .keys()
            .filter(|k| !compiled.tables.contains_key(*k))
            .cloned()
            .collect();
        let removing = Instant::now();
        let mut all_done = true;
        for key in gone {
            if removing.elapsed() >= PROVISION_BUDGET {
                return false;
            }
            if self.config.is_some()
                && let Err(e) = bounded(
                    self.api_timeout,
                    provision::deprovision(&self.client, &key.namespace, &key.name),
                )
                .await
            {
                warn!(gateway = %key, error = %e, "deprovisioning failed; will retry");
                all_done = false;
                continue;
            }
            info!(gateway = %key, "proxy deprovisioned");
            self.attempts.remove(&key);
        }
        all_done
    }

    /// The proxy's TLS Secret (with a push CA) and objects (when provisioning) of one Gateway.
    /// Parameters that cannot be used (`Err`, said in the Gateway's status) leave its objects
    /// as they are: that is done, not retried, until an edit changes them.
    async fn provision_one(
        &self,
        key: &ObjectKey,
        gw: &gateway_types::gateways::Gateway,
        params: Option<&Result<crate::crds::GatewayParametersSpec, String>>,
        served: &[(u16, tollgate_api::Protocol)],
    ) -> bool {
        let mut done = true;
        if let Some(pki) = &self.pki {
            let ca = pki.current();
            if let Err(e) = bounded(
                self.api_timeout,
                ensure_proxy_secret(&self.client, &key.namespace, &key.name, &ca),
            )
            .await
            {
                warn!(gateway = %key, error = %e, "proxy TLS Secret not issued; will retry");
                done = false;
            }
        }
        let default = crate::crds::GatewayParametersSpec::default();
        let params = match params {
            None => &default,
            Some(Ok(p)) => p,
            Some(Err(e)) => {
                if self.config.is_some() {
                    warn!(gateway = %key, error = %e, "GatewayParameters invalid: proxy objects left as they are");
                }
                return done;
            }
        };
        if let Some(cfg) = &self.config {
            match bounded(
                self.api_timeout,
                provision::provision(&self.client, cfg, gw, params, served),
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
        done
    }
}
