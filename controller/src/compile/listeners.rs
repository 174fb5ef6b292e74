//! Gateway and listener validation.
//!
//! In: one Gateway of our class (and whether its class is accepted), Secrets and
//! ReferenceGrants through the [`Index`]. Out: a [`GatewayModel`]: the bind address, each
//! listener with its protocol, hostname, certificates, allowedRoutes and conditions, and the
//! Gateway's own conditions. Routes are attached later by [`super::routes`], which fills
//! `attached` on each listener; [`GatewayModel::status`] then renders the status.
//!
//! Listener rules (Gateway API v1.5): HTTP, HTTPS and TLS only (`UnsupportedProtocol`). HTTP
//! and HTTPS serve HTTPRoutes and GRPCRoutes, TLS serves TLSRoutes ([`RouteKind::for_protocol`];
//! `supportedKinds` lists them unless `allowedRoutes.kinds` narrows it; other kinds there are
//! `InvalidRouteKinds`). A TLS listener with `tls.mode: Passthrough` uses no certificates; one
//! with `Terminate` (the default) needs them, as HTTPS does; Passthrough and Terminate
//! listeners may share a port (mixed mode: the SNI picks the listener). HTTPS needs
//! `tls.mode: Terminate` and certificates ([`super::certs`]); listeners sharing a port with
//! different protocols are `ProtocolConflict`, with the same hostname `HostnameConflict`; both
//! are then neither accepted nor programmed. A listener whose HTTPS certificates all fail, or
//! whose `allowedRoutes.kinds` leaves nothing we support, is accepted (routes attach and are
//! counted) but not programmed (not in the route table). TLS settings we do not implement
//! (`tls.options`, `spec.tls.frontend` validation) make a listener `UnsupportedValue`, and
//! `spec.tls.backend` gives the Gateway a `ResolvedRefs` condition ([`super::tls`]).
//!
//! ListenerSets ([`super::listenersets`]) add listeners after the Gateway's own: only those
//! `spec.allowedListeners` admits (none by default: `NotAllowed`), validated as the Gateway's
//! are, with their own namespace for `allowedRoutes` `Same` and certificateRefs. A ListenerSet
//! listener that a listener before it (the Gateway's, or an older ListenerSet's) conflicts with
//! is `Conflicted`; a ListenerSet with no valid listener is `ListenersNotValid`; the Gateway
//! counts the accepted ones in `attachedListenerSets`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use gateway_types::gateways::{
    Gateway, GatewayAllowedListenersNamespacesFrom, GatewayListeners,
    GatewayListenersAllowedRoutesNamespacesFrom, GatewayListenersAllowedRoutesNamespacesSelector,
    GatewayListenersTlsMode, GatewayStatus, GatewayStatusListeners,
    GatewayStatusListenersSupportedKinds,
};
use gateway_types::listenersets::{
    ListenerSetStatus, ListenerSetStatusListeners, ListenerSetStatusListenersSupportedKinds,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use tollgate_api::{Certificate, ObjectKey, Protocol};

use super::conditions::{ACCEPTED, CONFLICTED, Conds, PROGRAMMED, Problem, RESOLVED_REFS, reason};
use super::grants::GATEWAY_GROUP;
use super::index::{Index, key_of, ns_of};
use super::kinds::RouteKind;
use super::listenersets::{self, ListenerSetEntry};
use super::{certs, tls};

/// Bind address when the Gateway names none.
pub const DEFAULT_ADDRESS: &str = "0.0.0.0";

/// Which namespaces a listener accepts routes from.
#[derive(Debug, Clone)]
pub enum AllowedNamespaces<'a> {
    /// The Gateway's namespace only (default).
    Same,
    /// Any namespace.
    All,
    /// Namespaces whose labels match (`None` = selector missing: nothing matches).
    Selector(Option<&'a GatewayListenersAllowedRoutesNamespacesSelector>),
}

/// One listener after validation.
#[derive(Debug)]
pub struct ListenerModel<'a> {
    /// The listener as written (a ListenerSet's, renamed: see [`super::listenersets`]).
    pub spec: &'a GatewayListeners,
    /// The ListenerSet it comes from (index into [`GatewayModel::listener_sets`]), or `None`
    /// for the Gateway's own.
    pub set: Option<usize>,
    /// The name a parentRef's `sectionName` names: `spec.name` for the Gateway's own
    /// listeners, the name in the ListenerSet for the others.
    pub name: &'a str,
    /// Namespace of the object that declares it: `allowedRoutes` `Same` means this one.
    pub namespace: &'a str,
    /// Its port is one the proxy keeps for itself ([`super::Inputs::reserved_ports`]).
    pub reserved: bool,
    /// Port, when in range.
    pub port: Option<u16>,
    /// Protocol, when supported.
    pub protocol: Option<Protocol>,
    /// A TLS listener with `tls.mode: Passthrough`.
    pub passthrough: bool,
    /// Lower-case hostname.
    pub hostname: Option<String>,
    /// Routes may attach (supported protocol, no conflict, valid port).
    pub accepted: bool,
    /// Served by the proxy.
    pub programmed: bool,
    /// Route kinds we serve that allowedRoutes admits (none for an unsupported protocol).
    pub allowed_kinds: BTreeSet<RouteKind>,
    /// Namespace policy.
    pub namespaces: AllowedNamespaces<'a>,
    /// Certificates (HTTPS, and TLS listeners that terminate).
    pub certificates: Vec<Certificate>,
    /// Problems with certificateRefs (consumed when conditions are computed).
    pub cert_problems: Vec<Problem>,
    /// TLS settings we do not implement ([`tls::listener_problem`]), or a frontend
    /// validation without any usable CA.
    pub unsupported_tls: Option<Problem>,
    /// Client-certificate validation asked by `spec.tls.frontend` ([`tls::frontend`]).
    pub client_validation: Option<tollgate_api::ClientValidation>,
    /// Accepted, Conflicted, Programmed, ResolvedRefs.
    pub conditions: Vec<Condition>,
    /// Valid entries of allowedRoutes.kinds (or the default).
    pub supported_kinds: Vec<GatewayStatusListenersSupportedKinds>,
    /// Number of routes attached (filled by route attachment; a route attached through two
    /// parentRefs counts once).
    pub attached: usize,
}

