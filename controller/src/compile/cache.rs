//! What one compile can hand the next, so that a compile after a small change costs about that
//! change.
//!
//! In: the [`CompileCache`] the previous [`compile_cached`](super::compile_cached) returned
//! (or an empty one). Out: the cache for the next compile. The cache never changes a result:
//! `compile_cached(inputs, any cache).0 == compile(inputs)`; it only lets work be skipped
//! where its inputs are provably the same. Two memos:
//!
//! - **Per route** (kind, key): the route object as it was compiled, its compiled rules, and
//!   the backends its backendRefs resolved to. Reused when the route is that object (the same
//!   resourceVersion, or equal field by field when either has none)
//!   and the Services, ReferenceGrants and BackendTLSPolicy verdicts (all that rule
//!   compilation reads besides the route) are equal to the previous compile's; its backends are then resolved again against the
//!   current EndpointSlices, which may have changed. Every compile that is not reused gets a
//!   new *stamp*, so a stamp names one compiled result of one route object.
//!   With the route memo, how the route attached: its status entries, the listeners it is
//!   served on and counts on. Reused with the memo when the Gateways look the same to route
//!   attachment as in the previous compile (a [`ListenerView`]: Gateway keys, listeners,
//!   namespace labels when selected by), its conditions stamped with the current time.
//! - **Per virtual host** (Gateway, listener, hostname): the stamps of the routes in it, in
//!   order, and the route list built from them. A virtual host's routes are a function of
//!   those compiled routes alone when no policy applies, so the list is reused (the same
//!   [`Arc`], which lets the proxy keep what it built from it) when the stamps are the same.
//!   With any policy in force nothing is reused: policy keys depend on the whole table.
//!
//! Besides the memos, an output handed back with [`CompileCache::recycle`]: the next compile
//! writes the status entries of reused HTTPRoutes into that output's, instead of allocating
//! them anew.

use std::collections::BTreeMap;
use std::sync::Arc;

use gateway_types::experimental::httproutes::{HttpRoute, HttpRouteStatus};
use gateway_types::grpcroutes::GrpcRoute;
use gateway_types::referencegrants::ReferenceGrant;
use gateway_types::tcproutes::TcpRoute;
use gateway_types::tlsroutes::TlsRoute;
use gateway_types::udproutes::UdpRoute;
use k8s_openapi::api::core::v1::Service;
use tollgate_api::{ObjectKey, Route};

use super::Output;
use super::backends::{Resolution, Resolver};
use super::index::Index;
use super::kinds::{RouteKind, RouteSource};
use super::routes::{Attached, ListenerView};
use super::rules::CompiledRoute;

/// Memos carried from one compile to the next (see the module docs). Opaque; start with
/// `CompileCache::default()`.
#[derive(Debug, Default)]
pub struct CompileCache {
    /// Services and ReferenceGrants of the last compile, sorted by key.
    services: Vec<Service>,
    grants: Vec<ReferenceGrant>,
    /// What BackendTLSPolicies applied to each Service port in the last compile: a backendRef
    /// resolves (or not) by it, so rules compiled under another verdict are not reused.
    backend_tls: BTreeMap<super::backend_tls::TargetKey, super::backend_tls::Target>,
    /// Route memos per kind ([`RouteKind`] as index), sorted by key: the routes of one kind
    /// are compiled in key order, so a compile walks the previous memos alongside (no lookup).
    routes: [Vec<(ObjectKey, RouteMemo)>; RouteKind::ALL.len()],
    /// During a compile: the previous compile's route memos not yet walked past.
    prev: [std::vec::IntoIter<(ObjectKey, RouteMemo)>; RouteKind::ALL.len()],
    /// Virtual-host memos by (Gateway, listener, hostname).
    vhosts: BTreeMap<(ObjectKey, String, String), VhostMemo>,
    /// The last stamp handed out.
    stamp: u64,
    /// Number of compiles that used this cache; a memo not used by the current one is dropped.
    epoch: u64,
    /// Whether the route memos may be reused in the current compile.
    env_same: bool,
    /// The Gateways as route attachment saw them in the last compile.
    listeners: ListenerView,
    /// Whether the current compile's view is that one: attachments may be reused.
    listeners_same: bool,
    /// HTTPRoute statuses of an output handed back ([`CompileCache::recycle`]) not yet walked
    /// past, sorted by key: a reused route's status entries are copied into its old entries'
    /// allocations.
    recycled: std::vec::IntoIter<(ObjectKey, HttpRouteStatus)>,
    /// Route memos reused and compiled in the current compile (for tests and logs).
    stats: CacheStats,
}

/// How much one compile took from its cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Routes whose compiled rules were reused.
    pub routes_reused: usize,
    /// Routes compiled.
    pub routes_compiled: usize,
    /// Reused routes whose attachment and status entries were reused too.
    pub attachments_reused: usize,
    /// Virtual hosts whose route list was reused.
    pub vhosts_reused: usize,
    /// Virtual hosts built.
    pub vhosts_built: usize,
    /// Reused routes whose status entries were written into those of a recycled output.
    pub statuses_recycled: usize,
}

