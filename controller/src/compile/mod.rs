//! The pure compiler: Kubernetes objects in, route tables and desired statuses out.
//!
//! In: [`Inputs`], plain gateway-api and k8s-openapi objects plus the time to stamp on
//! conditions. Out: [`Output`], one [`RouteTable`] per accepted Gateway of our class and the
//! status every GatewayClass, Gateway, HTTPRoute, GRPCRoute and TLSRoute of ours should carry. No I/O, no clock, no
//! hash-map iteration: the same input gives byte-identical output whatever the input order.
//!
//! The pipeline, one module per concern:
//! [`classes`] (GatewayClass acceptance, [`parameters`]) → [`listeners`] (Gateway and listener validation,
//! conflicts, [`certs`], unsupported [`tls`] settings) → [`routes`] (parentRef attachment, [`hostnames`], allowedRoutes) with
//! [`rules`] (matches, [`filters`], timeouts), [`grpc`] (GRPCRoute matches), [`tlsroute`]
//! (TLSRoute backends, for TLS passthrough listeners) and [`backends`]
//! (Services, EndpointSlices, [`grants`]), [`crossserve`] (HTTPRoute/GRPCRoute hostname
//! conflicts) → [`table`] (virtual hosts sorted by [`precedence`]) → statuses. [`kinds`] holds
//! what the two route kinds share.
//! Fault isolation: an invalid object only rejects itself.

pub mod backend_tls;
pub mod backends;
pub mod cache;
pub mod certs;
pub mod classes;
pub mod conditions;
pub mod crossserve;
pub mod ext_auth_filter;
pub mod filters;
pub mod grants;
pub mod grpc;
pub mod grpc_cors;
pub mod hostnames;
pub mod index;
pub mod kinds;
pub mod listeners;
pub mod listenersets;
pub mod load;
pub mod objects;
pub mod output;
pub mod parameters;
pub mod policies;
pub mod precedence;
pub mod routes;
pub mod rules;
pub mod session;
pub mod table;
pub mod tls;
pub mod tlsroute;

use std::collections::BTreeMap;

use gateway_types::backendtlspolicies::{BackendTlsPolicy, BackendTlsPolicyStatus};
use gateway_types::experimental::httproutes::{HttpRoute, HttpRouteStatus};
use gateway_types::gatewayclasses::{GatewayClass, GatewayClassStatus};
use gateway_types::gateways::{Gateway, GatewayStatus};
use gateway_types::grpcroutes::{GrpcRoute, GrpcRouteStatus};
use gateway_types::listenersets::{ListenerSet, ListenerSetStatus};
use gateway_types::referencegrants::ReferenceGrant;
use gateway_types::tcproutes::{TcpRoute, TcpRouteStatus};
use gateway_types::tlsroutes::{TlsRoute, TlsRouteStatus};
use gateway_types::udproutes::{UdpRoute, UdpRouteStatus};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::Serialize;
use tollgate_api::{ObjectKey, RouteTable};

use crate::crds::{
    AuthPolicy, BackendPolicy, CachePolicy, ClientPolicy, GatewayParameters, GatewayParametersSpec,
    PolicyStatus, RateLimitPolicy,
};
use gateway_types::experimental::xbackendtrafficpolicies::XBackendTrafficPolicy;

pub use cache::{CacheStats, CompileCache};
pub use kinds::RouteKind;
pub use load::{LoadError, LoadWarning, inputs_from_yaml};
pub use objects::Objects;
pub use output::Rejection;
pub use policies::LastValid;

/// The `spec.controllerName` of GatewayClasses this compiler owns.
pub const CONTROLLER_NAME: &str = "tollgate.dev/gateway-controller";

