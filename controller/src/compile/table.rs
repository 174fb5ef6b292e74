//! Route-table assembly.
//!
//! In: validated Gateways and attached routes. Out: one [`RouteTable`] per accepted Gateway:
//! programmed listeners grouped by port (most specific hostname first), each with the virtual
//! hosts of the routes attached to it (listener isolation: a listener never sees another's
//! routes), routes sorted by [`Precedence`], only the backends those routes reference, and
//! the policy sets (or closures by invalid policies) their rules name.
//!
//! Virtual hosts are disjoint: a request for `foo.example.com` is served by the
//! `foo.example.com` host if one exists, and never falls through to `*.example.com` routes.

use std::collections::BTreeMap;
use std::sync::Arc;

use tollgate_api::policy::Closed;
use tollgate_api::{
    Filter, ListenerConfig, ObjectKey, PolicySet, PortConfig, Route, RouteTable, VirtualHost,
    WeightedBackend,
};

use super::cache::CompileCache;
use super::hostnames::{listener_order, vhost_order};
use super::index::{LookupMap, LookupSet};
use super::kinds::RouteKind;
use super::listeners::GatewayModel;
use super::policies::Policies;
use super::policies::client::RuleSettings;
use super::precedence::Precedence;
use super::routes::Routes;

/// Builds the tables of every accepted Gateway; with a `cache` and no policy in force, the
/// route list of a virtual host whose routes compiled to what they did last time is the
/// cached one.
pub fn build_tables(
    gateways: &[GatewayModel<'_>],
    routes: &Routes<'_>,
    policies: &Policies,
    body_limits: &BTreeMap<(ObjectKey, u32), RuleSettings>,
    cache: Option<&mut CompileCache>,
) -> BTreeMap<ObjectKey, RouteTable> {
    let no_policy =
        policies.effective.is_empty() && policies.closed.is_empty() && body_limits.is_empty();
    let mut cache = cache.filter(|_| no_policy);
    // (gateway, listener) -> [(route index, attachment index)]
    let mut by_listener: BTreeMap<(usize, usize), Vec<(usize, usize)>> = BTreeMap::new();
    for (ri, r) in routes.routes.iter().enumerate() {
        for (ai, a) in r.attachments.iter().enumerate() {
            by_listener
                .entry((a.gateway, a.listener))
                .or_default()
                .push((ri, ai));
        }
    }
    let mut out = BTreeMap::new();
    for (gi, gw) in gateways.iter().enumerate() {
        if !gw.accepted {
            continue;
        }
        let mut ports: BTreeMap<u16, PortConfig> = BTreeMap::new();
        // Backend keys the Gateway's routes reference: looked up once per rule of each of
        // 10k routes, so hashed rather than compared along a tree.
        let mut used: LookupSet<&str> = LookupSet::default();
        let mut table_policies: BTreeMap<String, Entry> = BTreeMap::new();
        for (li, l) in gw.listeners.iter().enumerate() {
            let (true, Some(port), Some(protocol)) = (l.programmed, l.port, l.protocol) else {
                continue;
            };
            let attached = by_listener
                .get(&(gi, li))
                .map(Vec::as_slice)
                .unwrap_or_default();
            let mut policy_for = |kind: RouteKind, route: &ObjectKey, rule: u32| {
                if no_policy {
                    return None;
                }
                let rule_key = (
                    gw.key.clone(),
                    l.spec.name.clone(),
                    kind.as_str(),
                    route.clone(),
                    rule,
                );
                let entry = match policies.closed.get(&rule_key) {
                    Some(c) => Entry::Closed(c.clone()),
                    None => Entry::Set(policies.effective.get(&rule_key)?.clone()),
                };
                Some(policy_key(
                    &mut table_policies,
                    (kind, route, rule),
                    &l.spec.name,
                    entry,
                ))
            };
            let memo = cache
                .as_deref_mut()
                .map(|c| (c, &gw.key, l.spec.name.as_str()));
            let virtual_hosts = virtual_hosts(
                routes,
                attached,
                &mut used,
                &mut policy_for,
                body_limits,
                memo,
            );
            ports
                .entry(port)
                .or_insert_with(|| PortConfig {
                    address: gw.address.clone(),
                    port,
                    protocol,
                    listeners: Vec::new(),
                    client_validation: l.client_validation.clone(),
                    client: Default::default(),
                })
                .listeners
                .push(ListenerConfig {
                    name: l.spec.name.clone(),
                    hostname: l.hostname.clone(),
                    certificates: l.certificates.clone(),
                    passthrough: l.passthrough,
                    virtual_hosts,
                });
        }
        let mut ports: Vec<PortConfig> = ports.into_values().collect();
        for p in &mut ports {
            p.listeners.sort_by(|a, b| {
                listener_order(a.hostname.as_deref(), b.hostname.as_deref())
                    .then_with(|| a.name.cmp(&b.name))
            });
        }
        // Collected into a sorted map: the set's order does not matter.
        let backends = used
            .into_iter()
            .filter_map(|k| routes.backends.get(k).map(|b| (k.to_owned(), b.clone())))
            .collect();
        let (mut sets, mut closed) = (BTreeMap::new(), BTreeMap::new());
        for (k, e) in table_policies {
            match e {
                Entry::Set(s) => {
                    sets.insert(k, s);
                }
                Entry::Closed(c) => {
                    closed.insert(k, c);
                }
            }
        }
        out.insert(
            gw.key.clone(),
            RouteTable {
                version: 0,
                gateway: gw.key.clone(),
                policies: sets,
                closed,
                ports,
                backends,
            },
        );
    }
    out
}

/// Virtual hosts of one listener; records every backend key referenced in `used`. With a
/// `memo` (the cache, the Gateway and the listener), a host whose routes carry the stamps they
/// had last time keeps its route list.
fn virtual_hosts<'r>(
    routes: &'r Routes<'_>,
    attached: &[(usize, usize)],
    used: &mut LookupSet<&'r str>,
    policy_for: &mut dyn FnMut(RouteKind, &ObjectKey, u32) -> Option<String>,
    body_limits: &BTreeMap<(ObjectKey, u32), RuleSettings>,
    mut memo: Option<(&mut CompileCache, &ObjectKey, &str)>,
) -> Vec<VirtualHost> {
    // Per route: the policy key of each rule (the same through every attachment); per host,
    // the routes attached to it, in attachment order.
    let mut rule_policies: BTreeMap<usize, Vec<Option<String>>> = BTreeMap::new();
    // Hosts in the order first attached, found by hash (10k routes over a few hundred
    // hosts); sorted by `vhost_order` at the end.
    let mut hosts: Vec<(&str, Vec<usize>)> = Vec::new();
    let mut host_index: LookupMap<&str, usize> = LookupMap::default();
    for &(ri, ai) in attached {
        let r = &routes.routes[ri];
        let Ok(rules) = &r.compiled.rules else {
            continue;
        };
        // Policy keys by rule position, as long as the last rule that has one (most routes
        // have none: no allocation, nothing stored).
        let mut keys: Vec<Option<String>> = Vec::new();
        for (k, rule) in rules.iter().enumerate() {
            note_backends(&rule.backends, &rule.filters, used);
            if let Some(key) = policy_for(r.kind, &r.key, rule.index) {
                keys.resize(k, None);
                keys.push(Some(key));
            }
        }
        if !keys.is_empty() {
            rule_policies.insert(ri, keys);
        }
        for h in &r.attachments[ai].hostnames {
            let i = *host_index.entry(h.as_str()).or_insert_with(|| {
                hosts.push((h.as_str(), Vec::new()));
                hosts.len() - 1
            });
            hosts[i].1.push(ri);
        }
    }
    let mut out: Vec<VirtualHost> = hosts
        .into_iter()
        .map(|(hostname, attached)| {
            let build = || host_routes(routes, &attached, &rule_policies, body_limits);
            let routes = match memo.as_mut() {
                Some((cache, gateway, listener)) => {
                    let stamps = attached.iter().map(|&ri| routes.routes[ri].stamp).collect();
                    cache.vhost((gateway, listener, hostname), stamps, build)
                }
                None => Arc::new(build()),
            };
            VirtualHost {
                hostname: hostname.to_owned(),
                routes,
            }
        })
        .collect();
    out.sort_by(|a, b| vhost_order(&a.hostname, &b.hostname));
    out
}