#[derive(Debug)]
struct RouteMemo {
    source: SourceCopy,
    compiled: Arc<CompiledRoute>,
    resolved: Vec<Resolution>,
    stamp: u64,
    /// How the route attached, under the last compile's [`ListenerView`].
    attached: Option<Attached>,
}

#[derive(Debug)]
struct VhostMemo {
    stamps: Vec<u64>,
    routes: Arc<Vec<Route>>,
    epoch: u64,
}

/// What a memo knows of the route object it was compiled from: its resourceVersion when it has
/// one, else a copy of the whole object.
///
/// A resourceVersion names one object, metadata included (the API server gives every write a
/// new one, and [`ManifestDir`](crate::manifests::ManifestDir) sets one from the content of
/// the object it read), so an equal version means an equal object, as a comparison of the
/// whole would find; a virtual host's memo relies on that, since its route order reads
/// `creationTimestamp`. Keeping the version alone keeps one copy of each route in memory (the
/// watch store's, or the manifest directory's) instead of two. Objects without a version
/// (built in code, or read by [`inputs_from_yaml`](super::inputs_from_yaml) directly) are
/// copied and compared field by field. Boxed: memos move from one compile's list to the next,
/// and a route object inline is over a kilobyte.
#[derive(Debug)]
enum SourceCopy {
    Version(Box<str>),
    Http(Box<HttpRoute>),
    Grpc(Box<GrpcRoute>),
    Tls(Box<TlsRoute>),
    Tcp(Box<TcpRoute>),
    Udp(Box<UdpRoute>),
}

impl SourceCopy {
    fn of(r: RouteSource<'_>) -> Self {
        if let Some(v) = r.meta().resource_version.as_deref() {
            return Self::Version(v.into());
        }
        match r {
            RouteSource::Http(r) => Self::Http(Box::new(r.clone())),
            RouteSource::Grpc(r) => Self::Grpc(Box::new(r.clone())),
            RouteSource::Tls(r) => Self::Tls(Box::new(r.clone())),
            RouteSource::Tcp(r) => Self::Tcp(Box::new(r.clone())),
            RouteSource::Udp(r) => Self::Udp(Box::new(r.clone())),
        }
    }

    /// Whether `r` is the object the memo was compiled from: the same resourceVersion, or,
    /// for an object kept whole, equal field by field. An object that gained or lost its
    /// version is not taken for the same.
    fn is(&self, r: RouteSource<'_>) -> bool {
        let version = r.meta().resource_version.as_deref();
        match (self, r) {
            (Self::Version(a), _) => version == Some(&**a),
            (_, _) if version.is_some() => false,
            (Self::Http(a), RouteSource::Http(b)) => **a == *b,
            (Self::Grpc(a), RouteSource::Grpc(b)) => **a == *b,
            (Self::Tls(a), RouteSource::Tls(b)) => **a == *b,
            (Self::Tcp(a), RouteSource::Tcp(b)) => **a == *b,
            (Self::Udp(a), RouteSource::Udp(b)) => **a == *b,
            _ => false,
        }
    }
}

fn slot(kind: RouteKind) -> usize {
    match kind {
        RouteKind::Http => 0,
        RouteKind::Grpc => 1,
        RouteKind::Tls => 2,
        RouteKind::Tcp => 3,
        RouteKind::Udp => 4,
    }
}

impl CompileCache {
    /// What the last compile that used this cache took from it.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Hands back the output of the compile that returned this cache, once read: the next
    /// compile writes the status entries of the HTTPRoutes it reuses into the allocations of
    /// their entries in `out` instead of allocating them anew (10k routes: ~15 strings each),
    /// and `out` is not freed. Optional; the next output is the same either way.
    pub fn recycle(&mut self, out: Output) {
        self.recycled = out.http_routes.into_iter().collect::<Vec<_>>().into_iter();
    }

    /// Starts a compile over `idx`: decides whether route memos are still valid.
    pub(crate) fn begin(&mut self, idx: &Index<'_>) {
        self.epoch += 1;
        self.stats = CacheStats::default();
        let services_same = self.services.len() == idx.services.len()
            && self
                .services
                .iter()
                .zip(idx.services.values())
                .all(|(a, b)| a == *b);
        let grants: Vec<&ReferenceGrant> = idx.grants.values().flatten().copied().collect();
        let grants_same = self.grants.len() == grants.len()
            && self.grants.iter().zip(&grants).all(|(a, b)| a == *b);
        let backend_tls_same = self.backend_tls == idx.backend_tls.by_target;
        self.env_same = services_same && grants_same && backend_tls_same;
        if !backend_tls_same {
            self.backend_tls.clone_from(&idx.backend_tls.by_target);
        }
        if !services_same {
            self.services = idx.services.values().map(|s| (*s).clone()).collect();
        }
        if !grants_same {
            self.grants = grants.into_iter().cloned().collect();
        }
        for (prev, memos) in self.prev.iter_mut().zip(&mut self.routes) {
            *prev = std::mem::take(memos).into_iter();
            // About as many routes as last time: one allocation, not a doubling series.
            memos.reserve(prev.len() + prev.len() / 8);
        }
    }

