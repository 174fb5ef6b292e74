//! Backend resolution: backendRefs to Services and their endpoints.
//!
//! In: a backendRef (or a RequestMirror's backendRef) and the namespace of the HTTPRoute that
//! holds it; Services, EndpointSlices and ReferenceGrants through the [`Index`]. Out: the
//! [`BackendKey`] of a resolved [`Backend`] (cached: many routes share one Service port), or
//! the [`Problem`] that makes the route's `ResolvedRefs` False.
//!
//! Endpoints: EndpointSlices labelled `kubernetes.io/service-name` in the Service's namespace;
//! the Service port (chosen by number) maps to the slice port with the same name (unnamed =
//! `""`), whose number is used. Ready endpoints (`ready` unset counts as ready) are used; when
//! none is ready, the serving-and-terminating ones are, so a rollout's last pods still answer.
//!
//! `ExternalName` Services are refused with `BackendNotFound`: they have no EndpointSlices, and
//! resolving DNS would put I/O in the compiler. Service ports with an `appProtocol` we cannot
//! speak get `UnsupportedProtocol`.
//!
//! A GRPCRoute's backends are always spoken to over HTTP/2 with prior knowledge (h2c), under
//! their own key ([`BackendKey::h2c`]), so an HTTPRoute to the same Service port keeps the
//! protocol its `appProtocol` names. For a GRPCRoute the port's `appProtocol` may be unset,
//! `http`, `grpc` or `kubernetes.io/h2c`; anything else (WebSocket, TLS) is
//! `UnsupportedProtocol`. A Service port a BackendTLSPolicy targets is spoken to over TLS
//! (module [`super::backend_tls`]); `appProtocol: https` is accepted only there. A TLSRoute's backends have their own key too ([`BackendKey::tcp`]):
//! passthrough copies bytes, so any `appProtocol` is accepted.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Service, ServicePort};
use tollgate_api::{Backend, BackendKey, BackendProtocol, BackendTls, Endpoint, LoadBalancer};

use super::backend_tls;

use super::conditions::{Problem, reason};
use super::grants::{CrossRef, GATEWAY_GROUP, permitted};
use super::index::{Index, LookupMap, ns_of};
use super::kinds::RouteKind;

/// Service annotation choosing the balancing algorithm.
pub const LOAD_BALANCER_ANNOTATION: &str = "tollgate.dev/load-balancer";

/// The fields every backendRef flavour shares.
#[derive(Debug, Clone, Copy)]
pub struct RefSpec<'s> {
    /// API group (`None`/`""` = core).
    pub group: Option<&'s str>,
    /// Kind (`None` = Service).
    pub kind: Option<&'s str>,
    /// Name.
    pub name: &'s str,
    /// Namespace (`None` = the route's).
    pub namespace: Option<&'s str>,
    /// Port.
    pub port: Option<i32>,
}

/// Resolves backendRefs, caching backends by key.
#[derive(Debug)]
pub struct Resolver<'i, 'a> {
    idx: &'i Index<'a>,
    /// Every backend resolved so far, by [`BackendKey`] (looked up once per reused route:
    /// hashed).
    pub backends: LookupMap<String, Backend>,
    /// Successful resolutions since [`Resolver::record`], when recording.
    recorded: Option<Vec<Resolution>>,
}

/// One successful resolution: what [`Resolver::replay`] needs to put the same backend in
/// [`Resolver::backends`] without the backendRef.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    key: String,
    namespace: String,
    name: String,
    port: i32,
    kind: RouteKind,
}

impl<'i, 'a> Resolver<'i, 'a> {
    /// A resolver over `idx`.
    pub fn new(idx: &'i Index<'a>) -> Self {
        Self {
            idx,
            backends: LookupMap::default(),
            recorded: None,
        }
    }

    /// Starts recording successful resolutions (dropping any recorded before).
    pub fn record(&mut self) {
        self.recorded = Some(Vec::new());
    }

    /// The resolutions recorded since [`Resolver::record`]; stops recording.
    pub fn take_recorded(&mut self) -> Vec<Resolution> {
        self.recorded.take().unwrap_or_default()
    }

    /// Resolves again what `done` records, against the current Services and EndpointSlices:
    /// [`Resolver::backends`] ends as if the backendRefs behind `done` had been resolved.
    /// Only valid when the Services and ReferenceGrants are those `done` was recorded with
    /// (then every entry resolves as it did).
    pub fn replay(&mut self, done: &[Resolution]) {
        for r in done {
            if self.backends.contains_key(&r.key) {
                continue;
            }
            let Some(svc) = self
                .idx
                .services
                .get(&(r.namespace.as_str(), r.name.as_str()))
            else {
                continue;
            };
            if let Ok(backend) = self.build(svc, r.port, r.kind) {
                self.backends.insert(r.key.clone(), backend);
            }
        }
    }

