//! Route attachment and status, for every route kind ([`RouteSource`]).
//!
//! In: every HTTPRoute, GRPCRoute and TLSRoute, the validated [`GatewayModel`]s, a backend [`Resolver`].
//! Out: per route that names one of our Gateways, the `status.parents[]` entries for those
//! Gateways and the listeners (with effective hostnames) it is attached to; each listener's
//! `attached` set is filled for `attachedRoutes`.
//!
//! A parentRef (kind Gateway, group gateway.networking.k8s.io) to a Gateway that is not ours,
//! or that does not exist, gets no entry: we cannot know whose it is; nor does one of kind
//! ListenerSet to a ListenerSet that names no Gateway of ours. A Gateway parentRef reaches the
//! Gateway's own listeners only, a ListenerSet parentRef that ListenerSet's (not accepted:
//! `NoMatchingParent`). For ours: candidates are
//! the listeners matching `sectionName` and `port` (none: `NoMatchingParent`); of the accepted
//! candidates, those whose allowedRoutes admit the route's namespace and kind (none:
//! `NotAllowedByListeners`); of those, the ones whose hostname intersects the route's (none:
//! `NoMatchingListenerHostname`). Attachment counts for `attachedRoutes` even when the route's
//! rules are invalid (the spec bases it on allowedRoutes and parentRefs only); such a route is
//! `Accepted=False UnsupportedValue` and stays out of the tables. Last, [`crossserve`] keeps
//! HTTPRoutes and GRPCRoutes from sharing a hostname on a listener.

use std::collections::BTreeMap;
use std::sync::Arc;

use gateway_types::experimental::httproutes::{
    HttpRouteParentRefs, HttpRouteStatusParents, HttpRouteStatusParentsParentRef,
};
use gateway_types::gateways::GatewayListeners;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use tollgate_api::{Backend, ObjectKey};

use super::CONTROLLER_NAME;
use super::backends::Resolver;
use super::cache::CompileCache;
use super::conditions::{ACCEPTED, Conds, Problem, RESOLVED_REFS, reason};
use super::crossserve;
use super::grants::GATEWAY_GROUP;
use super::hostnames;
use super::index::{Index, LookupMap, key_of, ns_of};
use super::kinds::{RouteKind, RouteSource, status_parent_ref};
use super::listeners::{AllowedNamespaces, GatewayModel};
use super::rules::CompiledRoute;

/// Where a valid route is served.
#[derive(Debug, Clone)]
pub struct Attachment {
    /// Index into the gateway list.
    pub gateway: usize,
    /// Index into that gateway's listeners.
    pub listener: usize,
    /// Effective hostnames (lower-case, `*` = any).
    pub hostnames: Vec<String>,
    /// Index into the route's `parents` of the parentRef that attached it.
    pub parent: usize,
}

/// One route (of any kind) that names at least one of our Gateways.
#[derive(Debug)]
pub struct RouteModel<'a> {
    /// HTTPRoute, GRPCRoute or TLSRoute.
    pub kind: RouteKind,
    /// The route's metadata.
    pub meta: &'a ObjectMeta,
    /// Its key.
    pub key: ObjectKey,
    /// Compiled rules (shared with the [`CompileCache`] that may hold them).
    pub compiled: Arc<CompiledRoute>,
    /// Names `compiled` for the virtual-host memo of the [`CompileCache`] (0 without one).
    pub stamp: u64,
    /// Status entries for our Gateways (HTTPRoute-typed; GRPCRoute ones are converted on
    /// output).
    pub parents: Vec<HttpRouteStatusParents>,
    /// Listeners the route is served on (only when its rules are valid). Shared with the
    /// [`CompileCache`]'s memo of the route.
    pub attachments: Arc<Vec<Attachment>>,
}

/// Routes plus every backend they resolved.
#[derive(Debug)]
pub struct Routes<'a> {
    /// HTTPRoutes sorted by key, then GRPCRoutes, then TLSRoutes, TCPRoutes and UDPRoutes, each sorted
    /// by key.
    pub routes: Vec<RouteModel<'a>>,
    /// Resolved backends by key (for lookups).
    pub backends: LookupMap<String, Backend>,
}