    /// Takes the current compile's view of the Gateways (before any [`CompileCache::route`]):
    /// when it is the last compile's, reused routes keep how they attached.
    pub(crate) fn listeners(&mut self, view: ListenerView) {
        self.listeners_same = view == self.listeners;
        if !self.listeners_same {
            self.listeners = view;
        }
    }

    /// The compiled rules of `route` (whose key is `key`) and their stamp: the memo's when
    /// it still holds, else compiled now with `resolver`. With the memo's rules, how the
    /// route attached too, when the Gateways look as they did (conditions still carrying the
    /// time they were made).
    pub(crate) fn route(
        &mut self,
        route: RouteSource<'_>,
        key: &ObjectKey,
        resolver: &mut Resolver<'_, '_>,
    ) -> (Arc<CompiledRoute>, u64, Option<Attached>) {
        let kind = slot(route.kind());
        // Memos of routes before this one are of routes gone (or not ours any more).
        let memo = take_key(&mut self.prev[kind], key);
        if self.env_same
            && let Some((k, m)) = memo
            && m.source.is(route)
        {
            resolver.replay(&m.resolved);
            self.stats.routes_reused += 1;
            let attached = match &m.attached {
                Some(a) if self.listeners_same => {
                    let into = match route.kind() {
                        RouteKind::Http => take_key(&mut self.recycled, &k).map(|(_, s)| s.parents),
                        RouteKind::Grpc | RouteKind::Tls | RouteKind::Tcp | RouteKind::Udp => None,
                    };
                    self.stats.statuses_recycled += usize::from(into.is_some());
                    let into = into.unwrap_or_default();
                    Some(a.copy_into(into))
                }
                _ => None,
            };
            if attached.is_some() {
                self.stats.attachments_reused += 1;
            }
            let out = (m.compiled.clone(), m.stamp, attached);
            self.routes[kind].push((k, m));
            return out;
        }
        resolver.record();
        let compiled = Arc::new(route.compile(resolver));
        let resolved = resolver.take_recorded();
        self.stamp += 1;
        self.stats.routes_compiled += 1;
        self.routes[kind].push((
            key.clone(),
            RouteMemo {
                source: SourceCopy::of(route),
                compiled: compiled.clone(),
                resolved,
                stamp: self.stamp,
                attached: None,
            },
        ));
        (compiled, self.stamp, None)
    }

    /// Keeps how the route of the last [`CompileCache::route`] call of `kind` attached.
    pub(crate) fn keep_attached(&mut self, kind: RouteKind, attached: &Attached) {
        if let Some((_, m)) = self.routes[slot(kind)].last_mut() {
            m.attached = Some(attached.clone());
        }
    }

    /// The route list of virtual host `host` of `listener` of `gateway` whose routes have
    /// `stamps`: the memo's when the stamps are the same, else `build()`.
    pub(crate) fn vhost(
        &mut self,
        (gateway, listener, host): (&ObjectKey, &str, &str),
        stamps: Vec<u64>,
        build: impl FnOnce() -> Vec<Route>,
    ) -> Arc<Vec<Route>> {
        let key = (gateway.clone(), listener.to_owned(), host.to_owned());
        if let Some(m) = self.vhosts.get_mut(&key)
            && m.stamps == stamps
        {
            m.epoch = self.epoch;
            self.stats.vhosts_reused += 1;
            return m.routes.clone();
        }
        let routes = Arc::new(build());
        self.stats.vhosts_built += 1;
        self.vhosts.insert(
            key,
            VhostMemo {
                stamps,
                routes: routes.clone(),
                epoch: self.epoch,
            },
        );
        routes
    }

    /// Ends a compile: forgets memos it did not use (deleted routes, virtual hosts gone).
    pub(crate) fn finish(&mut self) {
        let epoch = self.epoch;
        self.prev = Default::default();
        self.recycled = Vec::new().into_iter();
        self.vhosts.retain(|_, m| m.epoch == epoch);
    }
}

/// The entry of `key` in `entries` (sorted by key), if any, after dropping the entries before
/// it: walked alongside routes compiled in key order, without a lookup.
fn take_key<V>(
    entries: &mut std::vec::IntoIter<(ObjectKey, V)>,
    key: &ObjectKey,
) -> Option<(ObjectKey, V)> {
    while entries.as_slice().first().is_some_and(|(k, _)| k < key) {
        entries.next();
    }
    match entries.as_slice().first() {
        Some((k, _)) if k == key => entries.next(),
        _ => None,
    }
}
