//! Route kinds: what HTTPRoute, GRPCRoute, TLSRoute, TCPRoute and UDPRoute share, so attachment,
//! status and rejections are written once.
//!
//! In: an HTTPRoute, a GRPCRoute, a TLSRoute, a TCPRoute or a UDPRoute. Out: a [`RouteSource`] giving attachment what it reads
//! (kind, metadata, hostnames, parentRefs) and the compiled rules; and [`RouteParent`], the
//! accessors of a `status.parents[]` entry that both generated status types share, so the
//! status writer, `validate` and the rejection list handle both kinds with one body.
//!
//! The compiler keeps parentRefs and parent statuses in the HTTPRoute types internally (the
//! generated GRPCRoute, TLSRoute, TCPRoute and UDPRoute types have the same fields under other names) and converts
//! theirs at the edges: parentRefs on the way in, statuses on the way out.

use std::borrow::Cow;

use gateway_types::experimental::httproutes::{
    HttpRoute, HttpRouteParentRefs, HttpRouteStatusParents, HttpRouteStatusParentsParentRef,
};
use gateway_types::grpcroutes::{
    GrpcRoute, GrpcRouteStatusParents, GrpcRouteStatusParentsParentRef,
};
use gateway_types::tcproutes::{TcpRoute, TcpRouteStatusParents, TcpRouteStatusParentsParentRef};
use gateway_types::tlsroutes::{TlsRoute, TlsRouteStatusParents, TlsRouteStatusParentsParentRef};
use gateway_types::udproutes::{UdpRoute, UdpRouteStatusParents, UdpRouteStatusParentsParentRef};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use tollgate_api::Protocol;

use super::backends::Resolver;
use super::rules::{CompiledRoute, compile_route};

/// Builds a parentRef-shaped generated type from another (they share these six fields).
macro_rules! parent_ref_as {
    ($t:ident, $p:expr) => {{
        let p = $p;
        $t {
            group: p.group.clone(),
            kind: p.kind.clone(),
            name: p.name.clone(),
            namespace: p.namespace.clone(),
            port: p.port,
            section_name: p.section_name.clone(),
        }
    }};
}

/// The route kinds we serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RouteKind {
    /// gateway.networking.k8s.io HTTPRoute.
    Http,
    /// gateway.networking.k8s.io GRPCRoute: backends always spoken to over h2c.
    Grpc,
    /// gateway.networking.k8s.io TLSRoute: TLS streams routed on SNI, passed through or
    /// terminated, bytes copied.
    Tls,
    /// gateway.networking.k8s.io TCPRoute: byte streams, copied.
    Tcp,
    /// gateway.networking.k8s.io UDPRoute: datagrams, forwarded per client flow.
    Udp,
}

impl RouteKind {
    /// Every kind, in the order listeners advertise them in `supportedKinds`.
    pub const ALL: [RouteKind; 5] = [
        RouteKind::Http,
        RouteKind::Grpc,
        RouteKind::Tls,
        RouteKind::Tcp,
        RouteKind::Udp,
    ];

    /// The kinds a listener of `protocol` serves, in `supportedKinds` order: HTTPRoute and
    /// GRPCRoute on HTTP and HTTPS, TLSRoute on TLS, TCPRoute on TCP, UDPRoute on UDP.
    pub fn for_protocol(protocol: Protocol) -> &'static [RouteKind] {
        match protocol {
            Protocol::Http | Protocol::Https => &[RouteKind::Http, RouteKind::Grpc],
            Protocol::Tls => &[RouteKind::Tls],
            Protocol::Tcp => &[RouteKind::Tcp],
            Protocol::Udp => &[RouteKind::Udp],
        }
    }

    /// Whether its routes carry byte streams or datagrams (TLSRoute, TCPRoute, UDPRoute), not
    /// requests: no policy, filter or matcher applies, and backends are only connected to.
    pub fn is_stream(self) -> bool {
        matches!(self, Self::Tls | Self::Tcp | Self::Udp)
    }

    /// The Kubernetes kind name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http => "HTTPRoute",
            Self::Grpc => "GRPCRoute",
            Self::Tls => "TLSRoute",
            Self::Tcp => "TCPRoute",
            Self::Udp => "UDPRoute",
        }
    }

    /// The kind named `name` (gateway.networking.k8s.io group), if we serve it.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