/// Everything the compiler reads. Order does not matter: the compiler sorts.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// GatewayClasses (all controllers; only ours are compiled).
    pub gateway_classes: Objects<GatewayClass>,
    /// Gateways (all classes; only ours are compiled).
    pub gateways: Objects<Gateway>,
    /// HTTPRoutes.
    pub http_routes: Objects<HttpRoute>,
    /// GRPCRoutes.
    pub grpc_routes: Objects<GrpcRoute>,
    /// TLSRoutes.
    pub tls_routes: Objects<TlsRoute>,
    /// TCPRoutes.
    pub tcp_routes: Objects<TcpRoute>,
    /// UDPRoutes.
    pub udp_routes: Objects<UdpRoute>,
    /// ListenerSets.
    pub listener_sets: Objects<ListenerSet>,
    /// ReferenceGrants.
    pub reference_grants: Objects<ReferenceGrant>,
    /// Services.
    pub services: Objects<Service>,
    /// EndpointSlices.
    pub endpoint_slices: Objects<EndpointSlice>,
    /// Secrets (only `kubernetes.io/tls` ones referenced by listeners are read).
    pub secrets: Objects<Secret>,
    /// Namespaces, for `allowedRoutes.namespaces.selector`.
    pub namespaces: Objects<Namespace>,
    /// ConfigMaps (only those Gateways name as frontend `caCertificateRefs` are read).
    pub config_maps: Objects<ConfigMap>,
    /// RateLimitPolicies.
    pub rate_limit_policies: Objects<RateLimitPolicy>,
    /// AuthPolicies.
    pub auth_policies: Objects<AuthPolicy>,
    /// ClientPolicies.
    pub client_policies: Objects<ClientPolicy>,
    /// BackendPolicies.
    pub backend_policies: Objects<BackendPolicy>,
    /// CachePolicies.
    pub cache_policies: Objects<CachePolicy>,
    /// XBackendTrafficPolicies (retry budgets, session persistence).
    pub backend_traffic_policies: Objects<XBackendTrafficPolicy>,
    /// BackendTLSPolicies.
    pub backend_tls_policies: Objects<BackendTlsPolicy>,
    /// GatewayParameters (what GatewayClasses and Gateways say their proxies run with).
    pub gateway_parameters: Objects<GatewayParameters>,
    /// The policies an earlier compile found valid: what a policy that became invalid keeps
    /// enforcing (fail closed, see [`policies::last_valid`]). Callers that compile again and
    /// again (the controller, `tollgate run`) pass the previous [`Output::last_valid`];
    /// empty, an invalid AuthPolicy closes its targets.
    pub last_valid: LastValid,
    /// Ports no listener may take (the provisioned proxy's admin port): such a listener, the
    /// Gateway's or a ListenerSet's, is `PortUnavailable` rather than breaking the proxy.
    pub reserved_ports: Vec<u16>,
    /// Stamped as `lastTransitionTime` on every condition; nothing else reads a clock.
    pub now: Time,
    /// Documents [`inputs_from_yaml`] skipped (kinds the compiler does not read). The compiler
    /// ignores this field.
    pub warnings: Vec<LoadWarning>,
}

impl Default for Inputs {
    /// No objects, `now` at the Unix epoch.
    fn default() -> Self {
        Self::new(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH))
    }
}

impl Inputs {
    /// No objects, conditions stamped with `now`.
    pub fn new(now: Time) -> Self {
        Self {
            gateway_classes: Objects::new(),
            gateways: Objects::new(),
            http_routes: Objects::new(),
            grpc_routes: Objects::new(),
            tls_routes: Objects::new(),
            tcp_routes: Objects::new(),
            udp_routes: Objects::new(),
            listener_sets: Objects::new(),
            reference_grants: Objects::new(),
            services: Objects::new(),
            endpoint_slices: Objects::new(),
            secrets: Objects::new(),
            namespaces: Objects::new(),
            config_maps: Objects::new(),
            rate_limit_policies: Objects::new(),
            auth_policies: Objects::new(),
            client_policies: Objects::new(),
            backend_policies: Objects::new(),
            cache_policies: Objects::new(),
            backend_traffic_policies: Objects::new(),
            backend_tls_policies: Objects::new(),
            gateway_parameters: Objects::new(),
            last_valid: LastValid::default(),
            reserved_ports: Vec::new(),
            now,
            warnings: Vec::new(),
        }
    }

