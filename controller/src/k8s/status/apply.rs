//! Sending status: a write as a server-side apply of the status subresource, and the
//! rejections a write newly carries (what deserves an Event).

use std::collections::BTreeSet;

use gateway_types::experimental::httproutes::HttpRoute;
use gateway_types::gatewayclasses::GatewayClass;
use gateway_types::gateways::Gateway;
use gateway_types::grpcroutes::GrpcRoute;
use gateway_types::listenersets::ListenerSet;
use gateway_types::tcproutes::TcpRoute;
use gateway_types::tlsroutes::TlsRoute;
use gateway_types::udproutes::UdpRoute;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Client};
use serde_json::json;

use super::{API_VERSION, NewRejection, StatusWrite, live, policy_statuses};
use crate::compile::conditions::{ACCEPTED, PROGRAMMED, RESOLVED_REFS};
use crate::crds::{AuthPolicy, BackendPolicy, CachePolicy, ClientPolicy, RateLimitPolicy};
use crate::k8s::route_status::{apply_route, route_rejections};
use crate::k8s::stores::Stores;
use gateway_types::gateways::GatewayStatus;
use gateway_types::listenersets::ListenerSetStatus;

/// An object's conditions and its listeners' (name, conditions).
type WithListeners<'a> = (Option<&'a [Condition]>, Vec<(String, Vec<Condition>)>);

/// Calls `diff` on an object's own conditions, then on each listener's against the live
/// listener of that name.
fn with_listeners(
    diff: &mut impl FnMut(Option<String>, &[Condition], &[Condition]),
    (conds, listeners): WithListeners<'_>,
    (old_conds, old_listeners): WithListeners<'_>,
) {
    diff(
        None,
        conds.unwrap_or_default(),
        old_conds.unwrap_or_default(),
    );
    for (name, c) in &listeners {
        let o = old_listeners.iter().find(|(n, _)| n == name);
        let oc = o.map(|(_, c)| c.as_slice()).unwrap_or_default();
        diff(Some(format!("listener {name}")), c, oc);
    }
}

/// Negative Accepted/ResolvedRefs/Programmed conditions in `write` that the live object does
/// not already carry with the same reason: what deserves an Event. `Pending` (waiting for
/// proxies) is not a rejection.
pub fn new_rejections(write: &StatusWrite, stores: &Stores) -> Vec<NewRejection> {
    let mut out = BTreeSet::new();
    let mut diff = |part: Option<String>, new: &[Condition], old: &[Condition]| {
        for c in new {
            let negative = c.status == "False"
                && [ACCEPTED, RESOLVED_REFS, PROGRAMMED].contains(&c.type_.as_str())
                && c.reason != "Pending";
            let known = old
                .iter()
                .any(|o| o.type_ == c.type_ && o.status == c.status && o.reason == c.reason);
            if negative && !known {
                out.insert(NewRejection {
                    part: part.clone(),
                    condition: c.type_.clone(),
                    reason: c.reason.clone(),
                    message: c.message.clone(),
                });
            }
        }
    };
    match write {
        StatusWrite::Release { .. } => {}
        StatusWrite::GatewayClass { name, status } => {
            let old = live(&stores.gateway_classes, ObjectRef::new(name))
                .and_then(|o| o.status)
                .unwrap_or_default();
            diff(
                None,
                status.conditions.as_deref().unwrap_or_default(),
                old.conditions.as_deref().unwrap_or_default(),
            );
        }
        StatusWrite::Gateway { key, status } => {
            let r = ObjectRef::new(&key.name).within(&key.namespace);
            let old = live(&stores.gateways, r)
                .and_then(|o| o.status)
                .unwrap_or_default();
            let listeners = |s: &GatewayStatus| -> Vec<(String, Vec<Condition>)> {
                s.listeners
                    .iter()
                    .flatten()
                    .map(|l| (l.name.clone(), l.conditions.clone()))
                    .collect()
            };
            let new = (status.conditions.as_deref(), listeners(status));
            with_listeners(&mut diff, new, (old.conditions.as_deref(), listeners(&old)));
        }
        StatusWrite::ListenerSet { key, status } => {
            let r = ObjectRef::new(&key.name).within(&key.namespace);
            let old = live(&stores.listener_sets, r)
                .and_then(|o| o.status)
                .unwrap_or_default();
            let listeners = |s: &ListenerSetStatus| -> Vec<(String, Vec<Condition>)> {
                s.listeners
                    .iter()
                    .flatten()
                    .map(|l| (l.name.clone(), l.conditions.clone()))
                    .collect()
            };
            let new = (status.conditions.as_deref(), listeners(status));
            with_listeners(&mut diff, new, (old.conditions.as_deref(), listeners(&old)));
        }
        StatusWrite::HttpRoute { key, parents, .. } => {
            route_rejections::<HttpRoute>(stores, key, parents, &mut diff);
        }
        StatusWrite::GrpcRoute { key, parents, .. } => {
            route_rejections::<GrpcRoute>(stores, key, parents, &mut diff);
        }
        StatusWrite::TlsRoute { key, parents, .. } => {
            route_rejections::<TlsRoute>(stores, key, parents, &mut diff);
        }
        StatusWrite::TcpRoute { key, parents, .. } => {
            route_rejections::<TcpRoute>(stores, key, parents, &mut diff);
        }
        StatusWrite::UdpRoute { key, parents, .. } => {
            route_rejections::<UdpRoute>(stores, key, parents, &mut diff);
        }
        StatusWrite::BackendTlsPolicy { key, ancestors, .. } => {
            crate::k8s::backend_tls_status::rejections(stores, key, ancestors, &mut diff);
        }
        StatusWrite::TrafficPolicy { key, ancestors, .. } => {
            crate::k8s::traffic_status::rejections(stores, key, ancestors, &mut diff);
        }
        StatusWrite::Policy { kind, key, status } => {
            let old = match *kind {
                "RateLimitPolicy" => policy_statuses(&stores.rate_limit_policies).remove(key),
                "ClientPolicy" => policy_statuses(&stores.client_policies).remove(key),
                "BackendPolicy" => policy_statuses(&stores.backend_policies).remove(key),
                "CachePolicy" => policy_statuses(&stores.cache_policies).remove(key),
                _ => policy_statuses(&stores.auth_policies).remove(key),
            }
            .unwrap_or_default();
            diff(None, &status.conditions, &old.conditions);
        }
    }
    out.into_iter().collect()
}