/// The kind of parent a parentRef names: `Some(false)` a Gateway, `Some(true)` a
/// ListenerSet, `None` anything else.
fn parent_is_set(p: &HttpRouteParentRefs) -> Option<bool> {
    if p.group.as_deref().unwrap_or(GATEWAY_GROUP) != GATEWAY_GROUP {
        return None;
    }
    match p.kind.as_deref().unwrap_or("Gateway") {
        "Gateway" => Some(false),
        super::listenersets::KIND => Some(true),
        _ => None,
    }
}

/// A parentRef to one of ours: the Gateway (index) and, for a ListenerSet, its index in
/// that Gateway's [`GatewayModel::listener_sets`].
type OurParent<'r> = (&'r HttpRouteParentRefs, usize, Option<usize>);

/// Attaches every route to our Gateways; with a `cache`, compiles only the routes it does not
/// hold already.
pub fn compile_routes<'a>(
    idx: &Index<'a>,
    gateways: &mut [GatewayModel<'_>],
    now: &Time,
    mut cache: Option<&mut CompileCache>,
) -> Routes<'a> {
    // namespace -> name -> index: looked up without building a key per parentRef.
    let mut by_key: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    // ListenerSets of our Gateways: (namespace, name) -> (gateway, set).
    let mut by_set: BTreeMap<(&str, &str), (usize, usize)> = BTreeMap::new();
    for (i, g) in gateways.iter().enumerate() {
        by_key
            .entry(g.key.namespace.clone())
            .or_default()
            .insert(g.key.name.clone(), i);
        for (si, s) in g.listener_sets.iter().enumerate() {
            let k = &s.entry.key;
            by_set.insert((k.namespace.as_str(), k.name.as_str()), (i, si));
        }
    }
    if let Some(c) = cache.as_deref_mut() {
        c.listeners(ListenerView::of(gateways, idx));
    }
    let mut resolver = Resolver::new(idx);
    let mut routes = Vec::with_capacity(
        idx.routes.len()
            + idx.grpc_routes.len()
            + idx.tls_routes.len()
            + idx.tcp_routes.len()
            + idx.udp_routes.len(),
    );
    let sources = idx
        .routes
        .iter()
        .map(|r| RouteSource::Http(r))
        .chain(idx.grpc_routes.iter().map(|r| RouteSource::Grpc(r)))
        .chain(idx.tls_routes.iter().map(|r| RouteSource::Tls(r)))
        .chain(idx.tcp_routes.iter().map(|r| RouteSource::Tcp(r)))
        .chain(idx.udp_routes.iter().map(|r| RouteSource::Udp(r)));
    for route in sources {
        let meta = route.meta();
        let route_ns = ns_of(meta);
        let refs = route.parent_refs();
        let mut ours: Vec<OurParent<'_>> = Vec::new();
        for p in refs.iter() {
            let Some(is_set) = parent_is_set(p) else {
                continue;
            };
            if ours.iter().any(|(q, _, _)| *q == p) {
                continue;
            }
            let ns = p.namespace.as_deref().unwrap_or(route_ns);
            if is_set {
                if let Some(&(gi, si)) = by_set.get(&(ns, p.name.as_str())) {
                    ours.push((p, gi, Some(si)));
                }
            } else if let Some(&gi) = by_key.get(ns).and_then(|m| m.get(p.name.as_str())) {
                ours.push((p, gi, None));
            }
        }
        if ours.is_empty() {
            continue;
        }
        let key = key_of(meta);
        let (compiled, stamp, kept) = match cache.as_deref_mut() {
            Some(c) => c.route(route, &key, &mut resolver),
            None => (Arc::new(route.compile(&mut resolver)), 0, None),
        };
        let attached = match kept {
            Some(mut a) => {
                a.restamp(now);
                a
            }
            None => {
                let a = attach_route(idx, route, ours, gateways, &compiled, now);
                if let Some(c) = cache.as_deref_mut() {
                    c.keep_attached(route.kind(), &a);
                }
                a
            }
        };
        let Attached {
            parents,
            attachments,
            counted,
        } = attached;
        for &(gi, li) in counted.iter() {
            gateways[gi].listeners[li].attached += 1;
        }
        routes.push(RouteModel {
            kind: route.kind(),
            meta,
            key,
            compiled,
            stamp,
            parents,
            attachments,
        });
    }
    let mut routes = Routes {
        routes,
        backends: resolver.backends,
    };
    crossserve::resolve(&mut routes, gateways, now);
    routes
}