    /// Appends every object and warning of `other` (keeps `self.now` and `self.last_valid`),
    /// e.g. when reading a directory.
    pub fn extend(&mut self, other: Inputs) {
        self.gateway_classes.extend(other.gateway_classes);
        self.gateways.extend(other.gateways);
        self.http_routes.extend(other.http_routes);
        self.grpc_routes.extend(other.grpc_routes);
        self.tls_routes.extend(other.tls_routes);
        self.tcp_routes.extend(other.tcp_routes);
        self.udp_routes.extend(other.udp_routes);
        self.listener_sets.extend(other.listener_sets);
        self.reference_grants.extend(other.reference_grants);
        self.services.extend(other.services);
        self.endpoint_slices.extend(other.endpoint_slices);
        self.secrets.extend(other.secrets);
        self.namespaces.extend(other.namespaces);
        self.config_maps.extend(other.config_maps);
        self.rate_limit_policies.extend(other.rate_limit_policies);
        self.auth_policies.extend(other.auth_policies);
        self.client_policies.extend(other.client_policies);
        self.backend_policies.extend(other.backend_policies);
        self.cache_policies.extend(other.cache_policies);
        self.backend_traffic_policies
            .extend(other.backend_traffic_policies);
        self.backend_tls_policies.extend(other.backend_tls_policies);
        self.gateway_parameters.extend(other.gateway_parameters);
        self.warnings.extend(other.warnings);
    }
}

/// What the compiler produces.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Output {
    /// One table per accepted Gateway of our classes.
    #[serde(serialize_with = "output::keyed")]
    pub tables: BTreeMap<ObjectKey, RouteTable>,
    /// Status of every GatewayClass whose controllerName is ours, by name.
    pub gateway_classes: BTreeMap<String, GatewayClassStatus>,
    /// Status of every Gateway of our classes.
    #[serde(serialize_with = "output::keyed")]
    pub gateways: BTreeMap<ObjectKey, GatewayStatus>,
    /// Status of every ListenerSet whose parentRef names one of our Gateways.
    #[serde(
        serialize_with = "output::keyed",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub listener_sets: BTreeMap<ObjectKey, ListenerSetStatus>,
    /// Status of every HTTPRoute with at least one parentRef to one of our Gateways; `parents`
    /// holds only the entries for our Gateways.
    #[serde(serialize_with = "output::keyed")]
    pub http_routes: BTreeMap<ObjectKey, HttpRouteStatus>,
    /// Status of every GRPCRoute with at least one parentRef to one of our Gateways, as for
    /// HTTPRoutes.
    #[serde(serialize_with = "output::keyed")]
    pub grpc_routes: BTreeMap<ObjectKey, GrpcRouteStatus>,
    /// Status of every TLSRoute with at least one parentRef to one of our Gateways, as for
    /// HTTPRoutes.
    #[serde(
        serialize_with = "output::keyed",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub tls_routes: BTreeMap<ObjectKey, TlsRouteStatus>,
    /// Status of every TCPRoute with at least one parentRef to one of our Gateways, as for
    /// HTTPRoutes.
    #[serde(
        serialize_with = "output::keyed",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub tcp_routes: BTreeMap<ObjectKey, TcpRouteStatus>,
    /// Status of every UDPRoute with at least one parentRef to one of our Gateways, as for
    /// HTTPRoutes.
    #[serde(
        serialize_with = "output::keyed",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub udp_routes: BTreeMap<ObjectKey, UdpRouteStatus>,
    /// Status of every RateLimitPolicy.
    #[serde(
        serialize_with = "output::keyed",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub rate_limit_policies: BTreeMap<ObjectKey, PolicyStatus>,
    /// Status of every AuthPolicy.
    #[serde(
        serialize_with = "output::keyed",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub auth_policies: BTreeMap<ObjectKey, PolicyStatus>,
    /// Status of every ClientPolicy.
    #[serde(
        serialize_with = "output::keyed",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub client_policies: BTreeMap<ObjectKey, PolicyStatus>,
    /// Status of every BackendPolicy.
    #[serde(
        serialize_with = "output::keyed",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub backend_policies: BTreeMap<ObjectKey, PolicyStatus>,
    /// Status of every CachePolicy.
    #[serde(
        serialize_with = "output::keyed",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub cache_policies: BTreeMap<ObjectKey, PolicyStatus>,
    /// Status of every XBackendTrafficPolicy (its `ancestors` are what the API takes).
    #[serde(
        serialize_with = "output::keyed",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub backend_traffic_policies: BTreeMap<ObjectKey, PolicyStatus>,
    /// Status of every BackendTLSPolicy that targets a Service port our Gateways' routes use.
    #[serde(
        serialize_with = "output::keyed",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub backend_tls_policies: BTreeMap<ObjectKey, BackendTlsPolicyStatus>,
    /// The GatewayParameters of every Gateway with a table (its class's merged with its own;
    /// the default when neither names any), or why they cannot be used: then its proxy is
    /// neither provisioned nor changed. Not serialized (the statuses say the same).
    #[serde(skip)]
    pub parameters: BTreeMap<ObjectKey, Result<GatewayParametersSpec, String>>,
    /// The policies valid now, or kept at their last valid version: the next compile's
    /// [`Inputs::last_valid`]. Not part of the serialized output (it is memory, not a result).
    #[serde(skip)]
    pub last_valid: LastValid,
}