/// One Gateway of our class after validation.
#[derive(Debug)]
pub struct GatewayModel<'a> {
    /// The Gateway.
    pub gateway: &'a Gateway,
    /// Its key.
    pub key: ObjectKey,
    /// Accepted: a table is built.
    pub accepted: bool,
    /// Address every listener binds.
    pub address: String,
    /// Listeners in spec order, then those of the admitted ListenerSets in precedence order.
    pub listeners: Vec<ListenerModel<'a>>,
    /// Accepted and Programmed.
    pub conditions: Vec<Condition>,
    /// Every ListenerSet naming this Gateway, admitted or not, in precedence order.
    pub listener_sets: Vec<ListenerSetModel<'a>>,
    /// Whether the status reports `attachedListenerSets` (the Gateway admits ListenerSets or
    /// one names it).
    pub reports_sets: bool,
}

/// One ListenerSet naming a Gateway of ours, after validation.
#[derive(Debug)]
pub struct ListenerSetModel<'a> {
    /// The ListenerSet and its listeners.
    pub entry: &'a ListenerSetEntry<'a>,
    /// Admitted by the Gateway's `allowedListeners`.
    pub allowed: bool,
    /// Accepted: admitted, with at least one valid listener, on an accepted Gateway.
    pub accepted: bool,
    /// Accepted and Programmed.
    pub conditions: Vec<Condition>,
}

