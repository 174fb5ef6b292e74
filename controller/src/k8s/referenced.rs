//! Secrets and ConfigMaps held whole only while a Gateway references them.
//!
//! In: every TLS Secret and every ConfigMap the watches see, and the Gateways of each compile.
//! Out: store copies without their payload (`data`, `stringData`, `binaryData`) unless a
//! Gateway names them (listener `certificateRefs`, frontend `caCertificateRefs`, the backend
//! `clientCertificateRef`) or a BackendTLSPolicy on a Service their routes use does
//! (`caCertificateRefs`), marked with
//! [`DATA_OMITTED`]; and, before a compile, the payload of a referenced object whose store copy
//! lacks it, fetched once per resourceVersion. A cluster's unrelated certificates and
//! configuration cost the controller their metadata only.
//!
//! Credential Secrets (labelled `tollgate.dev/credential`) are watched whole: users opt them in.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;
use kube::{Client, Resource};
use tracing::debug;

use super::lenient::Lenient;
use crate::compile::{Inputs, Objects};

/// Longest wait for one referenced object's payload.
const FETCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Annotation on a store copy whose payload was dropped.
pub const DATA_OMITTED: &str = "tollgate.dev/data-omitted";

/// A referenced object: kind (`Secret` or `ConfigMap`), namespace, name.
pub type RefKey = (&'static str, String, String);

/// The objects Gateways reference now, shared by the watches and the reconciler.
#[derive(Debug, Clone, Default)]
pub struct Referenced(Arc<RwLock<BTreeSet<RefKey>>>);

impl Referenced {
    /// Whether `kind ns/name` is referenced.
    pub fn contains(&self, kind: &'static str, ns: &str, name: &str) -> bool {
        self.0
            .read()
            .map(|s| s.contains(&(kind, ns.to_owned(), name.to_owned())))
            .unwrap_or(true)
    }

    /// Replaces the set.
    pub fn replace(&self, set: BTreeSet<RefKey>) {
        if let Ok(mut s) = self.0.write() {
            *s = set;
        }
    }
}

/// Objects whose payload can be dropped.
pub trait Payload: Resource<DynamicType = ()> {
    /// `Secret` or `ConfigMap`.
    const KIND: &'static str;
    /// Drops the payload.
    fn drop_payload(&mut self);
}

impl Payload for Secret {
    const KIND: &'static str = "Secret";
    fn drop_payload(&mut self) {
        self.data = None;
        self.string_data = None;
    }
}

impl Payload for ConfigMap {
    const KIND: &'static str = "ConfigMap";
    fn drop_payload(&mut self) {
        self.data = None;
        self.binary_data = None;
    }
}

/// Drops the payload of `o` unless it is referenced (called on every watched object).
pub fn trim<K: Payload + Clone>(o: &mut Lenient<K>, refs: &Referenced) {
    let Lenient::Ok(k) = o else { return };
    let m = k.meta();
    let (ns, name) = (
        m.namespace.clone().unwrap_or_default(),
        m.name.clone().unwrap_or_default(),
    );
    if refs.contains(K::KIND, &ns, &name) {
        return;
    }
    // Unshared here: the watch trims an object before the store (and a snapshot) holds it.
    let k = Arc::make_mut(k);
    k.drop_payload();
    k.meta_mut()
        .annotations
        .get_or_insert_with(Default::default)
        .insert(DATA_OMITTED.to_owned(), "true".to_owned());
}

/// What the Gateways of our classes in `inputs` reference (classes already owned by
/// `compile::CONTROLLER_NAME`, see `reconcile::own_classes`).
pub fn references(inputs: &Inputs) -> BTreeSet<RefKey> {
    let ours: BTreeSet<&str> = inputs
        .gateway_classes
        .iter()
        .filter(|c| c.spec.controller_name == crate::compile::CONTROLLER_NAME)
        .filter_map(|c| c.metadata.name.as_deref())
        .collect();
    let mut out = BTreeSet::new();
    out.extend(backend_tls_cas(inputs, &ours));
    for gw in inputs
        .gateways
        .iter()
        .filter(|g| ours.contains(g.spec.gateway_class_name.as_str()))
    {
        let ns = gw.metadata.namespace.clone().unwrap_or_default();
        // The certificate the Gateway presents to TLS backends.
        if let Some(r) = gw
            .spec
            .tls
            .as_ref()
            .and_then(|t| t.backend.as_ref())
            .and_then(|b| b.client_certificate_ref.as_ref())
            && r.group.as_deref().unwrap_or("").is_empty()
            && r.kind.as_deref().unwrap_or("Secret") == "Secret"
        {
            let rns = r.namespace.clone().unwrap_or_else(|| ns.clone());
            out.insert(("Secret", rns, r.name.clone()));
        }
        for l in &gw.spec.listeners {
            for r in l
                .tls
                .iter()
                .flat_map(|t| t.certificate_refs.iter().flatten())
            {
                if r.group.as_deref().unwrap_or("").is_empty()
                    && r.kind.as_deref().unwrap_or("Secret") == "Secret"
                {
                    let rns = r.namespace.clone().unwrap_or_else(|| ns.clone());
                    out.insert(("Secret", rns, r.name.clone()));
                }
            }
        }
        let Some(fe) = gw.spec.tls.as_ref().and_then(|t| t.frontend.as_ref()) else {
            continue;
        };
        let default = fe.default.validation.iter().flat_map(|v| {
            v.ca_certificate_refs.iter().map(|r| {
                (
                    r.group.as_str(),
                    r.kind.as_str(),
                    r.name.as_str(),
                    r.namespace.as_deref(),
                )
            })
        });
        let per_port = fe
            .per_port
            .iter()
            .flatten()
            .flat_map(|p| p.tls.validation.iter())
            .flat_map(|v| {
                v.ca_certificate_refs.iter().map(|r| {
                    (
                        r.group.as_str(),
                        r.kind.as_str(),
                        r.name.as_str(),
                        r.namespace.as_deref(),
                    )
                })
            });
        for (group, kind, name, rns) in default.chain(per_port) {
            let kind = match kind {
                "ConfigMap" => "ConfigMap",
                "Secret" => "Secret",
                _ => continue,
            };
            if group.is_empty() {
                out.insert((kind, rns.unwrap_or(&ns).to_owned(), name.to_owned()));
            }
        }
    }
    out.extend(listener_set_certificates(inputs, &ours));
    out
}

/// The certificate Secrets of the listeners of ListenerSets that name a Gateway of ours
/// (refs without a namespace are in the ListenerSet's).
fn listener_set_certificates(inputs: &Inputs, ours: &BTreeSet<&str>) -> BTreeSet<RefKey> {
    let gateways: BTreeSet<(&str, &str)> = inputs
        .gateways
        .iter()
        .filter(|g| ours.contains(g.spec.gateway_class_name.as_str()))
        .map(|g| {
            (
                g.metadata.namespace.as_deref().unwrap_or_default(),
                g.metadata.name.as_deref().unwrap_or_default(),
            )
        })
        .collect();
    let mut out = BTreeSet::new();
    for set in &inputs.listener_sets {
        let ns = set.metadata.namespace.as_deref().unwrap_or_default();
        let p = &set.spec.parent_ref;
        if !gateways.contains(&(p.namespace.as_deref().unwrap_or(ns), p.name.as_str())) {
            continue;
        }
        let refs = set
            .spec
            .listeners
            .iter()
            .flat_map(|l| l.tls.iter())
            .flat_map(|t| t.certificate_refs.iter().flatten());
        for r in refs {
            if r.group.as_deref().unwrap_or("").is_empty()
                && r.kind.as_deref().unwrap_or("Secret") == "Secret"
            {
                let rns = r.namespace.as_deref().unwrap_or(ns);
                out.insert(("Secret", rns.to_owned(), r.name.clone()));
            }
        }
    }
    out
}

/// The CA ConfigMaps of the BackendTLSPolicies that target a Service a route of one of our
/// Gateways names. Only those: a policy of another implementation's Services is not ours to
/// read, and a failure to fetch its CA must not hold our compile back.
fn backend_tls_cas(inputs: &Inputs, ours: &BTreeSet<&str>) -> BTreeSet<RefKey> {
    let gateways: BTreeSet<(&str, &str)> = inputs
        .gateways
        .iter()
        .filter(|g| ours.contains(g.spec.gateway_class_name.as_str()))
        .map(|g| {
            (
                g.metadata.namespace.as_deref().unwrap_or_default(),
                g.metadata.name.as_deref().unwrap_or_default(),
            )
        })
        .collect();
    let mut services: BTreeSet<(String, String)> = BTreeSet::new();
    macro_rules! services_of {
        ($routes:expr) => {
            for r in $routes {
                let rns = r.metadata.namespace.as_deref().unwrap_or_default();
                let to_ours = r.spec.parent_refs.iter().flatten().any(|p| {
                    p.kind.as_deref().unwrap_or("Gateway") == "Gateway"
                        && gateways
                            .contains(&(p.namespace.as_deref().unwrap_or(rns), p.name.as_str()))
                });
                if !to_ours {
                    continue;
                }
                for b in r
                    .spec
                    .rules
                    .iter()
                    .flatten()
                    .flat_map(|rule| rule.backend_refs.iter().flatten())
                {
                    if b.group.as_deref().unwrap_or("").is_empty()
                        && b.kind.as_deref().unwrap_or("Service") == "Service"
                    {
                        let ns = b.namespace.as_deref().unwrap_or(rns).to_owned();
                        services.insert((ns, b.name.clone()));
                    }
                }
            }
        };
    }
    services_of!(&inputs.http_routes);
    services_of!(&inputs.grpc_routes);
    let mut out = BTreeSet::new();
    for p in &inputs.backend_tls_policies {
        let ns = p.metadata.namespace.clone().unwrap_or_default();
        let used = p.spec.target_refs.iter().any(|t| {
            t.group.is_empty()
                && t.kind == "Service"
                && services.contains(&(ns.clone(), t.name.clone()))
        });
        if !used {
            continue;
        }
        for r in p.spec.validation.ca_certificate_refs.iter().flatten() {
            if r.group.is_empty() && r.kind == "ConfigMap" {
                out.insert(("ConfigMap", ns.clone(), r.name.clone()));
            }
        }
    }
    out
}

/// Payloads fetched for referenced objects whose store copy lacks them, by resourceVersion.
#[derive(Debug, Default)]
pub struct Fetched {
    secrets: BTreeMap<(String, String), (String, Secret)>,
    config_maps: BTreeMap<(String, String), (String, ConfigMap)>,
}

fn omitted<K: Resource>(k: &K) -> bool {
    k.meta()
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(DATA_OMITTED))
}