/// What attaching one route gives: its status entries for our Gateways, where it is served,
/// and the listeners it counts on. A function of the route (and its compiled rules), the
/// [`ListenerView`] and `now` alone, so the [`CompileCache`] keeps it with the route.
#[derive(Debug, Clone)]
pub(crate) struct Attached {
    parents: Vec<HttpRouteStatusParents>,
    attachments: Arc<Vec<Attachment>>,
    /// (gateway, listener) pairs the route counts on for `attachedRoutes`, invalid rules or
    /// not; once each, however many parentRefs lead there.
    counted: Arc<[(usize, usize)]>,
}

impl Attached {
    /// A copy of `self` whose status entries are written into the allocations of `into`
    /// (entries of an earlier output, whatever they hold): equal to `self.clone()`, without
    /// allocating where the old vectors and strings are large enough.
    pub(crate) fn copy_into(&self, mut into: Vec<HttpRouteStatusParents>) -> Self {
        refill(&mut into, &self.parents, refill_parent);
        Self {
            parents: into,
            attachments: self.attachments.clone(),
            counted: self.counted.clone(),
        }
    }

    /// Stamps every condition with `now`, as attaching the route now would.
    fn restamp(&mut self, now: &Time) {
        for c in self
            .parents
            .iter_mut()
            .flat_map(|p| p.conditions.iter_mut())
        {
            c.last_transition_time = now.clone();
        }
    }
}

/// Makes `dst` equal to `src`, writing each element over an old one with `write` (which must
/// leave it equal to its source) before cloning the rest.
fn refill<T: Clone>(dst: &mut Vec<T>, src: &[T], write: fn(&mut T, &T)) {
    dst.truncate(src.len());
    for (d, s) in dst.iter_mut().zip(src) {
        write(d, s);
    }
    let n = dst.len();
    dst.extend_from_slice(&src[n..]);
}

/// `*d = s.clone()`, reusing `d`'s strings. Every field is named, so a field the type gains
/// fails to compile here rather than being left stale.
fn refill_parent(d: &mut HttpRouteStatusParents, s: &HttpRouteStatusParents) {
    let HttpRouteStatusParents {
        conditions,
        controller_name,
        parent_ref,
    } = s;
    refill(&mut d.conditions, conditions, refill_condition);
    d.controller_name.clone_from(controller_name);
    let HttpRouteStatusParentsParentRef {
        group,
        kind,
        name,
        namespace,
        port,
        section_name,
    } = parent_ref;
    let p = &mut d.parent_ref;
    p.group.clone_from(group);
    p.kind.clone_from(kind);
    p.name.clone_from(name);
    p.namespace.clone_from(namespace);
    p.port = *port;
    p.section_name.clone_from(section_name);
}

/// `*d = s.clone()`, reusing `d`'s strings (every field named, as in [`refill_parent`]).
fn refill_condition(d: &mut Condition, s: &Condition) {
    let Condition {
        last_transition_time,
        message,
        observed_generation,
        reason,
        status,
        type_,
    } = s;
    d.last_transition_time.clone_from(last_transition_time);
    d.message.clone_from(message);
    d.observed_generation = *observed_generation;
    d.reason.clone_from(reason);
    d.status.clone_from(status);
    d.type_.clone_from(type_);
}