impl GatewayModel<'_> {
    /// The status this Gateway should carry (addresses left for the controller).
    pub fn status(&self) -> GatewayStatus {
        let attached_sets = self.listener_sets.iter().filter(|s| s.accepted).count();
        GatewayStatus {
            addresses: None,
            attached_listener_sets: self
                .reports_sets
                .then(|| i32::try_from(attached_sets).unwrap_or(i32::MAX)),
            conditions: Some(self.conditions.clone()),
            listeners: Some(
                self.listeners
                    .iter()
                    .filter(|l| l.set.is_none())
                    .map(|l| GatewayStatusListeners {
                        attached_routes: i32::try_from(l.attached).unwrap_or(i32::MAX),
                        conditions: l.conditions.clone(),
                        name: l.spec.name.clone(),
                        supported_kinds: Some(l.supported_kinds.clone()),
                    })
                    .collect(),
            ),
        }
    }

    /// The status of each ListenerSet naming this Gateway.
    pub fn listener_set_statuses(&self) -> Vec<(ObjectKey, ListenerSetStatus)> {
        self.listener_sets
            .iter()
            .enumerate()
            .map(|(si, s)| {
                let listeners: Vec<ListenerSetStatusListeners> = self
                    .listeners
                    .iter()
                    .filter(|l| l.set == Some(si))
                    .map(|l| ListenerSetStatusListeners {
                        attached_routes: i32::try_from(l.attached).unwrap_or(i32::MAX),
                        conditions: l.conditions.clone(),
                        name: l.name.to_owned(),
                        supported_kinds: Some(
                            l.supported_kinds
                                .iter()
                                .map(|k| ListenerSetStatusListenersSupportedKinds {
                                    group: k.group.clone(),
                                    kind: k.kind.clone(),
                                })
                                .collect(),
                        ),
                    })
                    .collect();
                let status = ListenerSetStatus {
                    conditions: Some(s.conditions.clone()),
                    listeners: (!listeners.is_empty()).then_some(listeners),
                };
                (s.entry.key.clone(), status)
            })
            .collect()
    }
}

/// Label-selector semantics: all matchLabels and all matchExpressions must hold. A macro:
/// the generated selector types of allowedRoutes and allowedListeners have the same fields
/// but no trait in common.
macro_rules! selector_matches {
    ($sel:expr, $labels:expr) => {{
        let sel = $sel;
        super::index::labels_match(
            sel.match_labels.iter().flatten(),
            sel.match_expressions
                .iter()
                .flatten()
                .map(|e| (e.key.as_str(), e.operator.as_str(), e.values.as_deref())),
            $labels,
        )
    }};
}

impl ListenerModel<'_> {
    /// Marks the listener's port unusable when it is one of `reserved`.
    fn reserve(&mut self, reserved: &[u16]) {
        if self.port.is_some_and(|p| reserved.contains(&p)) {
            self.reserved = true;
        }
    }

    /// Whether routes of `kind` may attach, by allowedRoutes.kinds.
    pub fn allows(&self, kind: RouteKind) -> bool {
        self.allowed_kinds.contains(&kind)
    }

    /// Whether a route in `route_ns` may attach, by namespace.
    pub fn allows_namespace(&self, idx: &Index<'_>, route_ns: &str) -> bool {
        match &self.namespaces {
            AllowedNamespaces::Same => self.namespace == route_ns,
            AllowedNamespaces::All => true,
            AllowedNamespaces::Selector(None) => false,
            AllowedNamespaces::Selector(Some(sel)) => {
                selector_matches!(sel, &idx.labels_of_namespace(route_ns))
            }
        }
    }
}

