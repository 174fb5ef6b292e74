//! The routes of one virtual host, indexed. In: routes in precedence order. Out: the first
//! route (lowest index) whose match holds, exactly as a linear scan would find it.
//!
//! Routes are bucketed by their path predicate: exact paths in a hash map, prefixes in a
//! hash map keyed by the normalised prefix (the root `/` kept apart), and everything else
//! (regular expressions) in a list. A request only looks at the buckets its path can hit:
//! its exact path, each of its segment prefixes (`/a/b/c` → `/a/b/c`, `/a/b`, `/a`, `/`),
//! and the regex list. Each bucket holds ascending route indices, so scanning a bucket
//! stops at its first full match, or as soon as it passes the best index found so far:
//! the minimum over buckets is the first match of the whole list.

use std::sync::Arc;

use http::{HeaderMap, Method};
use tollgate_api::Route;

use crate::FastMap;

use super::CompiledRoute;
use super::matcher::{Matcher, PathMatcher};

/// A route with its compiled predicates.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) route: CompiledRoute,
    pub(crate) matcher: Matcher,
}

/// Indexed routes of one virtual host.
#[derive(Debug, Default)]
pub(crate) struct RouteSet {
    /// The table's list these entries were built from: kept so that its address identifies
    /// it for as long as this set lives ([`RouteSet::source_id`]).
    source: Arc<Vec<Route>>,
    entries: Vec<Entry>,
    exact: FastMap<Box<str>, Vec<u32>>,
    prefix: FastMap<Box<str>, Vec<u32>>,
    root: Vec<u32>,
    others: Vec<u32>,
    /// Longest non-root prefix: longer segment prefixes of a request need no probe, which
    /// bounds the work a path with thousands of segments can cause.
    max_prefix_len: usize,
    /// The lengths of the exact paths and of the prefixes, as [`len_bit`]s: a request path
    /// (or segment prefix) of a length no key has needs no hashed probe (callgrind: two of
    /// the four probes of a request in the 10k-route benchmark, ~100 instructions each).
    exact_lens: u64,
    prefix_lens: u64,
}

/// A length as one bit of a `u64`; every length from 63 on shares the last bit.
fn len_bit(len: usize) -> u64 {
    1 << len.min(63)
}

impl RouteSet {
    /// Indexes entries (built from `source`), keeping their order as precedence.
    pub(crate) fn new(source: Arc<Vec<Route>>, entries: Vec<Entry>) -> Self {
        let mut set = Self {
            source,
            ..Self::default()
        };
        for (i, e) in entries.iter().enumerate() {
            // More than u32::MAX routes in one virtual host cannot be served anyway; such
            // entries stay reachable only through the list (never, in practice).
            let Ok(i) = u32::try_from(i) else { break };
            match &e.matcher.path {
                PathMatcher::Exact(p) => {
                    set.exact_lens |= len_bit(p.len());
                    set.exact.entry(p.clone()).or_default().push(i);
                }
                PathMatcher::Prefix(p) if &**p == "/" => set.root.push(i),
                PathMatcher::Prefix(p) => {
                    set.max_prefix_len = set.max_prefix_len.max(p.len());
                    set.prefix_lens |= len_bit(p.len());
                    set.prefix.entry(p.clone()).or_default().push(i);
                }
                PathMatcher::Regex(_) => set.others.push(i),
            }
        }
        set.entries = entries;
        set
    }

    /// Identity of the route list the set was built from: equal for two sets only when they
    /// come from the same allocation, which the set keeps alive.
    pub(crate) fn source_id(&self) -> usize {
        Self::id_of(&self.source)
    }

    /// Identity of a table's route list, as [`RouteSet::source_id`].
    pub(crate) fn id_of(routes: &Arc<Vec<Route>>) -> usize {
        Arc::as_ptr(routes) as usize
    }

    /// The first entry matching the request.
    pub(crate) fn find(
        &self,
        path: &str,
        query: Option<&str>,
        method: &Method,
        headers: &HeaderMap,
    ) -> Option<&Entry> {
        let mut best = u32::MAX;
        let mut scan = |candidates: &[u32]| {
            for &i in candidates {
                if i >= best {
                    return;
                }
                if let Some(e) = self.entries.get(i as usize)
                    && e.matcher.matches(path, query, method, headers)
                {
                    best = i;
                    return;
                }
            }
        };
        if self.exact_lens & len_bit(path.len()) != 0
            && let Some(c) = self.exact.get(path)
        {
            scan(c);
        }
        if self.prefix_lens != 0 {
            let bytes = path.as_bytes();
            let limit = bytes.len().min(self.max_prefix_len);
            for i in 1..=limit {
                // `/` is ASCII, so `i` is a char boundary.
                if (i == bytes.len() || bytes[i] == b'/')
                    && self.prefix_lens & len_bit(i) != 0
                    && let Some(c) = self.prefix.get(&path[..i])
                {
                    scan(c);
                }
            }
        }
        scan(&self.root);
        scan(&self.others);
        self.entries.get(best as usize)
    }

    /// Every entry, in precedence order (for [`super::Router::trace`]).
    pub(crate) fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The first entry matching the request, by linear scan: the definition `find` must
    /// agree with.
    #[cfg(test)]
    pub(crate) fn find_linear(
        &self,
        path: &str,
        query: Option<&str>,
        method: &Method,
        headers: &HeaderMap,
    ) -> Option<&Entry> {
        self.entries
            .iter()
            .find(|e| e.matcher.matches(path, query, method, headers))
    }
}