    fn note(&mut self, key: &str, ns: &str, name: &str, port: i32, kind: RouteKind) {
        if let Some(rec) = &mut self.recorded {
            rec.push(Resolution {
                key: key.to_owned(),
                namespace: ns.to_owned(),
                name: name.to_owned(),
                port,
                kind,
            });
        }
    }

    /// Resolves `r`, held by a route of `route_kind` in `route_ns`, to a backend key.
    pub fn resolve(
        &mut self,
        route_ns: &str,
        route_kind: RouteKind,
        r: &RefSpec<'_>,
    ) -> Result<String, Problem> {
        let group = r.group.unwrap_or("");
        let kind = r.kind.unwrap_or("Service");
        let ns = r.namespace.unwrap_or(route_ns);
        let name = r.name;
        if !(group.is_empty() || group == "core") || kind != "Service" {
            return Err(Problem::new(
                reason::INVALID_KIND,
                format!(
                    "backendRef {ns}/{name}: kind {group}/{kind} is not supported (core Service only)"
                ),
            ));
        }
        let cross = CrossRef {
            from_group: GATEWAY_GROUP,
            from_kind: route_kind.as_str(),
            from_namespace: route_ns,
            to_group: "",
            to_kind: "Service",
            to_namespace: ns,
            to_name: name,
        };
        if !permitted(self.idx, &cross) {
            return Err(Problem::new(
                reason::REF_NOT_PERMITTED,
                format!(
                    "backendRef to Service {ns}/{name} is not permitted by any ReferenceGrant in {ns}"
                ),
            ));
        }
        let Some(port) = r.port else {
            return Err(Problem::new(
                reason::BACKEND_NOT_FOUND,
                format!("backendRef to Service {ns}/{name} needs a port"),
            ));
        };
        let port16 = u16::try_from(port).map_err(|_| {
            Problem::new(
                reason::BACKEND_NOT_FOUND,
                format!("backendRef to Service {ns}/{name}: port {port} is out of range"),
            )
        })?;
        let key = match route_kind {
            RouteKind::Http => BackendKey::of(ns, name, port16),
            RouteKind::Grpc => BackendKey::h2c(ns, name, port16),
            RouteKind::Tls | RouteKind::Tcp => BackendKey::tcp(ns, name, port16),
            RouteKind::Udp => BackendKey::udp(ns, name, port16),
        };
        if self.backends.contains_key(&key) {
            self.note(&key, ns, name, port, route_kind);
            return Ok(key);
        }
        let Some(svc) = self.idx.services.get(&(ns, name)) else {
            return Err(Problem::new(
                reason::BACKEND_NOT_FOUND,
                format!("Service {ns}/{name} not found"),
            ));
        };
        let backend = self.build(svc, port, route_kind)?;
        self.backends.insert(key.clone(), backend);
        self.note(&key, ns, name, port, route_kind);
        Ok(key)
    }