/// Validates one Gateway of our class, with the ListenerSets that name it (`sets`, in
/// precedence order: [`listenersets::by_parent`]). `parameters_error` says why its
/// GatewayParameters cannot be used: it is then not `Accepted` (`InvalidParameters`), yet
/// served, since parameters concern its proxies' provisioning, not its traffic.
pub fn compile_gateway<'a>(
    gw: &'a Gateway,
    sets: &'a [ListenerSetEntry<'a>],
    parameters_error: Option<&str>,
    idx: &Index<'_>,
    reserved: &[u16],
    now: &Time,
) -> GatewayModel<'a> {
    let conds = Conds::new(gw.metadata.generation, now);
    let gw_ns = ns_of(&gw.metadata);
    let mut listeners: Vec<ListenerModel<'a>> = gw
        .spec
        .listeners
        .iter()
        .map(|l| validate_listener(gw, l, l.name.as_str(), gw_ns, "Gateway", idx))
        .collect();
    for l in &mut listeners {
        l.reserve(reserved);
    }
    let conflicts = find_conflicts(&gw.spec.listeners);
    for (i, l) in listeners.iter_mut().enumerate() {
        let conflict = conflicts.get(&i);
        finish_listener(l, conflict, &conds);
    }

    let (address, gateway_problem) = gateway_level_problems(gw);
    let valid = listeners.iter().filter(|l| l.accepted).count();
    let own = listeners.len();
    let accepted_cond = if let Some(p) = &gateway_problem {
        conds.no(ACCEPTED, p.reason, p.message.clone())
    } else if valid == 0 {
        conds.no(
            ACCEPTED,
            reason::LISTENERS_NOT_VALID,
            "no listener is valid",
        )
    } else if valid < own {
        conds.yes(
            ACCEPTED,
            reason::LISTENERS_NOT_VALID,
            format!("{} of {own} listeners are not valid", own - valid),
        )
    } else {
        conds.yes(ACCEPTED, reason::ACCEPTED, "Gateway is accepted")
    };
    let accepted = accepted_cond.status == "True";
    let accepted_cond = match parameters_error {
        Some(e) if accepted => conds.no(ACCEPTED, reason::INVALID_PARAMETERS, e),
        _ => accepted_cond,
    };
    if !accepted {
        // Nothing of a rejected Gateway is served, whatever its listeners look like.
        for l in listeners.iter_mut().filter(|l| l.programmed) {
            l.programmed = false;
            l.certificates.clear();
            for c in l.conditions.iter_mut().filter(|c| c.type_ == PROGRAMMED) {
                *c = conds.no(PROGRAMMED, reason::INVALID, "Gateway is not accepted");
            }
        }
    }
    let listener_sets = add_listener_sets(gw, sets, accepted, idx, reserved, now, &mut listeners);
    let programmed = accepted && listeners.iter().any(|l| l.programmed);
    let programmed_cond = if programmed {
        conds.yes(PROGRAMMED, reason::PROGRAMMED, "Gateway is programmed")
    } else if accepted {
        conds.no(PROGRAMMED, reason::INVALID, "no listener can be programmed")
    } else {
        conds.no(PROGRAMMED, reason::INVALID, "Gateway is not accepted")
    };
    let mut conditions = vec![accepted_cond, programmed_cond];
    conditions.extend(tls::insecure_frontend_condition(gw, &conds));
    conditions.extend(tls::backend_condition(gw, idx, &conds));
    GatewayModel {
        gateway: gw,
        key: key_of(&gw.metadata),
        accepted,
        address,
        listeners,
        conditions,
        listener_sets,
        reports_sets: !sets.is_empty() || admits_any_set(gw),
    }
}

/// Whether `spec.allowedListeners` admits ListenerSets from some namespace.
fn admits_any_set(gw: &Gateway) -> bool {
    gw.spec
        .allowed_listeners
        .as_ref()
        .and_then(|a| a.namespaces.as_ref())
        .and_then(|n| n.from.as_ref())
        .is_some_and(|f| *f != GatewayAllowedListenersNamespacesFrom::None)
}

/// Whether `spec.allowedListeners` admits a ListenerSet in namespace `ns`.
fn admits_set(gw: &Gateway, idx: &Index<'_>, ns: &str) -> bool {
    let Some(n) = gw
        .spec
        .allowed_listeners
        .as_ref()
        .and_then(|a| a.namespaces.as_ref())
    else {
        return false;
    };
    match n.from {
        None | Some(GatewayAllowedListenersNamespacesFrom::None) => false,
        Some(GatewayAllowedListenersNamespacesFrom::Same) => ns == ns_of(&gw.metadata),
        Some(GatewayAllowedListenersNamespacesFrom::All) => true,
        Some(GatewayAllowedListenersNamespacesFrom::Selector) => n
            .selector
            .as_ref()
            .is_some_and(|sel| selector_matches!(sel, &idx.labels_of_namespace(ns))),
    }
}

/// A listener that holds a port: later ListenerSet listeners conflict with it.
struct Held {
    port: i32,
    protocol: String,
    hostname: String,
    name: String,
}

