//! Watches and stores: the cluster objects the compiler reads, kept in memory.
//!
//! In: one kube-runtime watcher per kind (default backoff, so API errors retry), each item
//! deserialized on its own through [`Lenient`]. Out: kube-runtime reflector [`Store`]s that
//! [`Stores::inputs`] snapshots into the compiler's [`Inputs`], and a [`Change`] on a channel
//! for every event after a kind's first full list, saying what a recompile must redo.
//!
//! Memory: `managedFields` and the client-side-apply annotation are dropped from every object.
//! Secrets and ConfigMaps: TLS Secrets (field selector `type=kubernetes.io/tls`) and
//! ConfigMaps are stored without their payload unless a Gateway references them
//! ([`super::referenced`]): the reconciler fetches a newly referenced object's payload before
//! compiling, so memory is bounded by what Gateways use, not by what the cluster holds; and a
//! change to an unreferenced one triggers nothing. Secrets labelled `tollgate.dev/credential`
//! (API keys and introspection clients that policies read) are watched whole: users opt them
//! in. Unlabelled Opaque, token and docker-config Secrets never reach the controller.
//!
//! Some kinds are optional, so that a cluster without their CRDs still gets everything else:
//! TLSRoute (in the Gateway API standard channel from v1.5; a cluster with older CRDs, or a
//! controller whose ClusterRole predates TLSRoutes, must keep serving HTTP), BackendTLSPolicy
//! (as the policies below: counted as none only when its CRD is absent, since leaving a
//! policy out would send plaintext where TLS is asked for) and Tollgate's
//! RateLimitPolicy and AuthPolicy (`helm upgrade` does not install a chart's new CRDs, nor does
//! `helm install --skip-crds`). When such a kind cannot be listed, [`super::optional`] decides:
//! a kind whose CRD is confirmed absent counts as listed and empty (a warning says so); a 404
//! while the CRD is installed (an API server still starting) leaves the store unlisted, which
//! holds the controller back rather than compiling without the kind's objects; a 403 counts as
//! none for TLSRoute and holds the controller back for the policies (left out, an AuthPolicy's
//! routes would be served unauthenticated). The API is asked again every [`OPTIONAL_RETRY`]
//! ([`WAIT_RETRY`] while in doubt); once the kind can be listed the watch starts, without a
//! restart.
//!
//! A malformed object (valid for the API server, not for our types) is stored as
//! [`Lenient::Malformed`]: logged, counted in `tollgate_controller_malformed_objects`, left out
//! of the compile like a deleted object, and the rest of its watch keeps flowing.

use std::fmt::Debug;
use std::sync::Arc;

use futures_util::StreamExt;
use gateway_types::backendtlspolicies::BackendTlsPolicy;
use gateway_types::experimental::httproutes::HttpRoute;
use gateway_types::gatewayclasses::GatewayClass;
use gateway_types::gateways::Gateway;
use gateway_types::grpcroutes::GrpcRoute;
use gateway_types::listenersets::ListenerSet;
use gateway_types::referencegrants::ReferenceGrant;
use gateway_types::tcproutes::TcpRoute;
use gateway_types::tlsroutes::TlsRoute;
use gateway_types::udproutes::UdpRoute;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch_stream};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use super::lenient::Lenient;
use super::metrics::{Metrics, kind as kind_label};
pub use super::optional::Optional;
use super::optional::{Verdict, probe, verdict};
use super::referenced::{DATA_OMITTED, Referenced, trim};
use crate::compile::policies::auth::CREDENTIAL_LABEL;
use crate::compile::{Inputs, Objects};
use crate::crds::{
    AuthPolicy, BackendPolicy, CachePolicy, ClientPolicy, GatewayParameters, RateLimitPolicy,
};
use gateway_types::experimental::xbackendtrafficpolicies::XBackendTrafficPolicy;