/// Attaches `route` (compiled to `compiled`) through `ours`, its parentRefs to our Gateways.
fn attach_route(
    idx: &Index<'_>,
    route: RouteSource<'_>,
    ours: Vec<OurParent<'_>>,
    gateways: &[GatewayModel<'_>],
    compiled: &CompiledRoute,
    now: &Time,
) -> Attached {
    let conds = Conds::new(route.meta().generation, now);
    let resolved_cond = resolved_refs(&compiled.unresolved, &conds);
    let mut parents = Vec::with_capacity(ours.len());
    let mut attachments = Vec::new();
    let mut counted: Vec<(usize, usize)> = Vec::new();
    for (pi, (p, gi, set)) in ours.into_iter().enumerate() {
        let accepted = match attach(idx, route, p, &gateways[gi], set) {
            Err(problem) => conds.no(ACCEPTED, problem.reason, problem.message),
            Ok(found) => {
                counted.extend(found.iter().map(|(li, _)| (gi, *li)));
                match &compiled.rules {
                    Ok(_) => {
                        attachments.extend(found.into_iter().map(|(li, hostnames)| Attachment {
                            gateway: gi,
                            listener: li,
                            hostnames,
                            parent: pi,
                        }));
                        conds.yes(ACCEPTED, reason::ACCEPTED, "route is accepted")
                    }
                    Err(problem) => conds.no(ACCEPTED, problem.reason, problem.message.clone()),
                }
            }
        };
        parents.push(HttpRouteStatusParents {
            conditions: vec![accepted, resolved_cond.clone()],
            controller_name: CONTROLLER_NAME.to_owned(),
            parent_ref: status_parent_ref(p),
        });
    }
    counted.sort_unstable();
    counted.dedup();
    Attached {
        parents,
        attachments: Arc::new(attachments),
        counted: counted.into(),
    }
}

/// Everything of our Gateways that attaching a route reads: per Gateway (in key order, so
/// that indices match) its key and whether it is accepted, and per listener the listener as
/// written (name, port, hostname, protocol and allowedRoutes, from which [`attach`] derives
/// what it checks) and whether it is accepted; plus namespace labels when a listener selects
/// namespaces by label. Two compiles with equal views attach an unchanged route alike.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ListenerView {
    gateways: Vec<(ObjectKey, bool, Vec<ListenerFacts>, Vec<SetFacts>)>,
    namespace_labels: Vec<(String, BTreeMap<String, String>)>,
}

/// A listener as written, whether it is accepted, and the ListenerSet it comes from.
type ListenerFacts = (GatewayListeners, bool, Option<usize>);

/// A ListenerSet naming the Gateway, and whether it is accepted.
type SetFacts = (ObjectKey, bool);