impl Held {
    fn of(l: &ListenerModel<'_>) -> Self {
        Self {
            port: l.spec.port,
            protocol: l.spec.protocol.clone(),
            hostname: l.hostname.clone().unwrap_or_default(),
            name: l.spec.name.clone(),
        }
    }
}

/// Why a ListenerSet listener conflicts with a listener before it, if it does.
fn held_conflict(l: &ListenerModel<'_>, held: &[Held]) -> Option<Problem> {
    let port = l.spec.port;
    if let Some(h) = held
        .iter()
        .find(|h| h.port == port && h.protocol != l.spec.protocol)
    {
        return Some(Problem::new(
            reason::PROTOCOL_CONFLICT,
            format!(
                "port {port} is already used with protocol {} by listener {}",
                h.protocol, h.name
            ),
        ));
    }
    let host = l.hostname.as_deref().unwrap_or_default();
    held.iter()
        .find(|h| h.port == port && h.hostname == host)
        .map(|h| {
            let shown = if host.is_empty() { "(none)" } else { host };
            Problem::new(
                reason::HOSTNAME_CONFLICT,
                format!(
                    "listener {} already uses port {port} with hostname {shown}",
                    h.name
                ),
            )
        })
}

/// Validates the ListenerSets naming `gw`, appending the listeners of those it admits to
/// `listeners`; returns every ListenerSet with its conditions.
fn add_listener_sets<'a>(
    gw: &Gateway,
    sets: &'a [ListenerSetEntry<'a>],
    gateway_accepted: bool,
    idx: &Index<'_>,
    reserved: &[u16],
    now: &Time,
    listeners: &mut Vec<ListenerModel<'a>>,
) -> Vec<ListenerSetModel<'a>> {
    let gw_key = key_of(&gw.metadata);
    let mut held: Vec<Held> = listeners
        .iter()
        .filter(|l| l.accepted)
        .map(Held::of)
        .collect();
    let mut out = Vec::with_capacity(sets.len());
    for (si, entry) in sets.iter().enumerate() {
        let conds = Conds::new(entry.set.metadata.generation, now);
        let ns = entry.key.namespace.as_str();
        let allowed = admits_set(gw, idx, ns);
        let refused = |why: &str, message: String| ListenerSetModel {
            entry,
            allowed,
            accepted: false,
            conditions: vec![
                conds.no(ACCEPTED, why, message.clone()),
                conds.no(PROGRAMMED, why, message),
            ],
        };
        if !allowed {
            out.push(refused(
                reason::NOT_ALLOWED,
                format!("Gateway {gw_key} does not admit ListenerSets from namespace {ns} (spec.allowedListeners)"),
            ));
            continue;
        }
        if !gateway_accepted {
            out.push(refused(
                reason::PARENT_NOT_ACCEPTED,
                format!("Gateway {gw_key} is not accepted"),
            ));
            continue;
        }
        let first = listeners.len();
        for (i, spec) in entry.listeners.iter().enumerate() {
            let mut l = validate_listener(gw, spec, entry.own_name(i), ns, listenersets::KIND, idx);
            l.set = Some(si);
            l.reserve(reserved);
            let conflict = held_conflict(&l, &held);
            finish_listener(&mut l, conflict.as_ref(), &conds);
            if l.accepted {
                held.push(Held::of(&l));
            }
            listeners.push(l);
        }
        let mine = &listeners[first..];
        // Valid: served. A listener whose certificates are all refused (a missing
        // ReferenceGrant) is accepted on a Gateway, but it does not make a ListenerSet valid.
        let valid = mine.iter().filter(|l| l.programmed).count();
        if valid == 0 {
            out.push(refused(
                reason::LISTENERS_NOT_VALID,
                "no listener is valid".to_owned(),
            ));
            continue;
        }
        let accepted_cond = if valid < mine.len() {
            conds.yes(
                ACCEPTED,
                reason::ACCEPTED,
                format!(
                    "ListenerSet is accepted; {} of {} listeners are not valid",
                    mine.len() - valid,
                    mine.len()
                ),
            )
        } else {
            conds.yes(ACCEPTED, reason::ACCEPTED, "ListenerSet is accepted")
        };
        let programmed_cond =
            conds.yes(PROGRAMMED, reason::PROGRAMMED, "ListenerSet is programmed");
        out.push(ListenerSetModel {
            entry,
            allowed,
            accepted: true,
            conditions: vec![accepted_cond, programmed_cond],
        });
    }
    out
}