impl std::fmt::Display for RouteKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A route of either kind, as attachment reads it.
#[derive(Debug, Clone, Copy)]
pub enum RouteSource<'a> {
    /// An HTTPRoute.
    Http(&'a HttpRoute),
    /// A GRPCRoute.
    Grpc(&'a GrpcRoute),
    /// A TLSRoute.
    Tls(&'a TlsRoute),
    /// A TCPRoute.
    Tcp(&'a TcpRoute),
    /// A UDPRoute.
    Udp(&'a UdpRoute),
}

impl<'a> RouteSource<'a> {
    /// Its kind.
    pub fn kind(self) -> RouteKind {
        match self {
            Self::Http(_) => RouteKind::Http,
            Self::Grpc(_) => RouteKind::Grpc,
            Self::Tls(_) => RouteKind::Tls,
            Self::Tcp(_) => RouteKind::Tcp,
            Self::Udp(_) => RouteKind::Udp,
        }
    }

    /// Its metadata.
    pub fn meta(self) -> &'a ObjectMeta {
        match self {
            Self::Http(r) => &r.metadata,
            Self::Grpc(r) => &r.metadata,
            Self::Tls(r) => &r.metadata,
            Self::Tcp(r) => &r.metadata,
            Self::Udp(r) => &r.metadata,
        }
    }

    /// `spec.hostnames`.
    pub fn hostnames(self) -> &'a [String] {
        match self {
            Self::Http(r) => r.spec.hostnames.as_deref().unwrap_or_default(),
            Self::Grpc(r) => r.spec.hostnames.as_deref().unwrap_or_default(),
            Self::Tls(r) => &r.spec.hostnames,
            // TCPRoutes and UDPRoutes have no hostnames: they take all of their listener.
            Self::Tcp(_) | Self::Udp(_) => &[],
        }
    }

    /// `spec.parentRefs`, other kinds' converted to the HTTPRoute type (same fields).
    pub fn parent_refs(self) -> Cow<'a, [HttpRouteParentRefs]> {
        match self {
            Self::Http(r) => Cow::Borrowed(r.spec.parent_refs.as_deref().unwrap_or_default()),
            Self::Grpc(r) => Cow::Owned(
                r.spec
                    .parent_refs
                    .iter()
                    .flatten()
                    .map(|p| parent_ref_as!(HttpRouteParentRefs, p))
                    .collect(),
            ),
            Self::Tls(r) => Cow::Owned(
                r.spec
                    .parent_refs
                    .iter()
                    .flatten()
                    .map(|p| parent_ref_as!(HttpRouteParentRefs, p))
                    .collect(),
            ),
            Self::Tcp(r) => Cow::Owned(
                r.spec
                    .parent_refs
                    .iter()
                    .flatten()
                    .map(|p| parent_ref_as!(HttpRouteParentRefs, p))
                    .collect(),
            ),
            Self::Udp(r) => Cow::Owned(
                r.spec
                    .parent_refs
                    .iter()
                    .flatten()
                    .map(|p| parent_ref_as!(HttpRouteParentRefs, p))
                    .collect(),
            ),
        }
    }

    /// Compiles its rules.
    pub fn compile(self, resolver: &mut Resolver<'_, '_>) -> CompiledRoute {
        match self {
            Self::Http(r) => compile_route(r, resolver),
            Self::Grpc(r) => super::grpc::compile_grpc_route(r, resolver),
            Self::Tls(r) => super::tlsroute::compile_tls_route(r, resolver),
            Self::Tcp(r) => super::tlsroute::compile_tcp_route(r, resolver),
            Self::Udp(r) => super::tlsroute::compile_udp_route(r, resolver),
        }
    }
}

/// A GRPCRoute `status.parents[]` entry from the compiler's (HTTPRoute-typed) one.
pub fn grpc_parent(p: HttpRouteStatusParents) -> GrpcRouteStatusParents {
    GrpcRouteStatusParents {
        parent_ref: parent_ref_as!(GrpcRouteStatusParentsParentRef, &p.parent_ref),
        conditions: p.conditions,
        controller_name: p.controller_name,
    }
}

/// A TLSRoute `status.parents[]` entry from the compiler's (HTTPRoute-typed) one.
pub fn tls_parent(p: HttpRouteStatusParents) -> TlsRouteStatusParents {
    TlsRouteStatusParents {
        parent_ref: parent_ref_as!(TlsRouteStatusParentsParentRef, &p.parent_ref),
        conditions: p.conditions,
        controller_name: p.controller_name,
    }
}

/// A TCPRoute `status.parents[]` entry from the compiler's (HTTPRoute-typed) one.
pub fn tcp_parent(p: HttpRouteStatusParents) -> TcpRouteStatusParents {
    TcpRouteStatusParents {
        parent_ref: parent_ref_as!(TcpRouteStatusParentsParentRef, &p.parent_ref),
        conditions: p.conditions,
        controller_name: p.controller_name,
    }
}

/// A UDPRoute `status.parents[]` entry from the compiler's (HTTPRoute-typed) one.
pub fn udp_parent(p: HttpRouteStatusParents) -> UdpRouteStatusParents {
    UdpRouteStatusParents {
        parent_ref: parent_ref_as!(UdpRouteStatusParentsParentRef, &p.parent_ref),
        conditions: p.conditions,
        controller_name: p.controller_name,
    }
}

/// A `status.parents[]` entry of any route kind.
pub trait RouteParent: Clone + PartialEq + serde::Serialize {
    /// `controllerName`.
    fn controller_name(&self) -> &str;
    /// Sets `controllerName`.
    fn set_controller_name(&mut self, name: &str);
    /// `conditions`.
    fn conditions(&self) -> &[Condition];
    /// `conditions`, mutable.
    fn conditions_mut(&mut self) -> &mut Vec<Condition>;
    /// `parentRef` as (namespace, name, sectionName, port).
    fn parent(&self) -> (Option<&str>, &str, Option<&str>, Option<i32>);
    /// `parentRef.kind`: `Gateway` unless it names another kind (a ListenerSet).
    fn parent_kind(&self) -> &str;
    /// Whether both entries are for the same parentRef (typed equality).
    fn same_parent(&self, other: &Self) -> bool;
    /// `parentRef` alone, for comparing in serialized form.
    fn parent_ref_json(&self) -> serde_json::Value;
}

/// Implements [`RouteParent`] for a generated status type (the types differ only in name).
macro_rules! route_parent {
    ($t:ty) => {
        impl RouteParent for $t {
            fn controller_name(&self) -> &str {
                &self.controller_name
            }
            fn set_controller_name(&mut self, name: &str) {
                name.clone_into(&mut self.controller_name);
            }
            fn conditions(&self) -> &[Condition] {
                &self.conditions
            }
            fn conditions_mut(&mut self) -> &mut Vec<Condition> {
                &mut self.conditions
            }
            fn parent(&self) -> (Option<&str>, &str, Option<&str>, Option<i32>) {
                let r = &self.parent_ref;
                (
                    r.namespace.as_deref(),
                    &r.name,
                    r.section_name.as_deref(),
                    r.port,
                )
            }
            fn parent_kind(&self) -> &str {
                self.parent_ref.kind.as_deref().unwrap_or("Gateway")
            }
            fn same_parent(&self, other: &Self) -> bool {
                self.parent_ref == other.parent_ref
            }
            fn parent_ref_json(&self) -> serde_json::Value {
                serde_json::to_value(&self.parent_ref).unwrap_or_default()
            }
        }
    };
}

route_parent!(HttpRouteStatusParents);
route_parent!(GrpcRouteStatusParents);
route_parent!(TlsRouteStatusParents);
route_parent!(TcpRouteStatusParents);
route_parent!(UdpRouteStatusParents);

/// The parentRef of a status entry, built from a (HTTPRoute-typed) parentRef.
pub fn status_parent_ref(p: &HttpRouteParentRefs) -> HttpRouteStatusParentsParentRef {
    parent_ref_as!(HttpRouteStatusParentsParentRef, p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_their_names() {
        for k in RouteKind::ALL {
            assert_eq!(RouteKind::from_name(k.as_str()), Some(k));
        }
        assert_eq!(RouteKind::from_name("SCTPRoute"), None);
    }
}