/// The kinds the controller watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// gateway.networking.k8s.io GatewayClass.
    GatewayClass,
    /// gateway.networking.k8s.io Gateway.
    Gateway,
    /// gateway.networking.k8s.io HTTPRoute.
    HttpRoute,
    /// gateway.networking.k8s.io GRPCRoute.
    GrpcRoute,
    /// gateway.networking.k8s.io TLSRoute (optional: see the module docs).
    TlsRoute,
    /// gateway.networking.k8s.io TCPRoute (optional, as TLSRoute).
    TcpRoute,
    /// gateway.networking.k8s.io UDPRoute (optional, as TLSRoute).
    UdpRoute,
    /// gateway.networking.k8s.io ListenerSet (optional, as TLSRoute: v1.4 and older have none).
    ListenerSet,
    /// gateway.networking.k8s.io ReferenceGrant.
    ReferenceGrant,
    /// core Service.
    Service,
    /// discovery EndpointSlice.
    EndpointSlice,
    /// core Secret (TLS only).
    Secret,
    /// core Namespace.
    Namespace,
    /// tollgate.dev RateLimitPolicy.
    RateLimitPolicy,
    /// tollgate.dev AuthPolicy.
    AuthPolicy,
    /// tollgate.dev ClientPolicy.
    ClientPolicy,
    /// tollgate.dev BackendPolicy.
    BackendPolicy,
    /// tollgate.dev CachePolicy.
    CachePolicy,
    /// gateway.networking.x-k8s.io XBackendTrafficPolicy.
    BackendTrafficPolicy,
    /// core Secret labelled `tollgate.dev/credential` (API keys, introspection clients).
    CredentialSecret,
    /// core ConfigMap (payload only while a Gateway references it).
    ConfigMap,
    /// gateway.networking.k8s.io BackendTLSPolicy (optional, as TLSRoute).
    BackendTlsPolicy,
    /// tollgate.dev GatewayParameters.
    GatewayParameters,
}

impl Kind {
    /// Every kind, in declaration order (index = discriminant, for [`Kinds`]).
    pub const ALL: [Kind; 23] = [
        Self::GatewayClass,
        Self::Gateway,
        Self::HttpRoute,
        Self::GrpcRoute,
        Self::TlsRoute,
        Self::TcpRoute,
        Self::UdpRoute,
        Self::ListenerSet,
        Self::ReferenceGrant,
        Self::Service,
        Self::EndpointSlice,
        Self::Secret,
        Self::Namespace,
        Self::RateLimitPolicy,
        Self::AuthPolicy,
        Self::ClientPolicy,
        Self::BackendPolicy,
        Self::CachePolicy,
        Self::BackendTrafficPolicy,
        Self::CredentialSecret,
        Self::ConfigMap,
        Self::BackendTlsPolicy,
        Self::GatewayParameters,
    ];

    /// The Kubernetes kind name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::GatewayClass => "GatewayClass",
            Self::Gateway => "Gateway",
            Self::HttpRoute => "HTTPRoute",
            Self::GrpcRoute => "GRPCRoute",
            Self::TlsRoute => "TLSRoute",
            Self::TcpRoute => "TCPRoute",
            Self::UdpRoute => "UDPRoute",
            Self::ListenerSet => "ListenerSet",
            Self::ReferenceGrant => "ReferenceGrant",
            Self::Service => "Service",
            Self::EndpointSlice => "EndpointSlice",
            Self::Secret => "Secret",
            Self::Namespace => "Namespace",
            Self::RateLimitPolicy => "RateLimitPolicy",
            Self::AuthPolicy => "AuthPolicy",
            Self::ClientPolicy => "ClientPolicy",
            Self::BackendPolicy => "BackendPolicy",
            Self::CachePolicy => "CachePolicy",
            Self::BackendTrafficPolicy => "XBackendTrafficPolicy",
            Self::CredentialSecret => "CredentialSecret",
            Self::ConfigMap => "ConfigMap",
            Self::BackendTlsPolicy => "BackendTLSPolicy",
            Self::GatewayParameters => "GatewayParameters",
        }
    }
}

/// A set of kinds (the kinds of the changes a reconcile covers), without allocating.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Kinds(u32);

impl Kinds {
    /// Adds `kind`.
    pub fn insert(&mut self, kind: Kind) {
        self.0 |= 1 << (kind as u32);
    }