/// Problems that reject the whole Gateway; also picks the bind address.
fn gateway_level_problems(gw: &Gateway) -> (String, Option<Problem>) {
    let mut address = None;
    for (i, a) in gw.spec.addresses.iter().flatten().enumerate() {
        let ty = a.r#type.as_deref().unwrap_or("IPAddress");
        let value = a.value.as_deref().unwrap_or_default();
        if ty != "IPAddress" {
            let p = Problem::new(
                reason::UNSUPPORTED_ADDRESS,
                format!("spec.addresses[{i}]: address type {ty} is not supported (IPAddress only)"),
            );
            return (DEFAULT_ADDRESS.to_owned(), Some(p));
        }
        match value.parse::<IpAddr>() {
            Ok(ip) => {
                address.get_or_insert_with(|| ip.to_string());
            }
            Err(_) => {
                let p = Problem::new(
                    reason::UNSUPPORTED_ADDRESS,
                    format!("spec.addresses[{i}]: {value:?} is not an IP address"),
                );
                return (DEFAULT_ADDRESS.to_owned(), Some(p));
            }
        }
    }
    (address.unwrap_or_else(|| DEFAULT_ADDRESS.to_owned()), None)
}

/// Conflicts by listener index: same port with different protocols, else same port and
/// hostname.
fn find_conflicts(listeners: &[GatewayListeners]) -> BTreeMap<usize, Problem> {
    let mut by_port: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
    for (i, l) in listeners.iter().enumerate() {
        by_port.entry(l.port).or_default().push(i);
    }
    let mut out = BTreeMap::new();
    for (port, ids) in by_port {
        let protocols: BTreeSet<&str> = ids
            .iter()
            .map(|&i| listeners[i].protocol.as_str())
            .collect();
        if protocols.len() > 1 {
            let list = protocols.into_iter().collect::<Vec<_>>().join(", ");
            for &i in &ids {
                out.insert(
                    i,
                    Problem::new(
                        reason::PROTOCOL_CONFLICT,
                        format!("port {port} is used with different protocols ({list})"),
                    ),
                );
            }
            continue;
        }
        let mut by_host: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for &i in &ids {
            let host = listeners[i]
                .hostname
                .as_deref()
                .unwrap_or("")
                .to_ascii_lowercase();
            by_host.entry(host).or_default().push(i);
        }
        for (host, same) in by_host.into_iter().filter(|(_, v)| v.len() > 1) {
            let names: Vec<&str> = same.iter().map(|&i| listeners[i].name.as_str()).collect();
            let shown = if host.is_empty() {
                "(none)"
            } else {
                host.as_str()
            };
            for &i in &same {
                out.insert(
                    i,
                    Problem::new(
                        reason::HOSTNAME_CONFLICT,
                        format!(
                            "listeners {} share port {port} and hostname {shown}",
                            names.join(", ")
                        ),
                    ),
                );
            }
        }
    }
    out
}

