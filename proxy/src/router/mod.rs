//! Request routing: a [`Router`] is built once from a [`RouteTable`] (regexes compiled,
//! hostnames lower-cased, lookups indexed) and is immutable afterwards; the proxy swaps whole
//! routers. In: a port, a Host and the request line/headers. Out: the listener and the route
//! that wins under Gateway API precedence (the compiler already sorted routes; the router
//! keeps that order), or `None` for a 404.
//!
//! INTERFACE STUB: owned by the router work; signatures are the contract used by the server.

use std::sync::Arc;

use http::{HeaderMap, Method};
use tollgate_api::{Route, RouteTable};

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
}

/// An immutable, indexed routing table for one Gateway.
#[derive(Debug)]
pub struct Router {
    _private: (),
}

/// A route as the router holds it: the table's route plus precomputed pieces.
#[derive(Debug)]
pub struct CompiledRoute {
    /// The route exactly as the table gave it (filters, backends, timeouts).
    pub api: Route,
    /// `namespace/name` of the HTTPRoute, shared, for metrics labels and logs.
    pub label: Arc<str>,
}

/// The outcome of a successful match.
#[derive(Debug, Clone, Copy)]
pub struct RouteRef<'a> {
    /// Name of the listener that took the request.
    pub listener: &'a str,
    /// The winning route.
    pub route: &'a CompiledRoute,
    /// For a PathPrefix match, the prefix that matched (what ReplacePrefixMatch replaces).
    pub matched_prefix: Option<&'a str>,
}

impl Router {
    /// Builds a router. Fails only on a table the compiler should have rejected.
    pub fn build(table: &RouteTable) -> Result<Self, RouterError> {
        let _ = table;
        todo!("router")
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
        let _ = (port, host, method, path_and_query, headers);
        todo!("router")
    }
}