    fn build(&self, svc: &Service, port: i32, kind: RouteKind) -> Result<Backend, Problem> {
        let ns = ns_of(&svc.metadata);
        let name = svc.metadata.name.as_deref().unwrap_or_default();
        let spec = svc.spec.as_ref();
        if spec.and_then(|s| s.type_.as_deref()) == Some("ExternalName") {
            return Err(Problem::new(
                reason::BACKEND_NOT_FOUND,
                format!("Service {ns}/{name} is of type ExternalName, which is not supported"),
            ));
        }
        // UDPRoutes take the Service's UDP port of that number, every other kind its TCP one
        // (a Service may have both, e.g. DNS on 53).
        let want = if kind == RouteKind::Udp { "UDP" } else { "TCP" };
        let l4 = |p: &ServicePort| p.protocol.clone().unwrap_or_else(|| "TCP".to_owned());
        let same_port: Vec<&ServicePort> = spec
            .and_then(|s| s.ports.as_ref())
            .into_iter()
            .flatten()
            .filter(|p| p.port == port)
            .collect();
        let Some(sp) = same_port.iter().copied().find(|p| l4(p) == want) else {
            return Err(match same_port.first() {
                Some(other) => Problem::new(
                    reason::UNSUPPORTED_PROTOCOL_BACKEND,
                    format!(
                        "Service {ns}/{name} port {port} is {}, not {want}",
                        l4(other)
                    ),
                ),
                None => Problem::new(
                    reason::BACKEND_NOT_FOUND,
                    format!("Service {ns}/{name} has no port {port}"),
                ),
            });
        };
        let tls = self.backend_tls(ns, name, port, sp, kind)?;
        let protocol = backend_protocol(sp, kind, tls.is_some()).ok_or_else(|| {
            Problem::new(
                reason::UNSUPPORTED_PROTOCOL_BACKEND,
                format!(
                    "Service {ns}/{name} port {port}: appProtocol {} is not supported",
                    sp.app_protocol.as_deref().unwrap_or_default()
                ),
            )
        })?;
        let load_balancer = match svc
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(LOAD_BALANCER_ANNOTATION))
            .map(String::as_str)
        {
            Some("round-robin") => LoadBalancer::RoundRobin,
            _ => LoadBalancer::LeastRequest,
        };
        let tls = tls.map(|mut t| {
            t.alpn =
                backend_tls::alpn(protocol == BackendProtocol::H2c, sp.app_protocol.as_deref());
            t
        });
        Ok(Backend {
            tls,
            protocol,
            load_balancer,
            endpoints: self.endpoints(ns, name, sp),
            settings: tollgate_api::BackendSettings::default(),
        })
    }

    /// The TLS settings of a Service port a BackendTLSPolicy targets (HTTPRoutes and
    /// GRPCRoutes only: a TLSRoute's or TCPRoute's stream is never encrypted here); the problem that leaves
    /// the ref unresolved when the policy is not valid (fail closed).
    fn backend_tls(
        &self,
        ns: &str,
        name: &str,
        port: i32,
        sp: &ServicePort,
        kind: RouteKind,
    ) -> Result<Option<BackendTls>, Problem> {
        if kind.is_stream() {
            return Ok(None);
        }
        let Some(target) = self.idx.backend_tls.for_port(ns, name, sp.name.as_deref()) else {
            return Ok(None);
        };
        match &target.outcome {
            Ok(settings) => Ok(Some(settings.clone())),
            Err(p) => Err(Problem::new(
                backend_tls::INVALID_BACKEND_TLS_POLICY,
                format!(
                    "Service {ns}/{name} port {port}: BackendTLSPolicy {} is not valid ({}); requests are answered 500 rather than sent without the TLS it asks for",
                    target.policy, p.message
                ),
            )),
        }
    }

    /// Endpoints of a Service port, filtered and sorted.
    fn endpoints(&self, ns: &str, svc: &str, sp: &ServicePort) -> Vec<Endpoint> {
        let port_name = sp.name.as_deref().unwrap_or("");
        let mut ready = BTreeSet::new();
        let mut fallback = BTreeSet::new();
        for slice in self.idx.slices.get(&(ns, svc)).into_iter().flatten() {
            if slice.address_type == "FQDN" {
                continue;
            }
            let Some(slice_port) = slice
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref().unwrap_or("") == port_name)
                .and_then(|p| p.port)
                .and_then(|p| u16::try_from(p).ok())
            else {
                continue;
            };
            for ep in &slice.endpoints {
                let c = ep.conditions.as_ref();
                let is_ready = c.and_then(|c| c.ready) != Some(false);
                let serving_terminating =
                    c.is_some_and(|c| c.serving == Some(true) && c.terminating == Some(true));
                for ip in &ep.addresses {
                    let e = Endpoint {
                        ip: ip.clone(),
                        port: slice_port,
                    };
                    if is_ready {
                        ready.insert(e);
                    } else if serving_terminating {
                        fallback.insert(e);
                    }
                }
            }
        }
        if ready.is_empty() {
            fallback.into_iter().collect()
        } else {
            ready.into_iter().collect()
        }
    }
}

/// Protocol for a Service port's appProtocol as a route of `kind` uses it; `None` when we
/// cannot speak it. `https` (the IANA name) means HTTP over TLS: usable only when a
/// BackendTLSPolicy says how (`tls`), never in plaintext.
fn backend_protocol(sp: &ServicePort, kind: RouteKind, tls: bool) -> Option<BackendProtocol> {
    match (kind, sp.app_protocol.as_deref()) {
        // Streams and datagrams are copied: whatever the port speaks is the client's business.
        (RouteKind::Tls | RouteKind::Tcp, _) => Some(BackendProtocol::Tcp),
        (RouteKind::Udp, _) => Some(BackendProtocol::Udp),
        (RouteKind::Http, Some("https" | "HTTPS")) if tls => Some(BackendProtocol::Http1),
        (RouteKind::Grpc, Some("https" | "HTTPS")) if tls => Some(BackendProtocol::H2c),
        (
            RouteKind::Http,
            None | Some("" | "http" | "HTTP" | "kubernetes.io/ws" | "kubernetes.io/wss"),
        ) => Some(BackendProtocol::Http1),
        (RouteKind::Grpc, None | Some("" | "http" | "HTTP" | "grpc"))
        | (_, Some("kubernetes.io/h2c")) => Some(BackendProtocol::H2c),
        (_, Some(_)) => None,
    }
}