    /// The kinds' names, comma-separated, in declaration order.
    pub fn names(self) -> String {
        let mut out = String::new();
        for k in Kind::ALL
            .iter()
            .filter(|k| self.0 & (1 << (**k as u32)) != 0)
        {
            if !out.is_empty() {
                out.push(',');
            }
            out.push_str(k.as_str());
        }
        out
    }
}

/// What a change requires of the next reconcile, cheapest last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Relevance {
    /// Only the `status` of an object changed (often our own write): compare statuses again,
    /// no compile needed (the compiler does not read status).
    Status,
    /// Only EndpointSlices changed: compile and publish tables; statuses cannot change
    /// (no condition depends on endpoints, only on Services).
    Endpoints,
    /// Anything else: compile, publish, statuses, provisioning.
    Full,
}

impl Relevance {
    /// What one reconcile must do to serve both needs: the larger of the two, except that a
    /// status pass and an endpoints pass, neither of which does the other's work, take a full
    /// one.
    pub fn join(self, other: Relevance) -> Relevance {
        match (self, other) {
            (Relevance::Status, Relevance::Endpoints)
            | (Relevance::Endpoints, Relevance::Status) => Relevance::Full,
            (a, b) => a.max(b),
        }
    }

    /// Whether a reconcile of this relevance does everything `need` asks.
    pub fn covers(self, need: Relevance) -> bool {
        self.join(need) == self
    }
}

/// One store change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change {
    /// Kind of the object.
    pub kind: Kind,
    /// What it requires.
    pub relevance: Relevance,
}

/// The reflector stores of every watched kind. Cheap to clone.
#[derive(Clone)]
pub struct Stores {
    /// GatewayClasses.
    pub gateway_classes: Store<Lenient<GatewayClass>>,
    /// Gateways.
    pub gateways: Store<Lenient<Gateway>>,
    /// HTTPRoutes.
    pub http_routes: Store<Lenient<HttpRoute>>,
    /// GRPCRoutes.
    pub grpc_routes: Store<Lenient<GrpcRoute>>,
    /// TLSRoutes (empty while the CRD is not installed).
    pub tls_routes: Store<Lenient<TlsRoute>>,
    /// TCPRoutes (empty while the CRD, at v1, is not installed).
    pub tcp_routes: Store<Lenient<TcpRoute>>,
    /// UDPRoutes (empty while the CRD, at v1, is not installed).
    pub udp_routes: Store<Lenient<UdpRoute>>,
    /// ListenerSets (empty while the CRD, at v1, is not installed).
    pub listener_sets: Store<Lenient<ListenerSet>>,
    /// ReferenceGrants.
    pub reference_grants: Store<Lenient<ReferenceGrant>>,
    /// Services.
    pub services: Store<Lenient<Service>>,
    /// EndpointSlices.
    pub endpoint_slices: Store<Lenient<EndpointSlice>>,
    /// TLS Secrets.
    pub secrets: Store<Lenient<Secret>>,
    /// Namespaces.
    pub namespaces: Store<Lenient<Namespace>>,
    /// RateLimitPolicies.
    pub rate_limit_policies: Store<Lenient<RateLimitPolicy>>,
    /// AuthPolicies.
    pub auth_policies: Store<Lenient<AuthPolicy>>,
    /// ClientPolicies.
    pub client_policies: Store<Lenient<ClientPolicy>>,
    /// BackendPolicies.
    pub backend_policies: Store<Lenient<BackendPolicy>>,
    /// CachePolicies.
    pub cache_policies: Store<Lenient<CachePolicy>>,
    /// XBackendTrafficPolicies.
    pub backend_traffic_policies: Store<Lenient<XBackendTrafficPolicy>>,
    /// Secrets labelled [`CREDENTIAL_LABEL`].
    pub credential_secrets: Store<Lenient<Secret>>,
    /// ConfigMaps (payload only while referenced).
    pub config_maps: Store<Lenient<ConfigMap>>,
    /// What Gateways reference now: the Secrets and ConfigMaps kept whole.
    pub referenced: Referenced,
    /// BackendTLSPolicies (empty while the CRD is not installed).
    pub backend_tls_policies: Store<Lenient<BackendTlsPolicy>>,
    /// GatewayParameters (empty while the CRD is not installed).
    pub gateway_parameters: Store<Lenient<GatewayParameters>>,
}