/// The routes of one virtual host in precedence order, from the routes attached to it
/// (`attached`, indices into `routes`; one attached twice counts once).
fn host_routes(
    routes: &Routes<'_>,
    attached: &[usize],
    rule_policies: &BTreeMap<usize, Vec<Option<String>>>,
    body_limits: &BTreeMap<(ObjectKey, u32), RuleSettings>,
) -> Vec<Route> {
    let mut entries: Vec<(Precedence, Route)> = Vec::new();
    for &ri in attached {
        let r = &routes.routes[ri];
        let Ok(rules) = &r.compiled.rules else {
            continue;
        };
        let created = r.meta.creation_timestamp.as_ref().map(|t| t.0);
        let request_trailers = r.compiled.request_trailers;
        let policies = rule_policies.get(&ri);
        for (k, rule) in rules.iter().enumerate() {
            let policy = policies.and_then(|p| p.get(k).cloned().flatten());
            // Only HTTPRoutes take a ClientPolicy's body limit (and only when there is one).
            let client = (!body_limits.is_empty() && r.kind == RouteKind::Http)
                .then(|| body_limits.get(&(r.key.clone(), rule.index)).copied())
                .flatten()
                .unwrap_or_default();
            let matches = rule.matches.iter().zip(&rule.specificity);
            for (mi, (m, specificity)) in matches.enumerate() {
                let (ns, name) = (&r.key.namespace, &r.key.name);
                let key = Precedence::new(specificity.clone(), created, ns, name, rule.index, mi);
                let entry = Route {
                    route: r.key.clone(),
                    rule_index: rule.index,
                    rule_name: rule.name.clone(),
                    matcher: m.clone(),
                    filters: rule.filters.clone(),
                    backends: rule.backends.clone(),
                    timeouts: rule.timeouts.clone(),
                    retry: rule.retry.clone(),
                    session: rule.session.clone(),
                    policy: policy.clone(),
                    request_trailers,
                    max_request_body_bytes: client.max_request_body_bytes,
                    compression_disabled: client.compression_disabled,
                    grpc_web: r.kind == RouteKind::Grpc,
                    cache: None,
                };
                entries.push((key, entry));
            }
        }
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    // The same route attached through two parentRefs yields the same entry twice.
    entries.dedup_by(|a, b| a.0 == b.0);
    entries.into_iter().map(|(_, r)| r).collect()
}

/// What a route's policy key names: a policy set, or a closure by invalid policies. One map
/// of both while building, so a key is never used for one in `policies` and the other in
/// `closed`.
#[derive(PartialEq)]
enum Entry {
    Set(PolicySet),
    Closed(Closed),
}

/// The key of `set` in the table's policy map: `namespace/route/rule` (`#grpc` appended for a
/// GRPCRoute, which may share an HTTPRoute's name), or with `@listener` when another listener
/// already holds a different set for the same rule.
fn policy_key(
    map: &mut BTreeMap<String, Entry>,
    (kind, route, rule): (RouteKind, &ObjectKey, u32),
    listener: &str,
    set: Entry,
) -> String {
    let mut base = format!("{}/{}/{rule}", route.namespace, route.name);
    if kind == RouteKind::Grpc {
        base.push_str("#grpc");
    }
    let key = match map.get(&base) {
        Some(existing) if *existing != set => format!("{base}@{listener}"),
        _ => base,
    };
    map.entry(key.clone()).or_insert(set);
    key
}

fn note_backends<'r>(
    backends: &'r [WeightedBackend],
    filters: &'r [Filter],
    used: &mut LookupSet<&'r str>,
) {
    for f in filters {
        if let Filter::RequestMirror(m) = f
            && let Some(k) = &m.backend
        {
            used.insert(k);
        }
        if let Filter::ExternalAuth(e) = f
            && !e.backend.is_empty()
        {
            used.insert(&e.backend);
        }
    }
    for b in backends {
        if let Some(k) = &b.backend {
            used.insert(k);
        }
        note_backends(&[], &b.filters, used);
    }
}
