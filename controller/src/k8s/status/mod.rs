//! Status: from the compiler's desired statuses to the fewest possible API writes.
//!
//! In: the compiler's [`Output`] (already carrying our controller name and any push/provision
//! overlays) and the live objects in the [`Stores`]. Out: [`plan`] lists the [`StatusWrite`]s
//! whose desired status differs from the live one, after copying the live
//! `lastTransitionTime` into every condition whose status did not change (apimachinery's
//! `SetStatusCondition` rule), so a restart or a recompile with nothing new writes nothing.
//! [`apply`] sends one write as a server-side apply of the status subresource, field manager
//! [`FIELD_MANAGER`], forced.
//!
//! Route (HTTPRoute, GRPCRoute) `status.parents` is an atomic list in the Gateway API CRDs and
//! is shared with other controllers: we send the live entries of other controllers unchanged
//! followed by ours, with the live `resourceVersion` as a precondition, so a concurrent write by
//! another controller makes ours fail with 409 (retried from a fresher store) instead of
//! erasing theirs. Our entry for a Gateway the route no longer references is dropped. Both
//! route kinds go through the same code ([`super::route_status`]).

use std::collections::BTreeMap;
use std::fmt::Debug;

use gateway_types::experimental::httproutes::{HttpRoute, HttpRouteStatusParents};
use gateway_types::gatewayclasses::GatewayClassStatus;
use gateway_types::gateways::GatewayStatus;
use gateway_types::grpcroutes::{GrpcRoute, GrpcRouteStatusParents};
use gateway_types::listenersets::ListenerSetStatus;
use gateway_types::tcproutes::{TcpRoute, TcpRouteStatusParents};
use gateway_types::tlsroutes::{TlsRoute, TlsRouteStatusParents};
use gateway_types::udproutes::{UdpRoute, UdpRouteStatusParents};
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use tollgate_api::ObjectKey;

use super::lenient::Lenient;
pub use super::route_status::RouteStatusKind;
use super::route_status::plan_routes;
use super::stores::Stores;
use crate::compile::Output;
use crate::crds::{
    AuthPolicy, BackendPolicy, CachePolicy, ClientPolicy, PolicyStatus, RateLimitPolicy,
};

/// Field manager of status writes of the default controller; every controller writes status
/// as its own controller name (see [`apply`]), so two Tollgate controllers with different
/// names never take each other's fields.
pub const FIELD_MANAGER: &str = "tollgate.dev/gateway-controller";

/// `apiVersion` of the Gateway API objects we write.
pub(crate) const API_VERSION: &str = "gateway.networking.k8s.io/v1";