/// Sends one write: server-side apply of the status subresource, forced.
pub async fn apply(client: &Client, write: &StatusWrite, manager: &str) -> Result<(), kube::Error> {
    let pp = PatchParams::apply(manager).force();
    match write {
        StatusWrite::Release { kind, key } => {
            let mut meta = json!({"name": key.name});
            if !key.namespace.is_empty() {
                meta["namespace"] = json!(key.namespace);
            }
            let body = json!({
                "apiVersion": API_VERSION, "kind": kind, "metadata": meta, "status": {},
            });
            let patch = Patch::Apply(body);
            if *kind == "GatewayClass" {
                Api::<GatewayClass>::all(client.clone())
                    .patch_status(&key.name, &pp, &patch)
                    .await?;
            } else {
                Api::<Gateway>::namespaced(client.clone(), &key.namespace)
                    .patch_status(&key.name, &pp, &patch)
                    .await?;
            }
        }
        StatusWrite::GatewayClass { name, status } => {
            let body = json!({
                "apiVersion": API_VERSION, "kind": "GatewayClass",
                "metadata": {"name": name},
                "status": status,
            });
            Api::<GatewayClass>::all(client.clone())
                .patch_status(name, &pp, &Patch::Apply(body))
                .await?;
        }
        StatusWrite::Gateway { key, status } => {
            let body = json!({
                "apiVersion": API_VERSION, "kind": "Gateway",
                "metadata": {"name": key.name, "namespace": key.namespace},
                "status": status,
            });
            Api::<Gateway>::namespaced(client.clone(), &key.namespace)
                .patch_status(&key.name, &pp, &Patch::Apply(body))
                .await?;
        }
        StatusWrite::ListenerSet { key, status } => {
            let body = json!({
                "apiVersion": API_VERSION, "kind": "ListenerSet",
                "metadata": {"name": key.name, "namespace": key.namespace},
                "status": status,
            });
            Api::<ListenerSet>::namespaced(client.clone(), &key.namespace)
                .patch_status(&key.name, &pp, &Patch::Apply(body))
                .await?;
        }
        StatusWrite::HttpRoute {
            key,
            resource_version,
            parents,
        } => apply_route::<HttpRoute>(client, &pp, key, resource_version, parents).await?,
        StatusWrite::GrpcRoute {
            key,
            resource_version,
            parents,
        } => apply_route::<GrpcRoute>(client, &pp, key, resource_version, parents).await?,
        StatusWrite::TlsRoute {
            key,
            resource_version,
            parents,
        } => apply_route::<TlsRoute>(client, &pp, key, resource_version, parents).await?,
        StatusWrite::TcpRoute {
            key,
            resource_version,
            parents,
        } => apply_route::<TcpRoute>(client, &pp, key, resource_version, parents).await?,
        StatusWrite::UdpRoute {
            key,
            resource_version,
            parents,
        } => apply_route::<UdpRoute>(client, &pp, key, resource_version, parents).await?,
        StatusWrite::TrafficPolicy {
            key,
            resource_version,
            ancestors,
        } => {
            crate::k8s::traffic_status::apply(client, &pp, key, resource_version, ancestors)
                .await?;
        }
        StatusWrite::BackendTlsPolicy {
            key,
            resource_version,
            ancestors,
        } => {
            crate::k8s::backend_tls_status::apply(client, &pp, key, resource_version, ancestors)
                .await?;
        }
        StatusWrite::Policy { kind, key, status } => {
            let body = json!({
                "apiVersion": "tollgate.dev/v1alpha1", "kind": kind,
                "metadata": {"name": key.name, "namespace": key.namespace},
                "status": status,
            });
            let patch = Patch::Apply(body);
            if *kind == "RateLimitPolicy" {
                Api::<RateLimitPolicy>::namespaced(client.clone(), &key.namespace)
                    .patch_status(&key.name, &pp, &patch)
                    .await?;
            } else if *kind == "ClientPolicy" {
                Api::<ClientPolicy>::namespaced(client.clone(), &key.namespace)
                    .patch_status(&key.name, &pp, &patch)
                    .await?;
            } else if *kind == "CachePolicy" {
                Api::<CachePolicy>::namespaced(client.clone(), &key.namespace)
                    .patch_status(&key.name, &pp, &patch)
                    .await?;
            } else if *kind == "BackendPolicy" {
                Api::<BackendPolicy>::namespaced(client.clone(), &key.namespace)
                    .patch_status(&key.name, &pp, &patch)
                    .await?;
            } else {
                Api::<AuthPolicy>::namespaced(client.clone(), &key.namespace)
                    .patch_status(&key.name, &pp, &patch)
                    .await?;
            }
        }
    }
    Ok(())
}