/// Compiles `inputs`. Pure and deterministic.
pub fn compile(inputs: &Inputs) -> Output {
    compile_with(inputs, None)
}

/// Compiles `inputs` like [`compile`], skipping the work `cache` (what the previous call
/// returned, or `CompileCache::default()`) shows to be done already, and returns the cache for
/// the next call. The output is exactly [`compile`]'s, whatever the cache holds: the cache is
/// a value passed in and out, so this stays pure.
pub fn compile_cached(inputs: &Inputs, mut cache: CompileCache) -> (Output, CompileCache) {
    let out = compile_with(inputs, Some(&mut cache));
    (out, cache)
}

fn compile_with(inputs: &Inputs, mut cache: Option<&mut CompileCache>) -> Output {
    let idx = index::Index::new(inputs);
    if let Some(c) = cache.as_deref_mut() {
        c.begin(&idx);
    }
    let now = &inputs.now;

    let parameters_index = parameters::index(&inputs.gateway_parameters);
    let classes = classes::compile_classes(&inputs.gateway_classes, &parameters_index, now);
    let mut gateway_parameters = BTreeMap::new();
    let mut gateways: Vec<listeners::GatewayModel<'_>> = idx
        .gateways
        .iter()
        .filter_map(|gw| {
            let class = classes.get(gw.spec.gateway_class_name.as_str())?;
            let params = parameters::gateway_parameters(
                gw,
                class
                    .parameters
                    .as_ref()
                    .map(|p| *p)
                    .map_err(String::as_str),
                &parameters_index,
            );
            let sets = idx
                .listener_sets
                .get(&index::key_of(&gw.metadata))
                .map(Vec::as_slice)
                .unwrap_or_default();
            let model = listeners::compile_gateway(
                gw,
                sets,
                params.as_ref().err().map(String::as_str),
                &idx,
                &inputs.reserved_ports,
                now,
            );
            gateway_parameters.insert(model.key.clone(), params);
            Some(model)
        })
        .collect();
    gateways.sort_by(|a, b| a.key.cmp(&b.key));

    let routes = routes::compile_routes(&idx, &mut gateways, now, cache.as_deref_mut());
    // Without policies there is nothing to attach: skip the per-route views of 10k routes.
    let any_policy = !(inputs.rate_limit_policies.is_empty() && inputs.auth_policies.is_empty());
    let policies = if any_policy {
        policies::compile_policies(
            inputs,
            &idx,
            &policy_gateways(&gateways),
            &policy_routes(&gateways, &routes),
            &existing_targets(inputs),
        )
    } else {
        policies::Policies::default()
    };
    let mut client = policies::client::compile_client_policies(
        &inputs.client_policies,
        &inputs.last_valid.client_policies,
        &client_gateways(&gateways),
        &client_routes(&gateways, &routes),
        &existing_targets(inputs),
        now,
    );
    let mut tables = table::build_tables(
        &gateways,
        &routes,
        &policies,
        &client.routes,
        cache.as_deref_mut(),
    );
    policies::external::add_backends(&mut tables, &policies.external_backends);
    for ((gw, port), settings) in std::mem::take(&mut client.ports) {
        if let Some(p) = tables
            .get_mut(&gw)
            .and_then(|t| t.ports.iter_mut().find(|p| p.port == port))
        {
            p.client = settings;
        }
    }
    let cache_policies = policies::cache::compile_cache_policies(
        &inputs.cache_policies,
        &client_gateways(&gateways),
        &client_routes(&gateways, &routes),
        &existing_targets(inputs),
        now,
    );
    policies::cache::apply(&mut tables, &cache_policies);
    let backend_policies =
        policies::backend::apply(&inputs.backend_policies, &idx, &mut tables, now);
    let backend_traffic_policies =
        policies::traffic::apply(&inputs.backend_traffic_policies, &idx, &mut tables, now);
    let mut policies = policies;
    policies.last_valid.client_policies = std::mem::take(&mut client.last_valid);
    for (gw, by) in std::mem::take(&mut client.affecting_gateways) {
        policies
            .affecting_gateways
            .entry(gw)
            .or_default()
            .extend(by);
    }
    let policies::cache::CachePolicies {
        status: cache_status,
        affecting_routes: cache_routes,
        affecting_gateways: cache_gateways,
        ..
    } = cache_policies;
    for (gw, by) in cache_gateways {
        policies
            .affecting_gateways
            .entry(gw)
            .or_default()
            .extend(by);
    }
    for ((route, gw), by) in cache_routes
        .into_iter()
        .chain(std::mem::take(&mut client.affecting_routes))
    {
        policies
            .affecting_routes
            .entry((RouteKind::Http.as_str(), route, gw))
            .or_default()
            .extend(by);
    }
    if let Some(c) = cache {
        c.finish();
    }
    let backend_tls_policies = backend_tls_outcome(&idx, &gateways, &routes, &mut tables, now);

    let listener_sets = gateways
        .iter()
        .flat_map(listeners::GatewayModel::listener_set_statuses)
        .collect();
    let gateway_statuses = gateways
        .iter()
        .map(|g| {
            let mut status = g.status();
            if let Some(by) = policies.affecting_gateways.get(&g.key) {
                affected(
                    status.conditions.get_or_insert_with(Vec::new),
                    by,
                    g.gateway.metadata.generation,
                    now,
                );
            }
            (g.key.clone(), status)
        })
        .collect();
    // Routes come sorted by key within each kind: collecting sorted lists builds each map in
    // one pass instead of 10k inserts.
    let mut http_routes = Vec::new();
    let mut grpc_routes = Vec::new();
    let mut tls_routes = Vec::new();
    let mut tcp_routes = Vec::new();
    let mut udp_routes = Vec::new();
    // Keys are built per parent only when some policy affects some route.
    let any_affected = !policies.affecting_routes.is_empty();
    // The routes are not needed after this: their status entries move out, uncloned.
    for r in routes.routes.into_iter().filter(|r| !r.parents.is_empty()) {
        let mut parents = r.parents;
        if any_affected {
            for p in parents.iter_mut() {
                let gw = ObjectKey::new(
                    p.parent_ref
                        .namespace
                        .as_deref()
                        .unwrap_or(&r.key.namespace),
                    p.parent_ref.name.as_str(),
                );
                if let Some(by) =
                    policies
                        .affecting_routes
                        .get(&(r.kind.as_str(), r.key.clone(), gw))
                {
                    affected(&mut p.conditions, by, r.meta.generation, now);
                }
            }
        }
        match r.kind {
            RouteKind::Http => {
                http_routes.push((r.key, HttpRouteStatus { parents }));
            }
            RouteKind::Grpc => {
                let parents = parents.into_iter().map(kinds::grpc_parent).collect();
                grpc_routes.push((r.key, GrpcRouteStatus { parents }));
            }
            RouteKind::Tls => {
                let parents = parents.into_iter().map(kinds::tls_parent).collect();
                tls_routes.push((r.key, TlsRouteStatus { parents }));
            }
            RouteKind::Tcp => {
                let parents = parents.into_iter().map(kinds::tcp_parent).collect();
                tcp_routes.push((r.key, TcpRouteStatus { parents }));
            }
            RouteKind::Udp => {
                let parents = parents.into_iter().map(kinds::udp_parent).collect();
                udp_routes.push((r.key, UdpRouteStatus { parents }));
            }
        }
    }
    // Only Gateways with a table are provisioned.
    gateway_parameters.retain(|k, _| tables.contains_key(k));
    let parameters = gateway_parameters;
    Output {
        tables,
        gateway_classes: classes
            .into_iter()
            .map(|(name, c)| (name.to_owned(), c.status))
            .collect(),
        gateways: gateway_statuses,
        listener_sets,
        http_routes: http_routes.into_iter().collect(),
        grpc_routes: grpc_routes.into_iter().collect(),
        tls_routes: tls_routes.into_iter().collect(),
        tcp_routes: tcp_routes.into_iter().collect(),
        udp_routes: udp_routes.into_iter().collect(),
        rate_limit_policies: policies.rate_limit_status,
        auth_policies: policies.auth_status,
        client_policies: client.status,
        backend_policies,
        cache_policies: cache_status,
        backend_traffic_policies,
        backend_tls_policies,
        parameters,
        last_valid: policies.last_valid,
    }
}

