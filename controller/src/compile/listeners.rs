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

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use gateway_api::gateways::{
    Gateway, GatewayListeners, GatewayListenersAllowedRoutesNamespacesFrom,
    GatewayListenersAllowedRoutesNamespacesSelector, GatewayListenersTlsMode, GatewayStatus,
    GatewayStatusListeners, GatewayStatusListenersSupportedKinds,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use tollgate_api::{Certificate, ObjectKey, Protocol};

use super::conditions::{ACCEPTED, CONFLICTED, Conds, PROGRAMMED, Problem, RESOLVED_REFS, reason};
use super::grants::GATEWAY_GROUP;
use super::index::{Index, key_of, ns_of};
use super::kinds::RouteKind;
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
    /// The listener as written.
    pub spec: &'a GatewayListeners,
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
    /// Listeners in spec order.
    pub listeners: Vec<ListenerModel<'a>>,
    /// Accepted and Programmed.
    pub conditions: Vec<Condition>,
}

impl GatewayModel<'_> {
    /// The status this Gateway should carry (addresses left for the controller).
    pub fn status(&self) -> GatewayStatus {
        GatewayStatus {
            addresses: None,
            attached_listener_sets: None,
            conditions: Some(self.conditions.clone()),
            listeners: Some(
                self.listeners
                    .iter()
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
}

impl ListenerModel<'_> {
    /// Whether routes of `kind` may attach, by allowedRoutes.kinds.
    pub fn allows(&self, kind: RouteKind) -> bool {
        self.allowed_kinds.contains(&kind)
    }

    /// Whether a route in `route_ns` may attach, by namespace.
    pub fn allows_namespace(&self, idx: &Index<'_>, gateway_ns: &str, route_ns: &str) -> bool {
        match &self.namespaces {
            AllowedNamespaces::Same => gateway_ns == route_ns,
            AllowedNamespaces::All => true,
            AllowedNamespaces::Selector(None) => false,
            AllowedNamespaces::Selector(Some(sel)) => {
                selector_matches(sel, &idx.labels_of_namespace(route_ns))
            }
        }
    }
}

/// Label-selector semantics: all matchLabels and all matchExpressions must hold.
fn selector_matches(
    sel: &GatewayListenersAllowedRoutesNamespacesSelector,
    labels: &BTreeMap<String, String>,
) -> bool {
    super::index::labels_match(
        sel.match_labels.iter().flatten(),
        sel.match_expressions
            .iter()
            .flatten()
            .map(|e| (e.key.as_str(), e.operator.as_str(), e.values.as_deref())),
        labels,
    )
}

/// Validates one Gateway of our class.
pub fn compile_gateway<'a>(
    gw: &'a Gateway,
    class_accepted: bool,
    idx: &Index<'_>,
    now: &Time,
) -> GatewayModel<'a> {
    let conds = Conds::new(gw.metadata.generation, now);
    let gw_ns = ns_of(&gw.metadata);
    let mut listeners: Vec<ListenerModel<'a>> = gw
        .spec
        .listeners
        .iter()
        .map(|l| validate_listener(gw, l, gw_ns, idx))
        .collect();
    let conflicts = find_conflicts(&gw.spec.listeners);
    for (i, l) in listeners.iter_mut().enumerate() {
        let conflict = conflicts.get(&i);
        finish_listener(l, conflict, &conds);
    }

    let (address, gateway_problem) = gateway_level_problems(gw, class_accepted);
    let valid = listeners.iter().filter(|l| l.accepted).count();
    let accepted_cond = if let Some(p) = &gateway_problem {
        conds.no(ACCEPTED, p.reason, p.message.clone())
    } else if valid == 0 {
        conds.no(
            ACCEPTED,
            reason::LISTENERS_NOT_VALID,
            "no listener is valid",
        )
    } else if valid < listeners.len() {
        conds.yes(
            ACCEPTED,
            reason::LISTENERS_NOT_VALID,
            format!(
                "{} of {} listeners are not valid",
                listeners.len() - valid,
                listeners.len()
            ),
        )
    } else {
        conds.yes(ACCEPTED, reason::ACCEPTED, "Gateway is accepted")
    };
    let accepted = accepted_cond.status == "True";
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
    }
}

/// Problems that reject the whole Gateway; also picks the bind address.
fn gateway_level_problems(gw: &Gateway, class_accepted: bool) -> (String, Option<Problem>) {
    if !class_accepted {
        let p = Problem::new(
            reason::INVALID_PARAMETERS,
            format!(
                "GatewayClass {} is not accepted",
                gw.spec.gateway_class_name
            ),
        );
        return (DEFAULT_ADDRESS.to_owned(), Some(p));
    }
    if let Some(p) = gw
        .spec
        .infrastructure
        .as_ref()
        .and_then(|i| i.parameters_ref.as_ref())
    {
        let p = Problem::new(
            reason::INVALID_PARAMETERS,
            format!(
                "spec.infrastructure.parametersRef ({}/{} {}) is not supported",
                p.group, p.kind, p.name
            ),
        );
        return (DEFAULT_ADDRESS.to_owned(), Some(p));
    }
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
    gw_ns: &str,
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
                let r = certs::resolve(idx, gw_ns, refs);
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
