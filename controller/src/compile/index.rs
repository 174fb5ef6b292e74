//! A borrowed, sorted view of [`Inputs`](super::Inputs) for cheap lookups.
//!
//! In: the inputs. Out: objects keyed by namespace/name in `BTreeMap`s, so lookups are
//! `O(log n)` and iteration order never depends on the order objects arrived in. Objects
//! without a namespace are taken to be in `default`, as `kubectl apply` would put them.
//! Duplicate keys (two files declaring the same object) keep one deterministically: the one
//! whose JSON form sorts first.

use std::borrow::Cow;
use std::collections::BTreeMap;

use gateway_types::experimental::httproutes::HttpRoute;
use gateway_types::gateways::Gateway;
use gateway_types::grpcroutes::GrpcRoute;
use gateway_types::referencegrants::ReferenceGrant;
use gateway_types::tcproutes::TcpRoute;
use gateway_types::tlsroutes::TlsRoute;
use gateway_types::udproutes::UdpRoute;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use tollgate_api::ObjectKey;

use super::Inputs;

/// Hash map for lookups only. The compiler never iterates one, so their order cannot reach
/// the output (no hash-map iteration: see the module docs of [`super`]).
pub type LookupMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
/// Hash set for membership only, or collected into a sorted collection.
pub type LookupSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

/// Namespace assumed for objects that name none.
pub const DEFAULT_NAMESPACE: &str = "default";
/// Label EndpointSlices carry to name their Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Label every Namespace carries with its own name.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// Namespace of an object (`default` when unset).
pub fn ns_of(meta: &ObjectMeta) -> &str {
    meta.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE)
}

/// Name of an object (empty when unset).
pub fn name_of(meta: &ObjectMeta) -> &str {
    meta.name.as_deref().unwrap_or_default()
}

/// Key of an object.
pub fn key_of(meta: &ObjectMeta) -> ObjectKey {
    ObjectKey::new(ns_of(meta), name_of(meta))
}

/// `(namespace, name)` borrowed.
pub type Ref<'a> = (&'a str, &'a str);

/// Sorted lookups over the inputs.
#[derive(Debug)]
pub struct Index<'a> {
    /// Gateways sorted by key.
    pub gateways: Vec<&'a Gateway>,
    /// HTTPRoutes sorted by key.
    pub routes: Vec<&'a HttpRoute>,
    /// GRPCRoutes sorted by key.
    pub grpc_routes: Vec<&'a GrpcRoute>,
    /// TLSRoutes sorted by key.
    pub tls_routes: Vec<&'a TlsRoute>,
    /// TCPRoutes sorted by key.
    pub tcp_routes: Vec<&'a TcpRoute>,
    /// UDPRoutes sorted by key.
    pub udp_routes: Vec<&'a UdpRoute>,
    /// ListenerSets by the Gateway they name, in precedence order.
    pub listener_sets: BTreeMap<ObjectKey, Vec<super::listenersets::ListenerSetEntry<'a>>>,
    /// Services by key.
    pub services: BTreeMap<Ref<'a>, &'a Service>,
    /// EndpointSlices by (namespace, service name), sorted by slice name.
    pub slices: BTreeMap<Ref<'a>, Vec<&'a EndpointSlice>>,
    /// Secrets by key.
    pub secrets: BTreeMap<Ref<'a>, &'a Secret>,
    pub config_maps: BTreeMap<Ref<'a>, &'a ConfigMap>,
    /// BackendTLSPolicies evaluated (they read only ConfigMaps): what applies to each
    /// Service port they target.
    pub backend_tls: super::backend_tls::Targets,
    /// Namespace labels by namespace name.
    pub namespace_labels: BTreeMap<&'a str, BTreeMap<String, String>>,
    /// ReferenceGrants by namespace (the namespace of the referent they allow).
    pub grants: BTreeMap<&'a str, Vec<&'a ReferenceGrant>>,
}

impl<'a> Index<'a> {
    /// Indexes `inputs`.
    pub fn new(inputs: &'a Inputs) -> Self {
        let gateways = by_key(&inputs.gateways, |g| &g.metadata);
        let routes = by_key(&inputs.http_routes, |r| &r.metadata);
        let grpc_routes = by_key(&inputs.grpc_routes, |r| &r.metadata);
        let tls_routes = by_key(&inputs.tls_routes, |r| &r.metadata);
        let tcp_routes = by_key(&inputs.tcp_routes, |r| &r.metadata);
        let udp_routes = by_key(&inputs.udp_routes, |r| &r.metadata);
        let listener_sets = super::listenersets::by_parent(&inputs.listener_sets);
        let services = by_key(&inputs.services, |s| &s.metadata)
            .into_iter()
            .map(|s| ((ns_of(&s.metadata), name_of(&s.metadata)), s))
            .collect();
        let secrets = by_key(&inputs.secrets, |s| &s.metadata)
            .into_iter()
            .map(|s| ((ns_of(&s.metadata), name_of(&s.metadata)), s))
            .collect();
        let config_maps: BTreeMap<Ref<'a>, &'a ConfigMap> =
            by_key(&inputs.config_maps, |c| &c.metadata)
                .into_iter()
                .map(|c| ((ns_of(&c.metadata), name_of(&c.metadata)), c))
                .collect();
        let backend_tls =
            super::backend_tls::Targets::new(&inputs.backend_tls_policies, &config_maps);
        let mut slices: BTreeMap<Ref<'a>, Vec<&'a EndpointSlice>> = BTreeMap::new();
        for slice in by_key(&inputs.endpoint_slices, |s| &s.metadata) {
            let Some(svc) = slice
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SERVICE_NAME_LABEL))
            else {
                continue;
            };
            slices
                .entry((ns_of(&slice.metadata), svc.as_str()))
                .or_default()
                .push(slice);
        }
        let mut namespace_labels = BTreeMap::new();
        for ns in by_key(&inputs.namespaces, |n| &n.metadata) {
            let name = name_of(&ns.metadata);
            let mut labels = ns.metadata.labels.clone().unwrap_or_default();
            // The API server sets this label on every namespace; files often omit it.
            labels
                .entry(NAMESPACE_NAME_LABEL.to_owned())
                .or_insert_with(|| name.to_owned());
            namespace_labels.insert(name, labels);
        }
        let mut grants: BTreeMap<&'a str, Vec<&'a ReferenceGrant>> = BTreeMap::new();
        for g in by_key(&inputs.reference_grants, |g| &g.metadata) {
            grants.entry(ns_of(&g.metadata)).or_default().push(g);
        }
        Self {
            gateways,
            routes,
            grpc_routes,
            tls_routes,
            tcp_routes,
            udp_routes,
            listener_sets,
            services,
            slices,
            secrets,
            config_maps,
            backend_tls,
            namespace_labels,
            grants,
        }
    }

    /// Labels of a namespace; a namespace missing from the inputs still carries its
    /// `kubernetes.io/metadata.name` label.
    pub fn labels_of_namespace(&self, ns: &str) -> Cow<'_, BTreeMap<String, String>> {
        match self.namespace_labels.get(ns) {
            Some(labels) => Cow::Borrowed(labels),
            None => Cow::Owned(BTreeMap::from([(
                NAMESPACE_NAME_LABEL.to_owned(),
                ns.to_owned(),
            )])),
        }
    }
}