impl Stores {
    /// Starts one watch per kind; changes after each kind's first list go to `tx`.
    pub fn spawn(
        client: &Client,
        tx: &UnboundedSender<Change>,
        metrics: &Arc<Metrics>,
    ) -> (Self, Vec<JoinHandle<()>>) {
        let mut tasks = Vec::new();
        let cfg = watcher::Config::default;
        let w = |k| Watch {
            kind: k,
            tx: tx.clone(),
            metrics: metrics.clone(),
        };
        let (gateway_classes, t) = w(Kind::GatewayClass).spawn(Api::all(client.clone()), cfg());
        tasks.push(t);
        let (gateways, t) = w(Kind::Gateway).spawn(Api::all(client.clone()), cfg());
        tasks.push(t);
        let (http_routes, t) = w(Kind::HttpRoute).spawn(Api::all(client.clone()), cfg());
        tasks.push(t);
        let (grpc_routes, t) = w(Kind::GrpcRoute).spawn(Api::all(client.clone()), cfg());
        tasks.push(t);
        let (tls_routes, t) = w(Kind::TlsRoute).spawn_optional(
            Api::all(client.clone()),
            cfg(),
            Optional::Forgiving,
            OPTIONAL_RETRY,
        );
        tasks.push(t);
        let (tcp_routes, t) = w(Kind::TcpRoute).spawn_optional(
            Api::all(client.clone()),
            cfg(),
            Optional::Forgiving,
            OPTIONAL_RETRY,
        );
        tasks.push(t);
        let (udp_routes, t) = w(Kind::UdpRoute).spawn_optional(
            Api::all(client.clone()),
            cfg(),
            Optional::Forgiving,
            OPTIONAL_RETRY,
        );
        tasks.push(t);
        let (listener_sets, t) = w(Kind::ListenerSet).spawn_optional(
            Api::all(client.clone()),
            cfg(),
            Optional::Forgiving,
            OPTIONAL_RETRY,
        );
        tasks.push(t);
        // Fail closed: left out, a Service that asks for TLS would get plaintext.
        let (backend_tls_policies, t) = w(Kind::BackendTlsPolicy).spawn_optional(
            Api::all(client.clone()),
            cfg(),
            Optional::FailClosed,
            OPTIONAL_RETRY,
        );
        tasks.push(t);
        let (reference_grants, t) = w(Kind::ReferenceGrant).spawn(Api::all(client.clone()), cfg());
        tasks.push(t);
        let (services, t) = w(Kind::Service).spawn(Api::all(client.clone()), cfg());
        tasks.push(t);
        let (endpoint_slices, t) = w(Kind::EndpointSlice).spawn(Api::all(client.clone()), cfg());
        tasks.push(t);
        let referenced = Referenced::default();
        let refs = referenced.clone();
        let (secrets, t) = w(Kind::Secret).spawn_trimmed(
            Api::all(client.clone()),
            cfg().fields("type=kubernetes.io/tls"),
            Some(Arc::new(move |o: &mut Lenient<Secret>| trim(o, &refs))),
        );
        tasks.push(t);
        let refs = referenced.clone();
        let (config_maps, t) = w(Kind::ConfigMap).spawn_trimmed(
            Api::all(client.clone()),
            cfg(),
            Some(Arc::new(move |o: &mut Lenient<ConfigMap>| trim(o, &refs))),
        );
        tasks.push(t);
        let (namespaces, t) = w(Kind::Namespace).spawn(Api::all(client.clone()), cfg());
        tasks.push(t);
        let (rate_limit_policies, t) = w(Kind::RateLimitPolicy).spawn_optional(
            Api::all(client.clone()),
            cfg(),
            Optional::FailClosed,
            OPTIONAL_RETRY,
        );
        tasks.push(t);
        let (auth_policies, t) = w(Kind::AuthPolicy).spawn_optional(
            Api::all(client.clone()),
            cfg(),
            Optional::FailClosed,
            OPTIONAL_RETRY,
        );
        tasks.push(t);
        let (client_policies, t) = w(Kind::ClientPolicy).spawn_optional(
            Api::all(client.clone()),
            cfg(),
            Optional::FailClosed,
            OPTIONAL_RETRY,
        );
        tasks.push(t);
        // Leaving CachePolicies out weakens no access rule either: answers go uncached.
        let (cache_policies, t) = w(Kind::CachePolicy).spawn_optional(
            Api::all(client.clone()),
            cfg(),
            Optional::Forgiving,
            OPTIONAL_RETRY,
        );
        tasks.push(t);
        // Leaving BackendPolicies out weakens no access rule: a cluster without the CRD
        // (or RBAC for it) is served as before the kind existed.
        let (backend_policies, t) = w(Kind::BackendPolicy).spawn_optional(
            Api::all(client.clone()),
            cfg(),
            Optional::Forgiving,
            OPTIONAL_RETRY,
        );
        tasks.push(t);
        // The experimental channel's kind; a cluster on the standard channel has none.
        let (backend_traffic_policies, t) = w(Kind::BackendTrafficPolicy).spawn_optional(
            Api::all(client.clone()),
            cfg(),
            Optional::Forgiving,
            OPTIONAL_RETRY,
        );
        tasks.push(t);
        // Without the CRD no parameters resolve: Gateways naming some are InvalidParameters
        // and their proxies left as they are, which grants nothing.
        let (gateway_parameters, t) = w(Kind::GatewayParameters).spawn_optional(
            Api::all(client.clone()),
            cfg(),
            Optional::Forgiving,
            OPTIONAL_RETRY,
        );
        tasks.push(t);
        let (credential_secrets, t) = w(Kind::CredentialSecret)
            .spawn(Api::all(client.clone()), cfg().labels(CREDENTIAL_LABEL));
        tasks.push(t);
        let stores = Self {
            gateway_classes,
            gateways,
            http_routes,
            grpc_routes,
            tls_routes,
            tcp_routes,
            udp_routes,
            listener_sets,
            reference_grants,
            services,
            endpoint_slices,
            secrets,
            namespaces,
            rate_limit_policies,
            auth_policies,
            client_policies,
            backend_policies,
            cache_policies,
            backend_traffic_policies,
            credential_secrets,
            config_maps,
            referenced,
            backend_tls_policies,
            gateway_parameters,
        };
        (stores, tasks)
    }