/// One status that must be written.
#[derive(Debug, Clone, PartialEq)]
pub enum StatusWrite {
    /// A GatewayClass status.
    GatewayClass {
        /// Name.
        name: String,
        /// The whole status (ours alone).
        status: GatewayClassStatus,
    },
    /// A Gateway status.
    Gateway {
        /// Namespace and name.
        key: ObjectKey,
        /// The whole status (ours alone).
        status: GatewayStatus,
    },
    /// A ListenerSet status (ours alone: its parent is our Gateway).
    ListenerSet {
        /// Namespace and name.
        key: ObjectKey,
        /// The whole status.
        status: ListenerSetStatus,
    },
    /// An HTTPRoute status.
    HttpRoute {
        /// Namespace and name.
        key: ObjectKey,
        /// The live resourceVersion the write is based on.
        resource_version: String,
        /// Every parent entry: other controllers' as they were, then ours.
        parents: Vec<HttpRouteStatusParents>,
    },
    /// A GRPCRoute status.
    GrpcRoute {
        /// Namespace and name.
        key: ObjectKey,
        /// The live resourceVersion the write is based on.
        resource_version: String,
        /// Every parent entry: other controllers' as they were, then ours.
        parents: Vec<GrpcRouteStatusParents>,
    },
    /// A TLSRoute status.
    TlsRoute {
        /// Namespace and name.
        key: ObjectKey,
        /// The live resourceVersion the write is based on.
        resource_version: String,
        /// Every parent entry: other controllers' as they were, then ours.
        parents: Vec<TlsRouteStatusParents>,
    },
    /// A TCPRoute status.
    TcpRoute {
        /// Namespace and name.
        key: ObjectKey,
        /// The live resourceVersion the write is based on.
        resource_version: String,
        /// Every parent entry: other controllers' as they were, then ours.
        parents: Vec<TcpRouteStatusParents>,
    },
    /// A UDPRoute status.
    UdpRoute {
        /// Namespace and name.
        key: ObjectKey,
        /// The live resourceVersion the write is based on.
        resource_version: String,
        /// Every parent entry: other controllers' as they were, then ours.
        parents: Vec<UdpRouteStatusParents>,
    },
    /// Our status on a Gateway or GatewayClass that is no longer ours: applying an empty
    /// status as our field manager removes every field we own.
    Release {
        /// `Gateway` or `GatewayClass`.
        kind: &'static str,
        /// Namespace (empty for a GatewayClass) and name.
        key: ObjectKey,
    },
    /// A BackendTLSPolicy status (module `backend_tls_status`).
    BackendTlsPolicy {
        /// Namespace and name.
        key: ObjectKey,
        /// The live resourceVersion the write is based on.
        resource_version: String,
        /// Every ancestor entry: other controllers' as they were, then ours.
        ancestors: Vec<gateway_types::backendtlspolicies::BackendTlsPolicyStatusAncestors>,
    },
    /// An XBackendTrafficPolicy status (module `traffic_status`).
    TrafficPolicy {
        /// Namespace and name.
        key: ObjectKey,
        /// The live resourceVersion the write is based on.
        resource_version: String,
        /// Every ancestor entry: other controllers' as they were (JSON), then ours.
        ancestors: Vec<serde_json::Value>,
    },
    /// A RateLimitPolicy, AuthPolicy, ClientPolicy or BackendPolicy status (ours alone: only
    /// Tollgate reads our CRDs).
    Policy {
        /// `RateLimitPolicy`, `AuthPolicy` or `ClientPolicy`.
        kind: &'static str,
        /// Namespace and name.
        key: ObjectKey,
        /// The whole status.
        status: PolicyStatus,
    },
}

/// A condition that says an object (or part of it) is rejected, new in a write.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct NewRejection {
    /// Listener or parent it is about, if any.
    pub part: Option<String>,
    /// Condition type.
    pub condition: String,
    /// Reason.
    pub reason: String,
    /// Message.
    pub message: String,
}

impl StatusWrite {
    /// `GatewayClass`, `Gateway`, a route kind or a policy kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::GatewayClass { .. } => "GatewayClass",
            Self::Gateway { .. } => "Gateway",
            Self::ListenerSet { .. } => "ListenerSet",
            Self::HttpRoute { .. } => HttpRoute::KIND,
            Self::GrpcRoute { .. } => GrpcRoute::KIND,
            Self::TlsRoute { .. } => TlsRoute::KIND,
            Self::TcpRoute { .. } => TcpRoute::KIND,
            Self::UdpRoute { .. } => UdpRoute::KIND,
            Self::BackendTlsPolicy { .. } => super::backend_tls_status::KIND,
            Self::TrafficPolicy { .. } => super::traffic_status::KIND,
            Self::Policy { kind, .. } | Self::Release { kind, .. } => kind,
        }
    }

    /// Namespace (empty for GatewayClass) and name.
    pub fn key(&self) -> ObjectKey {
        match self {
            Self::GatewayClass { name, .. } => ObjectKey::new("", name.as_str()),
            Self::Gateway { key, .. }
            | Self::ListenerSet { key, .. }
            | Self::HttpRoute { key, .. }
            | Self::GrpcRoute { key, .. }
            | Self::TlsRoute { key, .. }
            | Self::TcpRoute { key, .. }
            | Self::UdpRoute { key, .. }
            | Self::BackendTlsPolicy { key, .. }
            | Self::TrafficPolicy { key, .. }
            | Self::Policy { key, .. }
            | Self::Release { key, .. } => key.clone(),
        }
    }
}