/// Interim result of checks that do not depend on other listeners.
fn validate_listener<'a>(
    gw: &Gateway,
    l: &'a GatewayListeners,
    name: &'a str,
    ns: &'a str,
    from_kind: &str,
    idx: &Index<'_>,
) -> ListenerModel<'a> {
    let protocol = match l.protocol.as_str() {
        "HTTP" => Some(Protocol::Http),
        "HTTPS" => Some(Protocol::Https),
        "TLS" => Some(Protocol::Tls),
        "TCP" => Some(Protocol::Tcp),
        "UDP" => Some(Protocol::Udp),
        _ => None,
    };
    let allowed = l.allowed_routes.as_ref();
    let namespaces = match allowed
        .and_then(|a| a.namespaces.as_ref())
        .and_then(|n| n.from.as_ref().map(|f| (f, n.selector.as_ref())))
    {
        None | Some((GatewayListenersAllowedRoutesNamespacesFrom::Same, _)) => {
            AllowedNamespaces::Same
        }
        Some((GatewayListenersAllowedRoutesNamespacesFrom::All, _)) => AllowedNamespaces::All,
        Some((GatewayListenersAllowedRoutesNamespacesFrom::Selector, sel)) => {
            AllowedNamespaces::Selector(sel)
        }
    };
    let passthrough = protocol == Some(Protocol::Tls)
        && matches!(
            l.tls.as_ref().and_then(|t| t.mode.as_ref()),
            Some(GatewayListenersTlsMode::Passthrough)
        );
    let mut certificates = Vec::new();
    let mut cert_problems = Vec::new();
    if terminates(protocol, passthrough) {
        let needs = format!("{} listener needs tls.certificateRefs", l.protocol);
        match &l.tls {
            None => cert_problems.push(Problem::new(reason::INVALID_CERTIFICATE_REF, needs)),
            Some(tls) => {
                let refs = tls.certificate_refs.as_deref().unwrap_or_default();
                let r = certs::resolve_for(idx, from_kind, ns, refs);
                certificates = r.certificates;
                cert_problems = r.problems;
                if refs.is_empty() {
                    cert_problems.push(Problem::new(reason::INVALID_CERTIFICATE_REF, needs));
                }
            }
        }
    }
    let fe = tls::frontend(gw, l, protocol, idx);
    cert_problems.extend(fe.problems);
    ListenerModel {
        unsupported_tls: tls::listener_problem(gw, l, protocol).or(fe.no_valid_ca),
        client_validation: fe.validation,
        spec: l,
        set: None,
        name,
        namespace: ns,
        reserved: false,
        port: u16::try_from(l.port).ok().filter(|p| *p != 0),
        protocol,
        passthrough,
        hostname: l
            .hostname
            .as_deref()
            .filter(|h| !h.is_empty())
            .map(str::to_ascii_lowercase),
        accepted: false,
        programmed: false,
        allowed_kinds: BTreeSet::new(),
        namespaces,
        certificates,
        cert_problems,
        conditions: Vec::new(),
        supported_kinds: Vec::new(),
        attached: 0,
    }
}