    /// Waits until every kind has been listed once.
    pub async fn wait_until_ready(&self) -> Result<(), reflector::store::WriterDropped> {
        self.gateway_classes.wait_until_ready().await?;
        self.gateways.wait_until_ready().await?;
        self.http_routes.wait_until_ready().await?;
        self.grpc_routes.wait_until_ready().await?;
        self.tls_routes.wait_until_ready().await?;
        self.tcp_routes.wait_until_ready().await?;
        self.udp_routes.wait_until_ready().await?;
        self.listener_sets.wait_until_ready().await?;
        self.backend_tls_policies.wait_until_ready().await?;
        self.reference_grants.wait_until_ready().await?;
        self.services.wait_until_ready().await?;
        self.endpoint_slices.wait_until_ready().await?;
        self.secrets.wait_until_ready().await?;
        self.namespaces.wait_until_ready().await?;
        self.rate_limit_policies.wait_until_ready().await?;
        self.auth_policies.wait_until_ready().await?;
        self.client_policies.wait_until_ready().await?;
        self.backend_policies.wait_until_ready().await?;
        self.cache_policies.wait_until_ready().await?;
        self.backend_traffic_policies.wait_until_ready().await?;
        self.gateway_parameters.wait_until_ready().await?;
        self.credential_secrets.wait_until_ready().await?;
        self.config_maps.wait_until_ready().await
    }