/// A referenced object whose payload could not be read (the API server did not answer in
/// time, or answered with an error other than "not found"): compiling without it would read
/// as an invalid reference and drop the listeners that name it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} {namespace}/{name} could not be read: {reason}")]
pub struct Unreadable {
    /// Secret or ConfigMap.
    pub kind: &'static str,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Why.
    pub reason: String,
}

impl Fetched {
    /// Replaces, in `inputs`, every referenced object whose payload was dropped with a fetched
    /// copy (fetching it when its resourceVersion changed), and forgets unreferenced ones. An
    /// object gone in the meantime (404) stays without its payload (the watch brings its
    /// deletion); any other failure leaves that object without it, the others are still
    /// filled, and the first such failure is returned.
    pub async fn fill(
        &mut self,
        client: &Client,
        inputs: &mut Inputs,
        refs: &BTreeSet<RefKey>,
    ) -> Result<(), Unreadable> {
        let secrets = fill_kind(client, &mut inputs.secrets, &mut self.secrets, refs).await;
        let config_maps =
            fill_kind(client, &mut inputs.config_maps, &mut self.config_maps, refs).await;
        secrets.and(config_maps)
    }
}

async fn fill_kind<K>(
    client: &Client,
    objects: &mut Objects<K>,
    fetched: &mut BTreeMap<(String, String), (String, K)>,
    refs: &BTreeSet<RefKey>,
) -> Result<(), Unreadable>
where
    K: Payload<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    fetched.retain(|(ns, name), _| refs.contains(&(K::KIND, ns.clone(), name.clone())));
    let mut first_failure = Ok(());
    // Only the objects filled in are copied out of the share with the stores.
    for o in objects.shared_mut() {
        if !omitted(&**o) {
            continue;
        }
        let m = o.meta();
        let key = (
            m.namespace.clone().unwrap_or_default(),
            m.name.clone().unwrap_or_default(),
        );
        if !refs.contains(&(K::KIND, key.0.clone(), key.1.clone())) {
            continue;
        }
        let rv = m.resource_version.clone().unwrap_or_default();
        let o = Arc::make_mut(o);
        if let Some((have, obj)) = fetched.get(&key)
            && *have == rv
        {
            *o = obj.clone();
            continue;
        }
        let api: Api<K> = Api::namespaced(client.clone(), &key.0);
        // Bounded: a slow API server must not hold the whole reconcile (and readiness).
        let got = tokio::time::timeout(FETCH_TIMEOUT, api.get(&key.1)).await;
        let unreadable = |reason: String| Unreadable {
            kind: K::KIND,
            namespace: key.0.clone(),
            name: key.1.clone(),
            reason,
        };
        match got {
            Err(_) => {
                first_failure = first_failure.and(Err(unreadable(format!(
                    "no answer within {FETCH_TIMEOUT:?}"
                ))));
            }
            Ok(Err(kube::Error::Api(e))) if e.code == 404 => {
                // Deleted since the watch saw it: compiled without its payload, which is what
                // its deletion (on its way through the watch) will compile to as well.
                debug!(kind = K::KIND, namespace = %key.0, name = %key.1, "a referenced object is gone");
            }
            Ok(Err(e)) => first_failure = first_failure.and(Err(unreadable(e.to_string()))),
            Ok(Ok(mut full)) => {
                debug!(kind = K::KIND, namespace = %key.0, name = %key.1, "fetched a referenced object's payload");
                full.meta_mut().managed_fields = None;
                let rv = full.meta().resource_version.clone().unwrap_or_default();
                fetched.insert(key, (rv, full.clone()));
                *o = full;
            }
        }
    }
    first_failure
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn secret(name: &str) -> Lenient<Secret> {
        Lenient::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns"},
            "type": "kubernetes.io/tls",
            "data": {"tls.crt": "Q0VSVA==", "tls.key": "S0VZ"},
        }))
    }

    #[test]
    fn unreferenced_payloads_are_dropped_and_marked() {
        let refs = Referenced::default();
        refs.replace(BTreeSet::from([("Secret", "ns".into(), "used".into())]));
        let mut used = secret("used");
        trim(&mut used, &refs);
        assert!(used.as_ok().unwrap().data.is_some());
        let mut other = secret("other");
        trim(&mut other, &refs);
        let other = other.as_ok().unwrap();
        assert!(other.data.is_none());
        assert!(omitted(other));
    }

    #[test]
    fn backend_tls_cas_are_referenced_only_for_services_our_routes_use() {
        let yaml = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: ours}