/// Gives each Gateway's TLS backends the client certificate the Gateway presents, and returns
/// the BackendTLSPolicy statuses (ancestors: the Gateways whose served routes name a Service
/// port a policy targets, whether or not the ref resolved).
fn backend_tls_outcome(
    idx: &index::Index<'_>,
    gateways: &[listeners::GatewayModel<'_>],
    routes: &routes::Routes<'_>,
    tables: &mut BTreeMap<ObjectKey, RouteTable>,
    now: &Time,
) -> BTreeMap<ObjectKey, BackendTlsPolicyStatus> {
    if idx.backend_tls.by_target.is_empty() {
        return BTreeMap::new();
    }
    for g in gateways {
        let Some(table) = tables.get_mut(&g.key) else {
            continue;
        };
        let cert = backend_tls::client_certificate(g.gateway, idx).and_then(Result::ok);
        if cert.is_none() {
            continue;
        }
        for b in table.backends.values_mut() {
            if let Some(tls) = &mut b.tls {
                tls.client_certificate.clone_from(&cert);
            }
        }
    }
    let usage = backend_tls::service_usage(idx, gateways, routes);
    idx.backend_tls.statuses(&usage, now)
}

/// Every Gateway and route in the inputs, as (kind, key).
fn existing_targets(inputs: &Inputs) -> std::collections::BTreeSet<(&'static str, ObjectKey)> {
    let gws = inputs
        .gateways
        .iter()
        .map(|g| ("Gateway", index::key_of(&g.metadata)));
    let routes = inputs
        .http_routes
        .iter()
        .map(|r| ("HTTPRoute", index::key_of(&r.metadata)));
    let grpc_routes = inputs
        .grpc_routes
        .iter()
        .map(|r| ("GRPCRoute", index::key_of(&r.metadata)));
    gws.chain(routes).chain(grpc_routes).collect()
}

/// Policy attachment view of the Gateways. TLS, TCP and UDP listeners are left out: policies act on
/// HTTP requests, and a stream has none, so a policy never claims to be enforced there.
fn policy_gateways(gateways: &[listeners::GatewayModel<'_>]) -> Vec<policies::GatewayTarget> {
    gateways
        .iter()
        .filter(|g| g.accepted)
        .map(|g| {
            let is_stream = |l: &&listeners::ListenerModel<'_>| {
                matches!(
                    l.protocol,
                    Some(
                        tollgate_api::Protocol::Tls
                            | tollgate_api::Protocol::Tcp
                            | tollgate_api::Protocol::Udp
                    )
                )
            };
            policies::GatewayTarget {
                key: g.key.clone(),
                listeners: g
                    .listeners
                    .iter()
                    .filter(|l| !is_stream(l))
                    .map(|l| l.spec.name.clone())
                    .collect(),
                streams: g
                    .listeners
                    .iter()
                    .filter(is_stream)
                    .filter(|l| l.accepted)
                    .map(|l| format!("{} ({})", l.spec.name, l.spec.protocol))
                    .collect(),
            }
        })
        .collect()
}

/// ClientPolicy attachment view of the accepted Gateways: every listener with a port, UDP ones
/// excepted.
fn client_gateways(
    gateways: &[listeners::GatewayModel<'_>],
) -> Vec<policies::client::ClientGateway> {
    gateways
        .iter()
        .filter(|g| g.accepted)
        .map(|g| policies::client::ClientGateway {
            key: g.key.clone(),
            listeners: g
                .listeners
                .iter()
                // A UDP port has no connection to limit and no PROXY header to read.
                .filter(|l| l.protocol != Some(tollgate_api::Protocol::Udp))
                .filter_map(|l| Some((l.spec.name.clone(), l.port?)))
                .collect(),
        })
        .collect()
}

/// ClientPolicy attachment view of the served HTTPRoutes.
fn client_routes(
    gateways: &[listeners::GatewayModel<'_>],
    routes: &routes::Routes<'_>,
) -> Vec<policies::client::ClientRoute> {
    routes
        .routes
        .iter()
        .filter(|r| r.kind == RouteKind::Http)
        .filter_map(|r| {
            let rules = r.compiled.rules.as_ref().ok()?;
            let mut gws: Vec<ObjectKey> = r
                .attachments
                .iter()
                .map(|a| gateways[a.gateway].key.clone())
                .collect();
            gws.sort();
            gws.dedup();
            Some(policies::client::ClientRoute {
                key: r.key.clone(),
                rules: rules
                    .iter()
                    .map(|rule| (rule.index, rule.name.clone()))
                    .collect(),
                gateways: gws,
            })
        })
        .collect()
}

/// Policy attachment view of the served routes.
fn policy_routes(
    gateways: &[listeners::GatewayModel<'_>],
    routes: &routes::Routes<'_>,
) -> Vec<policies::RouteTarget> {
    routes
        .routes
        .iter()
        // TLSRoutes and TCPRoutes carry streams, not requests: no policy targets them (see
        // policy_gateways).
        .filter(|r| !r.kind.is_stream())
        .filter_map(|r| {
            let rules = r.compiled.rules.as_ref().ok()?;
            let mut attachments: Vec<(ObjectKey, String)> = r
                .attachments
                .iter()
                .map(|a| {
                    let g = &gateways[a.gateway];
                    (g.key.clone(), g.listeners[a.listener].spec.name.clone())
                })
                .collect();
            attachments.sort();
            attachments.dedup();
            Some(policies::RouteTarget {
                kind: r.kind.as_str(),
                key: r.key.clone(),
                rules: rules
                    .iter()
                    .map(|rule| (rule.index, rule.name.clone()))
                    .collect(),
                attachments,
            })
        })
        .collect()
}

/// Adds `tollgate.dev/<Kind>Affected` conditions naming the policies in `by`.
fn affected(
    conditions: &mut Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    by: &std::collections::BTreeSet<(&'static str, ObjectKey)>,
    generation: Option<i64>,
    now: &Time,
) {
    let conds = conditions::Conds::new(generation, now);
    for kind in [
        "AuthPolicy",
        "CachePolicy",
        "ClientPolicy",
        "RateLimitPolicy",
    ] {
        let names: Vec<String> = by
            .iter()
            .filter(|(k, _)| *k == kind)
            .map(|(_, key)| key.to_string())
            .collect();
        if !names.is_empty() {
            conditions.push(conds.yes(
                &format!("tollgate.dev/{kind}Affected"),
                "Accepted",
                format!("affected by {kind} {}", names.join(", ")),
            ));
        }
    }
}