/// Every status write needed to bring the live objects to `out`. Pure.
pub fn plan(out: &Output, stores: &Stores, controller_name: &str) -> Vec<StatusWrite> {
    let mut writes = Vec::new();
    for (name, desired) in &out.gateway_classes {
        let Some(live) = live(&stores.gateway_classes, ObjectRef::new(name)) else {
            continue;
        };
        let mut status = desired.clone();
        let old = live.status.clone().unwrap_or_default();
        keep_times(
            status.conditions.as_deref_mut().unwrap_or_default(),
            old.conditions.as_deref().unwrap_or_default(),
        );
        if status != old && !same(&status, &old) {
            writes.push(StatusWrite::GatewayClass {
                name: name.clone(),
                status,
            });
        }
    }
    for (key, desired) in &out.gateways {
        let r = ObjectRef::new(&key.name).within(&key.namespace);
        let Some(live) = live(&stores.gateways, r) else {
            continue;
        };
        let old = live.status.clone().unwrap_or_default();
        let status = gateway_status(desired, &old);
        if status != old && !same(&status, &old) {
            writes.push(StatusWrite::Gateway {
                key: key.clone(),
                status,
            });
        }
    }
    for (key, desired) in &out.listener_sets {
        let r = ObjectRef::new(&key.name).within(&key.namespace);
        let Some(live) = live(&stores.listener_sets, r) else {
            continue;
        };
        let old = live.status.clone().unwrap_or_default();
        let status = listener_set_status(desired, &old);
        if status != old && !same(&status, &old) {
            writes.push(StatusWrite::ListenerSet {
                key: key.clone(),
                status,
            });
        }
    }
    plan_routes::<HttpRoute>(out, stores, controller_name, &mut writes);
    plan_routes::<GrpcRoute>(out, stores, controller_name, &mut writes);
    plan_routes::<TlsRoute>(out, stores, controller_name, &mut writes);
    plan_routes::<TcpRoute>(out, stores, controller_name, &mut writes);
    plan_routes::<UdpRoute>(out, stores, controller_name, &mut writes);
    super::backend_tls_status::plan(out, stores, controller_name, &mut writes);
    super::traffic_status::plan(out, stores, controller_name, &mut writes);
    for (kind, desired_all, store) in [
        (
            "RateLimitPolicy",
            &out.rate_limit_policies,
            policy_statuses(&stores.rate_limit_policies),
        ),
        (
            "AuthPolicy",
            &out.auth_policies,
            policy_statuses(&stores.auth_policies),
        ),
        (
            "ClientPolicy",
            &out.client_policies,
            policy_statuses(&stores.client_policies),
        ),
        (
            "BackendPolicy",
            &out.backend_policies,
            policy_statuses(&stores.backend_policies),
        ),
        (
            "CachePolicy",
            &out.cache_policies,
            policy_statuses(&stores.cache_policies),
        ),
    ] {
        for (key, desired) in desired_all {
            let Some(old) = store.get(key) else {
                continue;
            };
            // Every target missing is ambiguous with several controllers in a cluster (each
            // may simply not have seen the target yet): never overwrite another controller's
            // verdict with TargetNotFound.
            if target_not_found(desired)
                && status_managers(&store_meta(stores, kind, key))
                    .iter()
                    .any(|m| m != controller_name)
            {
                continue;
            }
            let status = policy_status(desired, old);
            if status != *old && !same(&status, old) {
                writes.push(StatusWrite::Policy {
                    kind,
                    key: key.clone(),
                    status,
                });
            }
        }
    }
    release_stale(out, stores, controller_name, &mut writes);
    writes
}

/// The live object of `r`, if it deserialized.
pub(crate) fn live<K: Resource<DynamicType = ()> + Clone>(
    store: &Store<Lenient<K>>,
    r: ObjectRef<Lenient<K>>,
) -> Option<K> {
    store.get(&r).and_then(|o| o.as_ok().cloned())
}

/// Releases our status on Gateways and GatewayClasses that are no longer ours (class changed
/// to another controller's, or its controllerName changed): those whose status subresource
/// still lists `manager` among its field managers but that the compiler gave no status.
fn release_stale(out: &Output, stores: &Stores, manager: &str, writes: &mut Vec<StatusWrite>) {
    // The API server keeps a manager's entry after it released everything (`f:status: {}`):
    // only a non-empty field set under status counts.
    let owns = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        m.managed_fields.iter().flatten().any(|e| {
            e.manager.as_deref() == Some(manager)
                && e.subresource.as_deref() == Some("status")
                && e.fields_v1.as_ref().is_some_and(|f| {
                    f.0.get("f:status")
                        .and_then(serde_json::Value::as_object)
                        .is_some_and(|o| !o.is_empty())
                })
        })
    };
    for o in stores.gateway_classes.state() {
        let Lenient::Ok(c) = o.as_ref() else { continue };
        let name = c.metadata.name.clone().unwrap_or_default();
        if !out.gateway_classes.contains_key(&name) && owns(&c.metadata) {
            writes.push(StatusWrite::Release {
                kind: "GatewayClass",
                key: ObjectKey::new("", name),
            });
        }
    }
    for o in stores.gateways.state() {
        let Lenient::Ok(g) = o.as_ref() else { continue };
        let key = ObjectKey::new(
            g.metadata.namespace.as_deref().unwrap_or_default(),
            g.metadata.name.as_deref().unwrap_or_default(),
        );
        if !out.gateways.contains_key(&key) && owns(&g.metadata) {
            writes.push(StatusWrite::Release {
                kind: "Gateway",
                key,
            });
        }
    }
}