/// Sorts objects by (namespace, name) and drops duplicates deterministically.
/// Label-selector semantics: every `match_labels` pair and every `(key, operator, values)`
/// expression must hold; an unknown operator matches nothing.
pub fn labels_match<'s>(
    match_labels: impl IntoIterator<Item = (&'s String, &'s String)>,
    expressions: impl IntoIterator<Item = (&'s str, &'s str, Option<&'s [String]>)>,
    labels: &BTreeMap<String, String>,
) -> bool {
    match_labels
        .into_iter()
        .all(|(k, v)| labels.get(k) == Some(v))
        && expressions.into_iter().all(|(key, op, values)| {
            let values = values.unwrap_or_default();
            let value = labels.get(key);
            match op {
                "In" => value.is_some_and(|v| values.contains(v)),
                "NotIn" => value.is_none_or(|v| !values.contains(v)),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                // An operator the API server would have refused: match nothing.
                _ => false,
            }
        })
}

/// (namespace, name, resourceVersion), borrowed from an object's metadata.
type SortKey<'a> = (&'a str, &'a str, Option<&'a str>);

pub(super) fn by_key<'a, T: Serialize + 'a>(
    items: impl IntoIterator<Item = &'a T>,
    meta: impl Fn(&T) -> &ObjectMeta,
) -> Vec<&'a T> {
    // Borrowed keys, taken once per object rather than per comparison, and no allocation per
    // object (10k routes are sorted on every compile). Unstable: objects whose keys are equal
    // are the duplicates ordered below.
    let mut keyed: Vec<(SortKey<'a>, &'a T)> = items
        .into_iter()
        .map(|t| {
            let m = meta(t);
            ((ns_of(m), name_of(m), m.resource_version.as_deref()), t)
        })
        .collect();
    keyed.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let mut v: Vec<&'a T> = keyed.into_iter().map(|(_, t)| t).collect();
    let has_dups = v.windows(2).any(|w| {
        let (a, b) = (meta(w[0]), meta(w[1]));
        ns_of(a) == ns_of(b) && name_of(a) == name_of(b)
    });
    if has_dups {
        // Rare (the same object in two files): break ties on the whole object.
        v.sort_by_cached_key(|t| {
            let m = meta(t);
            (
                ns_of(m).to_owned(),
                name_of(m).to_owned(),
                serde_json::to_string(t).unwrap_or_default(),
            )
        });
        v.dedup_by(|b, a| {
            let (ma, mb) = (meta(a), meta(b));
            ns_of(ma) == ns_of(mb) && name_of(ma) == name_of(mb)
        });
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Strings over a small alphabet (NUL included), many sharing prefixes.
    fn random_string(rng: &mut fastrand::Rng) -> String {
        let len = rng.usize(0..=20);
        (0..len)
            .map(|_| ['\0', 'a', 'b'][rng.usize(0..3)])
            .collect()
    }

    #[test]
    fn objects_sort_by_namespace_then_name() {
        let mut rng = fastrand::Rng::with_seed(11);
        let services: Vec<Service> = (0..300)
            .map(|i| Service {
                metadata: ObjectMeta {
                    // Namespaces that share a long prefix: the name must not decide before
                    // the namespace does.
                    namespace: Some(format!("a-long-namespace-{}", rng.usize(0..3))),
                    name: Some(format!("{}-{i}", random_string(&mut rng))),
                    ..ObjectMeta::default()
                },
                ..Service::default()
            })
            .collect();
        let sorted: Vec<(&str, &str)> = by_key(&services, |s| &s.metadata)
            .into_iter()
            .map(|s| (ns_of(&s.metadata), name_of(&s.metadata)))
            .collect();
        let mut expected: Vec<(&str, &str)> = services
            .iter()
            .map(|s| (ns_of(&s.metadata), name_of(&s.metadata)))
            .collect();
        expected.sort();
        assert_eq!(sorted, expected);
    }
}