spec: {controllerName: tollgate.dev/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: a}
spec:
  gatewayClassName: ours
  listeners: [{name: http, port: 80, protocol: HTTP}]
  tls: {backend: {clientCertificateRef: {name: client, namespace: certs}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: b}
spec:
  parentRefs: [{name: gw, namespace: a}]
  rules: [{backendRefs: [{name: used, port: 443}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: theirs, namespace: b}
spec:
  parentRefs: [{name: other-gw}]
  rules: [{backendRefs: [{name: unused, port: 443}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: BackendTLSPolicy
metadata: {name: p, namespace: b}
spec:
  targetRefs: [{group: "", kind: Service, name: used}]
  validation:
    caCertificateRefs: [{group: "", kind: ConfigMap, name: ca}]
    hostname: used.example
---
apiVersion: gateway.networking.k8s.io/v1
kind: BackendTLSPolicy
metadata: {name: q, namespace: b}
spec:
  targetRefs: [{group: "", kind: Service, name: unused}]
  validation:
    caCertificateRefs: [{group: "", kind: ConfigMap, name: other-ca}]
    hostname: unused.example
"#;
        let inputs = crate::compile::inputs_from_yaml(
            yaml,
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
        )
        .unwrap();
        let refs = references(&inputs);
        assert!(
            refs.contains(&("ConfigMap", "b".into(), "ca".into())),
            "{refs:?}"
        );
        assert!(
            refs.contains(&("Secret", "certs".into(), "client".into())),
            "{refs:?}"
        );
        assert!(
            !refs.contains(&("ConfigMap", "b".into(), "other-ca".into())),
            "{refs:?}"
        );
    }

    #[test]
    fn listener_set_certificates_are_referenced_for_our_gateways_only() {
        let yaml = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: ours}
spec: {controllerName: tollgate.dev/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: a}
spec:
  gatewayClassName: ours
  allowedListeners: {namespaces: {from: All}}
  listeners: [{name: http, port: 80, protocol: HTTP}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {name: team, namespace: t}
spec:
  parentRef: {name: gw, namespace: a}
  listeners:
  - name: https
    port: 443
    protocol: HTTPS
    tls: {certificateRefs: [{name: own}, {name: shared, namespace: certs}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {name: elsewhere, namespace: t}
spec:
  parentRef: {name: not-ours, namespace: a}
  listeners:
  - name: https
    port: 443
    protocol: HTTPS
    tls: {certificateRefs: [{name: theirs}]}
"#;
        let inputs = crate::compile::inputs_from_yaml(
            yaml,
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
        )
        .unwrap();
        let refs = references(&inputs);
        for want in [("t", "own"), ("certs", "shared")] {
            assert!(
                refs.contains(&("Secret", want.0.into(), want.1.into())),
                "{want:?} in {refs:?}"
            );
        }
        assert!(
            !refs.contains(&("Secret", "t".into(), "theirs".into())),
            "{refs:?}"
        );
    }
}
