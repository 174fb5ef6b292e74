//! Request routing: a [`Router`] is built once from a [`RouteTable`] (regexes compiled,
//! hostnames lower-cased, lookups indexed) and is immutable afterwards; the proxy swaps whole
//! routers. In: a port, a Host and the request line/headers. Out: the listener and the route
//! that wins under Gateway API precedence (the compiler already sorted routes; the router
//! keeps that order), or `None` for a 404.
//!
//! Selection happens in three steps, each picking exactly one candidate:
//! 1. the port's listener whose hostname matches the Host most specifically (exact, then the
//!    longest `*.suffix` wildcard, then the listener without hostname);
//! 2. that listener's virtual host, by the same rule (`*` last);
//! 3. the first route of that virtual host whose match holds.
//!
//! There is no fall-back: when the most specific listener or virtual host has no matching
//! route the answer is `None`, even if a less specific one would have matched. This mirrors
//! Envoy's model (a request picks one virtual host by domain, then its routes) and Gateway
//! API's rule that a more specific hostname takes the request away from less specific ones.
//!
//! Paths, headers and query parameters match as [`matcher`]'s docs say: raw paths (no
//! percent-decoding), segment-wise prefixes, anchored regexes, first query parameter wins,
//! repeated headers joined with `,`.
//!
//! A route lookup allocates nothing unless the Host has upper-case letters or a matched
//! header is repeated; it takes no lock.

mod explain;
mod host;
mod index;
mod matcher;

#[cfg(test)]
mod prop_tests;
#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;

use http::{HeaderMap, Method};
use tollgate_api::{ObjectKey, Route, RouteTable};

pub use explain::{Miss, Trace};
pub use host::host_without_port;
pub use matcher::split_path_and_query;

use crate::FastMap;
use crate::lifecycle::policy::auth::external::{ExternalBuildError, ExternalCheck};
use crate::metrics::{Metrics, RouteMetrics};
use host::{HostIndex, normalize_host};
use index::{Entry, RouteSet};
use matcher::Matcher;

/// Errors building a router from a table (a table the compiler should never have emitted).
#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    /// A regular expression in the table did not compile.
    #[error("route {route}: invalid regular expression {pattern:?}: {message}")]
    Regex {
        /// Route `namespace/name`.
        route: String,
        /// The pattern.
        pattern: String,
        /// Why.
        message: String,
    },
    /// An ExternalAuth filter the compiler should have refused.
    #[error("route {route}: {source}")]
    ExternalAuth {
        /// Route `namespace/name`.
        route: String,
        /// Why.
        source: ExternalBuildError,
    },
}

/// An immutable, indexed routing table for one Gateway.
#[derive(Debug)]
pub struct Router {
    ports: FastMap<u16, PortRoutes>,
}

/// The listeners sharing one port.
#[derive(Debug, Default)]
struct PortRoutes {
    listeners: Vec<ListenerRoutes>,
    hosts: HostIndex,
}

/// One listener: its name and virtual hosts.
#[derive(Debug)]
struct ListenerRoutes {
    name: Box<str>,
    /// A TLS listener that passes TLS through ([`tollgate_api::ListenerConfig::passthrough`]).
    passthrough: bool,
    /// Shared with the router this one was built from when their route lists are the same.
    vhosts: Vec<Arc<RouteSet>>,
    /// The hostname of each virtual host, for [`Router::trace`].
    vhost_names: Vec<Box<str>>,
    hosts: HostIndex,
}

/// A route as the router holds it: the table's route plus precomputed pieces.
#[derive(Debug)]
pub struct CompiledRoute {
    /// The route exactly as the table gave it (filters, backends, timeouts).
    pub api: Route,
    /// `namespace/name` of the HTTPRoute, shared, for metrics labels and logs.
    pub label: Arc<str>,
    /// The metric handles of that label: found once when the virtual host is built (not per
    /// request), and kept with it when a later table reuses the virtual host.
    pub(crate) metrics: Arc<RouteMetrics>,
    /// The rule's ExternalAuth filter (GEP-1494), compiled once per table; the proxy runs it
    /// after the route's policies.
    pub external: Option<Arc<ExternalCheck>>,
}

/// The outcome of a successful match.
#[derive(Debug, Clone, Copy)]
pub struct RouteRef<'a> {
    /// Name of the listener that took the request.
    pub listener: &'a str,
    /// That listener passes TLS through (TLS ports only).
    pub passthrough: bool,
    /// The winning route.
    pub route: &'a CompiledRoute,
    /// For a PathPrefix match, the prefix that matched (what ReplacePrefixMatch replaces).
    /// Normalised: without trailing slash, except the root `/`.
    pub matched_prefix: Option<&'a str>,
}

impl Router {
    /// Builds a router. Fails only on a table the compiler should have rejected.
    ///
    /// A port listed twice (two addresses) serves the union of its listeners; where two
    /// listeners or virtual hosts on a port share a hostname, the first one wins.
    ///
    /// Its routes count into a registry of their own; the proxy builds with
    /// [`Router::build_reusing`] and its [`Metrics`].
    pub fn build(table: &RouteTable) -> Result<Self, RouterError> {
        Self::build_reusing(table, None, &Metrics::default())
    }

