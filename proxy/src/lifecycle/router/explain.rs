//! Why a request takes the route it takes, for `tollgate explain`: the same three steps as
//! [`Router::route`], each one recorded, and the rules of the chosen virtual host that came
//! nearest to matching with the predicates they failed.
//!
//! In: what [`Router::route`] reads. Out: a [`Trace`]. Never on the request path: it
//! allocates freely.

use http::{HeaderMap, Method};

use super::host::normalize_host;
use super::matcher::split_path_and_query;
use super::{CompiledRoute, RouteRef, Router};

/// How a request was routed.
#[derive(Debug)]
pub struct Trace<'a> {
    /// The listener that takes the request (by its hostname), `None` when none on the port
    /// does.
    pub listener: Option<&'a str>,
    /// The hostname of that listener's virtual host that takes it (`*`: any), `None` when
    /// none does.
    pub virtual_host: Option<&'a str>,
    /// The winning route, as [`Router::route`] returns it.
    pub chosen: Option<RouteRef<'a>>,
    /// Rules of the virtual host ahead of the winner (all of them when none won) that did
    /// not match, fewest failed predicates first, at most the `nearest` asked for.
    pub misses: Vec<Miss<'a>>,
}

/// A rule that did not match, and why.
#[derive(Debug)]
pub struct Miss<'a> {
    /// The rule.
    pub route: &'a CompiledRoute,
    /// One reason per failed predicate.
    pub reasons: Vec<String>,
}

impl Router {
    /// Routes like [`Router::route`], recording each step; `nearest` bounds the misses.
    pub fn trace<'a>(
        &'a self,
        port: u16,
        host: &str,
        method: &Method,
        path_and_query: &str,
        headers: &HeaderMap,
        nearest: usize,
    ) -> Trace<'a> {
        let mut trace = Trace {
            listener: None,
            virtual_host: None,
            chosen: None,
            misses: Vec::new(),
        };
        let Some(pr) = self.ports.get(&port) else {
            return trace;
        };
        let host = normalize_host(host);
        let Some(listener) = pr.hosts.lookup(&host).and_then(|i| pr.listeners.get(i)) else {
            return trace;
        };
        trace.listener = Some(&listener.name);
        let Some(vi) = listener.hosts.lookup(&host) else {
            return trace;
        };
        let (Some(vhost), Some(name)) = (listener.vhosts.get(vi), listener.vhost_names.get(vi))
        else {
            return trace;
        };
        trace.virtual_host = Some(name);
        let (path, query) = split_path_and_query(path_and_query);
        let winner = vhost.find(path, query, method, headers);
        trace.chosen = winner.map(|entry| RouteRef {
            listener: &listener.name,
            passthrough: listener.passthrough,
            route: &entry.route,
            matched_prefix: entry.matcher.prefix(),
        });
        let mut misses: Vec<(usize, Miss<'a>)> = vhost
            .entries()
            .iter()
            .take_while(|e| !winner.is_some_and(|w| std::ptr::eq(*e, w)))
            .enumerate()
            .map(|(i, e)| {
                let reasons = e.matcher.mismatches(path, query, method, headers);
                (
                    i,
                    Miss {
                        route: &e.route,
                        reasons,
                    },
                )
            })
            .filter(|(_, m)| !m.reasons.is_empty())
            .collect();
        misses.sort_by_key(|(i, m)| (m.reasons.len(), *i));
        trace.misses = misses.into_iter().take(nearest).map(|(_, m)| m).collect();
        trace
    }
}

#[cfg(test)]
mod tests {
    use http::Method;

    use super::super::test_support::*;
    use super::*;

    #[test]
    fn a_trace_names_the_listener_the_winner_and_each_failed_predicate() {
        let table = mk_simple(vec![
            with_query(mk_regex("a", "/v[0-9]+/items"), "page", "1"),
            with_header(mk_prefix("b", "/v1"), "x-env", "prod"),
            mk_prefix("c", "/"),
        ]);
        let router = Router::build(&table).unwrap();
        let headers = mk_headers(&[("x-env", "dev")]);
        let t = router.trace(
            80,
            "Example.com",
            &Method::GET,
            "/v1/items?page=2",
            &headers,
            3,
        );
        assert!(t.listener.is_some() && t.virtual_host.is_some());
        assert_eq!(&*t.chosen.unwrap().route.label, "ns/c");
        let misses: Vec<(&str, Vec<String>)> = t
            .misses
            .iter()
            .map(|m| (&*m.route.label, m.reasons.clone()))
            .collect();
        assert_eq!(
            misses,
            [
                (
                    "ns/a",
                    vec!["query parameter page: \"2\" is not Exact \"1\"".to_owned()]
                ),
                (
                    "ns/b",
                    vec!["header x-env: \"dev\" is not Exact \"prod\"".to_owned()]
                ),
            ]
        );
        // The regex is shown as the route wrote it, not anchored.
        let t = router.trace(80, "example.com", &Method::GET, "/v1/x", &headers, 1);
        assert_eq!(t.misses.len(), 1, "bounded by `nearest`");
        let t = router.trace(80, "example.com", &Method::GET, "/w", &headers, 3);
        let a = t.misses.iter().find(|m| &*m.route.label == "ns/a").unwrap();
        assert_eq!(
            a.reasons[0],
            "path /w does not match RegularExpression /v[0-9]+/items"
        );
    }

    #[test]
    fn a_port_without_listeners_traces_nothing() {
        let router = Router::build(&mk_simple(vec![mk_prefix("a", "/")])).unwrap();
        let t = router.trace(81, "example.com", &Method::GET, "/", &HeaderMap::new(), 3);
        assert!(t.listener.is_none() && t.chosen.is_none() && t.misses.is_empty());
    }
}