/// Live statuses of one policy kind by key (an object without status maps to the default).
fn policy_statuses<K>(store: &Store<Lenient<K>>) -> BTreeMap<ObjectKey, PolicyStatus>
where
    K: Resource<DynamicType = ()> + Clone + HasPolicyStatus,
{
    store
        .state()
        .iter()
        .filter_map(|o| o.as_ok())
        .map(|o| {
            let m = o.meta();
            (
                ObjectKey::new(
                    m.namespace.as_deref().unwrap_or_default(),
                    m.name.as_deref().unwrap_or_default(),
                ),
                o.policy_status().cloned().unwrap_or_default(),
            )
        })
        .collect()
}

/// True when the policy is rejected only because no target was found.
fn target_not_found(s: &PolicyStatus) -> bool {
    s.conditions.iter().any(|c| {
        c.type_ == crate::compile::conditions::ACCEPTED
            && c.status == "False"
            && c.reason == crate::compile::policies::reason::TARGET_NOT_FOUND
    })
}

/// Metadata of a live policy.
fn store_meta(
    stores: &Stores,
    kind: &str,
    key: &ObjectKey,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
    let (name, ns) = (key.name.as_str(), key.namespace.as_str());
    let meta = match kind {
        "RateLimitPolicy" => stores
            .rate_limit_policies
            .get(&ObjectRef::new(name).within(ns))
            .map(|o| o.meta().clone()),
        "ClientPolicy" => stores
            .client_policies
            .get(&ObjectRef::new(name).within(ns))
            .map(|o| o.meta().clone()),
        "BackendPolicy" => stores
            .backend_policies
            .get(&ObjectRef::new(name).within(ns))
            .map(|o| o.meta().clone()),
        "CachePolicy" => stores
            .cache_policies
            .get(&ObjectRef::new(name).within(ns))
            .map(|o| o.meta().clone()),
        _ => stores
            .auth_policies
            .get(&ObjectRef::new(name).within(ns))
            .map(|o| o.meta().clone()),
    };
    meta.unwrap_or_default()
}

/// Field managers that own something under `status` (the watches keep only those entries).
pub fn status_managers(
    m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Vec<String> {
    m.managed_fields
        .iter()
        .flatten()
        .filter(|e| e.subresource.as_deref() == Some("status"))
        .filter(|e| {
            e.fields_v1.as_ref().is_some_and(|f| {
                f.0.get("f:status")
                    .and_then(serde_json::Value::as_object)
                    .is_some_and(|o| o.keys().any(|k| k != "f:observedGeneration"))
            })
        })
        .filter_map(|e| e.manager.clone())
        .collect()
}

/// Our policy kinds' status accessor.
pub trait HasPolicyStatus {
    /// The status, when set.
    fn policy_status(&self) -> Option<&PolicyStatus>;
}

impl HasPolicyStatus for RateLimitPolicy {
    fn policy_status(&self) -> Option<&PolicyStatus> {
        self.status.as_ref()
    }
}

impl HasPolicyStatus for BackendPolicy {
    fn policy_status(&self) -> Option<&PolicyStatus> {
        self.status.as_ref()
    }
}

impl HasPolicyStatus for CachePolicy {
    fn policy_status(&self) -> Option<&PolicyStatus> {
        self.status.as_ref()
    }
}

impl HasPolicyStatus for ClientPolicy {
    fn policy_status(&self) -> Option<&PolicyStatus> {
        self.status.as_ref()
    }
}

impl HasPolicyStatus for AuthPolicy {
    fn policy_status(&self) -> Option<&PolicyStatus> {
        self.status.as_ref()
    }
}

mod apply;
mod merge;

pub use apply::{apply, new_rejections};
use merge::{gateway_status, listener_set_status, policy_status};
pub use merge::{keep_times, same};