    /// Builds a router like [`Router::build`], taking over from `prev` the indexed routes of
    /// every virtual host whose route list is the very one (same [`Arc`]) `prev` was built
    /// from: a table that changed one virtual host costs that virtual host. The routes of
    /// the virtual hosts built count into `metrics`.
    pub fn build_reusing(
        table: &RouteTable,
        prev: Option<&Router>,
        metrics: &Metrics,
    ) -> Result<Self, RouterError> {
        let built: FastMap<usize, &Arc<RouteSet>> = prev
            .into_iter()
            .flat_map(|p| p.ports.values())
            .flat_map(|p| &p.listeners)
            .flat_map(|l| &l.vhosts)
            .map(|set| (set.source_id(), set))
            .collect();
        let mut labels: HashMap<&ObjectKey, (Arc<str>, Arc<RouteMetrics>)> = HashMap::new();
        let mut ports: FastMap<u16, PortRoutes> = FastMap::default();
        for port in &table.ports {
            let pr = ports.entry(port.port).or_default();
            for listener in &port.listeners {
                let mut lr = ListenerRoutes {
                    name: listener.name.as_str().into(),
                    passthrough: listener.passthrough,
                    vhosts: Vec::with_capacity(listener.virtual_hosts.len()),
                    vhost_names: Vec::with_capacity(listener.virtual_hosts.len()),
                    hosts: HostIndex::default(),
                };
                for vh in &listener.virtual_hosts {
                    let set = match built.get(&RouteSet::id_of(&vh.routes)) {
                        Some(&set) => set.clone(),
                        None => Arc::new(build_set(&vh.routes, &mut labels, metrics)?),
                    };
                    lr.hosts.insert(Some(&vh.hostname), lr.vhosts.len());
                    lr.vhosts.push(set);
                    lr.vhost_names.push(vh.hostname.as_str().into());
                }
                pr.hosts
                    .insert(listener.hostname.as_deref(), pr.listeners.len());
                pr.listeners.push(lr);
            }
        }
        Ok(Self { ports })
    }

    /// True when a TLS connection whose SNI was `sni` carries a request for `host` that a
    /// different listener of `port` serves (GatewayHTTPSListenerDetectMisdirectedRequests:
    /// the answer is 421, so a client that reused the connection for another name retries
    /// on its own connection). Both names pick their listener by the same rule as
    /// [`Router::route`]; a port with one listener never misdirects.
    pub fn misdirected(&self, port: u16, sni: &str, host: &str) -> bool {
        let Some(pr) = self.ports.get(&port) else {
            return false;
        };
        pr.listeners.len() > 1
            && pr.hosts.lookup(&normalize_host(sni)) != pr.hosts.lookup(&normalize_host(host))
    }

    /// Finds the route for a request that arrived on `port`.
    /// `host` is the Host header or :authority (any `:port` suffix is ignored, case-insensitive);
    /// `path_and_query` is the raw request target (`/a/b?x=1`).
    pub fn route<'a>(
        &'a self,
        port: u16,
        host: &str,
        method: &Method,
        path_and_query: &str,
        headers: &HeaderMap,
    ) -> Option<RouteRef<'a>> {
        let pr = self.ports.get(&port)?;
        let host = normalize_host(host);
        let listener = pr.listeners.get(pr.hosts.lookup(&host)?)?;
        let vhost = listener.vhosts.get(listener.hosts.lookup(&host)?)?;
        let (path, query) = split_path_and_query(path_and_query);
        let entry = vhost.find(path, query, method, headers)?;
        Some(RouteRef {
            listener: &listener.name,
            passthrough: listener.passthrough,
            route: &entry.route,
            matched_prefix: entry.matcher.prefix(),
        })
    }

    /// True when some listener is configured on `port`.
    pub fn serves_port(&self, port: u16) -> bool {
        self.ports.contains_key(&port)
    }
}

/// Indexes the routes of one virtual host; routes of one HTTPRoute share one label and its
/// metric handles.
fn build_set<'t>(
    routes: &'t Arc<Vec<Route>>,
    labels: &mut HashMap<&'t ObjectKey, (Arc<str>, Arc<RouteMetrics>)>,
    metrics: &Metrics,
) -> Result<RouteSet, RouterError> {
    let mut entries = Vec::with_capacity(routes.len());
    for r in routes.iter() {
        let (label, handles) = labels.entry(&r.route).or_insert_with(|| {
            let label: Arc<str> = Arc::from(r.route.to_string());
            let handles = metrics.route(&label);
            (label, handles)
        });
        let matcher = Matcher::compile(&r.matcher, label)?;
        let external = r
            .filters
            .iter()
            .find_map(|f| match f {
                tollgate_api::Filter::ExternalAuth(e) => Some(ExternalCheck::build(e)),
                _ => None,
            })
            .transpose()
            .map_err(|source| RouterError::ExternalAuth {
                route: label.to_string(),
                source,
            })?
            .map(Arc::new);
        entries.push(Entry {
            route: CompiledRoute {
                api: r.clone(),
                label: label.clone(),
                metrics: handles.clone(),
                external,
            },
            matcher,
        });
    }
    Ok(RouteSet::new(routes.clone(), entries))
}