/// Computes the final conditions of a listener.
fn finish_listener(l: &mut ListenerModel<'_>, conflict: Option<&Problem>, conds: &Conds<'_>) {
    let cert_problems = std::mem::take(&mut l.cert_problems);

    // Kinds.
    let mut kind_problems = Vec::new();
    let mut kinds = Vec::new();
    let declared = l
        .spec
        .allowed_routes
        .as_ref()
        .and_then(|a| a.kinds.as_ref());
    match declared {
        Some(list) if !list.is_empty() => {
            for k in list {
                let group = k.group.as_deref().unwrap_or(GATEWAY_GROUP);
                let served = |kind: &RouteKind| {
                    group == GATEWAY_GROUP
                        && l.protocol
                            .is_none_or(|p| RouteKind::for_protocol(p).contains(kind))
                };
                match RouteKind::from_name(&k.kind).filter(served) {
                    Some(kind) if !kinds.contains(&kind) => kinds.push(kind),
                    Some(_) => {}
                    None => kind_problems.push(format!("{group}/{}", k.kind)),
                }
            }
        }
        _ => {
            if let Some(p) = l.protocol {
                kinds.extend(RouteKind::for_protocol(p));
            }
        }
    }
    if l.protocol.is_none() {
        kinds.clear();
    }
    l.allowed_kinds = kinds.iter().copied().collect();
    l.supported_kinds = kinds.into_iter().map(supported_kind).collect();

    // Accepted.
    let tls_mode_problem = match (
        l.protocol,
        l.spec.tls.as_ref().and_then(|t| t.mode.as_ref()),
    ) {
        (Some(Protocol::Https), Some(GatewayListenersTlsMode::Passthrough)) => Some((
            reason::UNSUPPORTED_PROTOCOL,
            "tls.mode Passthrough is not supported for HTTPS (only Terminate)",
        )),
        _ => None,
    };
    let accepted_cond = if let Some(p) = conflict {
        conds.no(ACCEPTED, p.reason, p.message.clone())
    } else if l.protocol.is_none() {
        conds.no(
            ACCEPTED,
            reason::UNSUPPORTED_PROTOCOL,
            format!(
                "protocol {} is not supported (HTTP, HTTPS, TLS, TCP and UDP only)",
                l.spec.protocol
            ),
        )
    } else if let Some((why, m)) = tls_mode_problem {
        conds.no(ACCEPTED, why, m)
    } else if let Some(p) = &l.unsupported_tls {
        conds.no(ACCEPTED, p.reason, p.message.clone())
    } else if l.port.is_none() {
        conds.no(
            ACCEPTED,
            reason::PORT_UNAVAILABLE,
            format!("port {} is out of range", l.spec.port),
        )
    } else if l.reserved {
        conds.no(
            ACCEPTED,
            reason::PORT_UNAVAILABLE,
            format!("port {} is the proxy's admin port", l.spec.port),
        )
    } else {
        conds.yes(ACCEPTED, reason::ACCEPTED, "listener is accepted")
    };
    l.accepted = accepted_cond.status == "True";

    let conflicted_cond = match conflict {
        Some(p) => conds.yes(CONFLICTED, p.reason, p.message.clone()),
        None => conds.no(CONFLICTED, reason::NO_CONFLICTS, "no conflicts"),
    };

    // ResolvedRefs: certificate problems first, then kinds.
    let resolved_cond = if let Some(p) = cert_problems.first() {
        let all: Vec<&str> = cert_problems.iter().map(|p| p.message.as_str()).collect();
        conds.no(RESOLVED_REFS, p.reason, all.join("; "))
    } else if !kind_problems.is_empty() {
        conds.no(
            RESOLVED_REFS,
            reason::INVALID_ROUTE_KINDS,
            format!("unsupported route kinds: {}", kind_problems.join(", ")),
        )
    } else {
        conds.yes(
            RESOLVED_REFS,
            reason::RESOLVED_REFS,
            "all references resolved",
        )
    };

    let has_certs = !terminates(l.protocol, l.passthrough) || !l.certificates.is_empty();
    l.programmed = l.accepted && has_certs && !l.allowed_kinds.is_empty();
    let programmed_cond = if l.programmed {
        conds.yes(PROGRAMMED, reason::PROGRAMMED, "listener is programmed")
    } else if let Some(p) = conflict {
        // The conflict is why, as the ListenerSet conformance tests expect on every kind of
        // listener.
        conds.no(PROGRAMMED, p.reason, p.message.clone())
    } else if !l.accepted {
        conds.no(PROGRAMMED, reason::INVALID, "listener is not accepted")
    } else if !has_certs {
        conds.no(
            PROGRAMMED,
            reason::INVALID,
            "listener has no usable certificate",
        )
    } else {
        conds.no(
            PROGRAMMED,
            reason::INVALID,
            "listener allows no supported route kind",
        )
    };
    if !l.programmed {
        l.certificates.clear();
    }
    l.conditions = vec![
        accepted_cond,
        conflicted_cond,
        programmed_cond,
        resolved_cond,
    ];
}

/// True for listeners that terminate TLS with their own certificates: HTTPS, and TLS unless
/// `tls.mode` is Passthrough (Terminate is the default).
fn terminates(protocol: Option<Protocol>, passthrough: bool) -> bool {
    match protocol {
        Some(Protocol::Https) => true,
        Some(Protocol::Tls) => !passthrough,
        Some(Protocol::Http | Protocol::Tcp | Protocol::Udp) | None => false,
    }
}

fn supported_kind(kind: RouteKind) -> GatewayStatusListenersSupportedKinds {
    GatewayStatusListenersSupportedKinds {
        group: Some(GATEWAY_GROUP.to_owned()),
        kind: kind.as_str().to_owned(),
    }
}