    /// A snapshot of every well-formed object, for the compiler.
    pub fn inputs(&self, now: Time) -> Inputs {
        let mut inputs = Inputs::new(now);
        inputs.gateway_classes = well_formed(&self.gateway_classes);
        inputs.gateways = well_formed(&self.gateways);
        inputs.http_routes = well_formed(&self.http_routes);
        inputs.grpc_routes = well_formed(&self.grpc_routes);
        inputs.tls_routes = well_formed(&self.tls_routes);
        inputs.tcp_routes = well_formed(&self.tcp_routes);
        inputs.udp_routes = well_formed(&self.udp_routes);
        inputs.listener_sets = well_formed(&self.listener_sets);
        inputs.backend_tls_policies = well_formed(&self.backend_tls_policies);
        inputs.reference_grants = well_formed(&self.reference_grants);
        inputs.services = well_formed(&self.services);
        inputs.endpoint_slices = well_formed(&self.endpoint_slices);
        inputs.secrets = well_formed(&self.secrets);
        // A labelled TLS Secret is in both stores: keep one copy.
        let tls: std::collections::BTreeSet<(Option<String>, Option<String>)> = inputs
            .secrets
            .iter()
            .map(|s| (s.metadata.namespace.clone(), s.metadata.name.clone()))
            .collect();
        inputs.secrets.extend(
            well_formed(&self.credential_secrets)
                .into_iter()
                .filter(|s| {
                    !tls.contains(&(s.metadata.namespace.clone(), s.metadata.name.clone()))
                }),
        );
        inputs.namespaces = well_formed(&self.namespaces);
        inputs.config_maps = well_formed(&self.config_maps);
        inputs.rate_limit_policies = well_formed(&self.rate_limit_policies);
        inputs.auth_policies = well_formed(&self.auth_policies);
        inputs.client_policies = well_formed(&self.client_policies);
        inputs.backend_policies = well_formed(&self.backend_policies);
        inputs.cache_policies = well_formed(&self.cache_policies);
        inputs.backend_traffic_policies = well_formed(&self.backend_traffic_policies);
        inputs.gateway_parameters = well_formed(&self.gateway_parameters);
        inputs
    }
}

/// The well-formed objects of `store`, shared with it: every reconcile snapshots every object
/// (50k routes at scale), so a snapshot copies pointers, not objects.
fn well_formed<K: Resource<DynamicType = ()> + Clone>(store: &Store<Lenient<K>>) -> Objects<K> {
    let mut objects = Objects::new();
    objects.extend(store.state().iter().filter_map(|o| o.shared().cloned()));
    objects
}

/// The watch [`Stores::spawn`] runs for an optional kind (TLSRoute in [`Optional::Forgiving`]
/// mode, the policies in [`Optional::FailClosed`] mode), on its own: a store that is listed and
/// empty while `K` counts as none, unlisted while in doubt, and follows `K` once it can be
/// listed (asked again every `retry`). Changes go to `tx` as [`Change`]s of `kind`.
pub fn watch_optional<K>(
    api: Api<Lenient<K>>,
    kind: Kind,
    mode: Optional,
    retry: std::time::Duration,
    tx: &UnboundedSender<Change>,
    metrics: &Arc<Metrics>,
) -> (Store<Lenient<K>>, JoinHandle<()>)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let w = Watch {
        kind,
        tx: tx.clone(),
        metrics: metrics.clone(),
    };
    w.spawn_optional(api, watcher::Config::default(), mode, retry)
}

/// One kind's watch.
struct Watch {
    kind: Kind,
    tx: UnboundedSender<Change>,
    metrics: Arc<Metrics>,
}

/// True for a store copy whose payload was dropped: nothing references it.
fn unreferenced(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> bool {
    m.annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(DATA_OMITTED))
}

/// How often a kind whose CRD is missing is asked for again.
const OPTIONAL_RETRY: std::time::Duration = std::time::Duration::from_secs(30);
/// How often an optional kind in doubt (neither listed nor counted as none) is asked for
/// again, at most.
pub const WAIT_RETRY: std::time::Duration = std::time::Duration::from_secs(2);

mod watch;
pub use watch::relevance;

#[cfg(test)]
mod kinds_tests {
    use super::{Kind, Kinds};

    #[test]
    fn every_kind_is_at_its_index_and_a_set_names_each_once() {
        for (i, k) in Kind::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i, "{k:?}");
        }
        let mut ks = Kinds::default();
        assert_eq!(ks.names(), "");
        ks.insert(Kind::Service);
        ks.insert(Kind::HttpRoute);
        ks.insert(Kind::Service);
        ks.insert(Kind::GatewayParameters);
        assert_eq!(ks.names(), "HTTPRoute,Service,GatewayParameters");
    }
}