impl ListenerView {
    /// The view of `gateways` (sorted by key) over `idx`.
    pub(crate) fn of(gateways: &[GatewayModel<'_>], idx: &Index<'_>) -> Self {
        let selects = gateways
            .iter()
            .flat_map(|g| &g.listeners)
            .any(|l| matches!(l.namespaces, AllowedNamespaces::Selector(_)));
        Self {
            gateways: gateways
                .iter()
                .map(|g| {
                    let listeners = g
                        .listeners
                        .iter()
                        .map(|l| (l.spec.clone(), l.accepted, l.set))
                        .collect();
                    let sets = g
                        .listener_sets
                        .iter()
                        .map(|s| (s.entry.key.clone(), s.accepted))
                        .collect();
                    (g.key.clone(), g.accepted, listeners, sets)
                })
                .collect(),
            namespace_labels: if selects {
                idx.namespace_labels
                    .iter()
                    .map(|(ns, labels)| ((*ns).to_owned(), labels.clone()))
                    .collect()
            } else {
                Vec::new()
            },
        }
    }
}

fn resolved_refs(unresolved: &[Problem], conds: &Conds<'_>) -> Condition {
    match unresolved.first() {
        None => conds.yes(
            RESOLVED_REFS,
            reason::RESOLVED_REFS,
            "all references resolved",
        ),
        Some(first) => {
            let all: Vec<&str> = unresolved.iter().map(|p| p.message.as_str()).collect();
            conds.no(RESOLVED_REFS, first.reason, all.join("; "))
        }
    }
}

/// Listeners (index, effective hostnames) a parentRef attaches to, or why none: the Gateway's
/// own listeners, or with `set` those of that ListenerSet of the Gateway.
fn attach(
    idx: &Index<'_>,
    route: RouteSource<'_>,
    p: &HttpRouteParentRefs,
    gw: &GatewayModel<'_>,
    set: Option<usize>,
) -> Result<Vec<(usize, Vec<String>)>, Problem> {
    // Only error messages name the parent: formatted there, not for every route.
    let gw_key = Parent(gw, set);
    if !gw.accepted {
        return Err(Problem::new(
            reason::NO_MATCHING_PARENT,
            format!("Gateway {} is not accepted", gw.key),
        ));
    }
    if let Some(s) = set.map(|si| &gw.listener_sets[si])
        && !s.accepted
    {
        let why = s
            .conditions
            .first()
            .map(|c| c.message.as_str())
            .unwrap_or_default();
        return Err(Problem::new(
            reason::NO_MATCHING_PARENT,
            format!("{gw_key} is not accepted: {why}"),
        ));
    }
    let (kind, route_ns) = (route.kind(), ns_of(route.meta()));
    let candidates: Vec<usize> = gw
        .listeners
        .iter()
        .enumerate()
        .filter(|(_, l)| l.set == set)
        .filter(|(_, l)| p.section_name.as_ref().is_none_or(|s| *s == l.name))
        .filter(|(_, l)| p.port.is_none_or(|port| port == l.spec.port))
        .map(|(i, _)| i)
        .collect();
    if candidates.is_empty() {
        let what = match (&p.section_name, p.port) {
            (Some(s), Some(port)) => format!("no listener named {s} on port {port}"),
            (Some(s), None) => format!("no listener named {s}"),
            (None, Some(port)) => format!("no listener on port {port}"),
            (None, None) => "it has no listeners".to_owned(),
        };
        return Err(Problem::new(
            reason::NO_MATCHING_PARENT,
            format!("{gw_key}: {what}"),
        ));
    }
    let accepted: Vec<usize> = candidates
        .into_iter()
        .filter(|&i| gw.listeners[i].accepted)
        .collect();
    if accepted.is_empty() {
        return Err(Problem::new(
            reason::NO_MATCHING_PARENT,
            format!("{gw_key}: no matching listener is accepted"),
        ));
    }
    let allowed: Vec<usize> = accepted
        .iter()
        .copied()
        .filter(|&i| {
            let l = &gw.listeners[i];
            l.allows(kind) && l.allows_namespace(idx, route_ns)
        })
        .collect();
    if allowed.is_empty() {
        let message = if accepted.iter().any(|&i| gw.listeners[i].allows(kind)) {
            format!("{gw_key}: no listener allows {kind}s from namespace {route_ns}")
        } else {
            format!("{gw_key}: no matching listener takes {kind}s")
        };
        return Err(Problem::new(reason::NOT_ALLOWED_BY_LISTENERS, message));
    }
    let route_hosts = route.hostnames();
    let mut found = Vec::new();
    for i in allowed {
        let hosts = hostnames::effective(gw.listeners[i].hostname.as_deref(), route_hosts);
        if !hosts.is_empty() {
            found.push((i, hosts));
        }
    }
    if found.is_empty() {
        return Err(Problem::new(
            reason::NO_MATCHING_LISTENER_HOSTNAME,
            format!("{gw_key}: no listener hostname intersects the route's hostnames"),
        ));
    }
    Ok(found)
}

/// A parent in messages: `Gateway ns/name` or `ListenerSet ns/name`.
struct Parent<'g, 'a>(&'g GatewayModel<'a>, Option<usize>);

impl std::fmt::Display for Parent<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.1 {
            None => write!(f, "Gateway {}", self.0.key),
            Some(si) => write!(
                f,
                "{} {}",
                super::listenersets::KIND,
                self.0.listener_sets[si].entry.key
            ),
        }
    }
}
