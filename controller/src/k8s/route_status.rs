//! Route status, for every route kind: what the status writer ([`super::status`]) does with
//! HTTPRoutes, GRPCRoutes, TLSRoutes, TCPRoutes and UDPRoutes, written once.
//!
//! In: the compiler's [`Output`], the watched routes in the [`Stores`]. Out: the
//! [`StatusWrite`]s of routes whose `status.parents` entries of ours differ from the desired
//! ones (other controllers' entries kept as they are), the parent entries an Event compares, and
//! the server-side apply of one route's `status.parents`. [`RouteStatusKind`] is what differs
//! between the kinds: the generated types, the store, the output map, the write variant.

use std::fmt::Debug;

use gateway_types::experimental::httproutes::{HttpRoute, HttpRouteStatusParents};
use gateway_types::grpcroutes::{GrpcRoute, GrpcRouteStatusParents};
use gateway_types::tcproutes::{TcpRoute, TcpRouteStatusParents};
use gateway_types::tlsroutes::{TlsRoute, TlsRouteStatusParents};
use gateway_types::udproutes::{UdpRoute, UdpRouteStatusParents};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;
use tollgate_api::ObjectKey;

use super::lenient::Lenient;
use super::status::{API_VERSION, StatusWrite, keep_times, live, same};
use super::stores::Stores;
use crate::compile::Output;
use crate::compile::kinds::RouteParent;

/// A route kind as the status writer handles it: the live entries, the desired ones, the write.
pub trait RouteStatusKind:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + DeserializeOwned
    + Debug
    + 'static
{
    /// Its `status.parents[]` entry type.
    type Parent: RouteParent;
    /// The Kubernetes kind name.
    const KIND: &'static str;
    /// The watched objects of this kind.
    fn store(stores: &Stores) -> &Store<Lenient<Self>>;
    /// The live `status.parents`.
    fn live_parents(&self) -> &[Self::Parent];
    /// The compiler's entries for the route `key`, if it names one of our Gateways.
    fn desired<'o>(out: &'o Output, key: &ObjectKey) -> Option<&'o [Self::Parent]>;
    /// The write of `parents` over `resource_version`.
    fn write(key: ObjectKey, resource_version: String, parents: Vec<Self::Parent>) -> StatusWrite;
}

/// Implements [`RouteStatusKind`] (the generated types differ only in name).
macro_rules! route_status_kind {
    ($route:ty, $parent:ty, $kind:literal, $field:ident, $variant:ident) => {
        impl RouteStatusKind for $route {
            type Parent = $parent;
            const KIND: &'static str = $kind;
            fn store(stores: &Stores) -> &Store<Lenient<Self>> {
                &stores.$field
            }
            fn live_parents(&self) -> &[$parent] {
                self.status
                    .as_ref()
                    .map(|s| s.parents.as_slice())
                    .unwrap_or_default()
            }
            fn desired<'o>(out: &'o Output, key: &ObjectKey) -> Option<&'o [$parent]> {
                out.$field.get(key).map(|s| s.parents.as_slice())
            }
            fn write(
                key: ObjectKey,
                resource_version: String,
                parents: Vec<$parent>,
            ) -> StatusWrite {
                StatusWrite::$variant {
                    key,
                    resource_version,
                    parents,
                }
            }
        }
    };
}

route_status_kind!(
    HttpRoute,
    HttpRouteStatusParents,
    "HTTPRoute",
    http_routes,
    HttpRoute
);
route_status_kind!(
    GrpcRoute,
    GrpcRouteStatusParents,
    "GRPCRoute",
    grpc_routes,
    GrpcRoute
);
route_status_kind!(
    TlsRoute,
    TlsRouteStatusParents,
    "TLSRoute",
    tls_routes,
    TlsRoute
);
route_status_kind!(
    TcpRoute,
    TcpRouteStatusParents,
    "TCPRoute",
    tcp_routes,
    TcpRoute
);
route_status_kind!(
    UdpRoute,
    UdpRouteStatusParents,
    "UDPRoute",
    udp_routes,
    UdpRoute
);

/// The writes of every route of kind `K` whose entries of ours differ from the desired ones.
pub(super) fn plan_routes<K: RouteStatusKind>(
    out: &Output,
    stores: &Stores,
    controller_name: &str,
    writes: &mut Vec<StatusWrite>,
) {
    for obj in K::store(stores).state() {
        let Lenient::Ok(route) = obj.as_ref() else {
            continue;
        };
        let key = ObjectKey::new(
            route.namespace().unwrap_or_default(),
            route.name_any().as_str(),
        );
        let live_parents = route.live_parents();
        let ours = |p: &&K::Parent| p.controller_name() == controller_name;
        let live_ours: Vec<&K::Parent> = live_parents.iter().filter(ours).collect();
        let desired = K::desired(out, &key);
        if live_ours.is_empty() && desired.is_none_or(<[_]>::is_empty) {
            continue;
        }
        let mut parents: Vec<K::Parent> = desired.unwrap_or_default().to_vec();
        for p in &mut parents {
            let old = live_ours
                .iter()
                .find(|l| l.same_parent(p) || same(&l.parent_ref_json(), &p.parent_ref_json()));
            if let Some(old) = old {
                keep_times(p.conditions_mut(), old.conditions());
            }
        }
        // Typed equality first: it is what an unchanged route gives, and it costs no
        // serialization (10k routes are compared on every pass).
        let equal = parents.len() == live_ours.len()
            && parents.iter().zip(&live_ours).all(|(a, b)| a == *b);
        if equal || same(&parents, &live_ours) {
            continue;
        }
        let mut all: Vec<K::Parent> = live_parents
            .iter()
            .filter(|p| p.controller_name() != controller_name)
            .cloned()
            .collect();
        all.extend(parents);
        writes.push(K::write(
            key,
            route.resource_version().unwrap_or_default(),
            all,
        ));
    }
}

/// Feeds `diff` each parent entry of a route write with the live entry it replaces.
pub(super) fn route_rejections<K: RouteStatusKind>(
    stores: &Stores,
    key: &ObjectKey,
    parents: &[K::Parent],
    diff: &mut impl FnMut(Option<String>, &[Condition], &[Condition]),
) {
    let r = ObjectRef::new(&key.name).within(&key.namespace);
    let live = live(K::store(stores), r);
    let old = live.as_ref().map(K::live_parents).unwrap_or_default();
    for p in parents {
        let o = old.iter().find(|o| {
            o.controller_name() == p.controller_name()
                && same(&o.parent_ref_json(), &p.parent_ref_json())
        });
        let oc = o.map(|o| o.conditions()).unwrap_or_default();
        let part = format!("parent {}", p.parent().1);
        diff(Some(part), p.conditions(), oc);
    }
}

/// Applies a route's `status.parents` over `resource_version`.
pub(super) async fn apply_route<K: RouteStatusKind>(
    client: &Client,
    pp: &PatchParams,
    key: &ObjectKey,
    resource_version: &str,
    parents: &[K::Parent],
) -> Result<(), kube::Error> {
    let body = json!({
        "apiVersion": API_VERSION, "kind": K::KIND,
        "metadata": {"name": key.name, "namespace": key.namespace,
                     "resourceVersion": resource_version},
        "status": {"parents": parents},
    });
    Api::<K>::namespaced(client.clone(), &key.namespace)
        .patch_status(&key.name, pp, &Patch::Apply(body))
        .await?;
    Ok(())
}
