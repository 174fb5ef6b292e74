//! Gateway API route precedence, encoded as an `Ord`.
//!
//! In: one route-table entry (a match of a rule of an HTTPRoute) plus the HTTPRoute's creation
//! time and key. Out: a [`Precedence`] key; sorting ascending puts the entry that must win
//! first. The criteria, in order (GEP-1294 / HTTPRouteRule docs):
//!
//! 1. Path: Exact before RegularExpression before PathPrefix; within Exact and PathPrefix, more
//!    characters first. The spec leaves regex precedence to the implementation: we put regexes
//!    after every Exact match and before every PathPrefix (a regex is written to single out
//!    paths a prefix cannot), longer patterns first.
//! 2. A method match before none.
//! 3. More header matches first.
//! 4. More query-parameter matches first.
//! 5. The oldest HTTPRoute (by creationTimestamp; routes without one last).
//! 6. HTTPRoute `namespace/name` alphabetically.
//! 7. Rule index, then match index, within the HTTPRoute.

use std::cmp::Reverse;

use k8s_openapi::jiff::Timestamp;
use tollgate_api::{PathMatch, RouteMatch};

/// Sort key: ascending = higher precedence.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Precedence {
    path_class: u8,
    path_len: Reverse<usize>,
    no_method: bool,
    headers: Reverse<usize>,
    query_params: Reverse<usize>,
    created: (bool, Option<Timestamp>),
    namespace: String,
    name: String,
    rule_index: u32,
    match_index: usize,
}

impl Precedence {
    /// Key of match `match_index` of rule `rule_index` of the HTTPRoute `namespace/name`.
    pub fn new(
        m: &RouteMatch,
        created: Option<Timestamp>,
        namespace: &str,
        name: &str,
        rule_index: u32,
        match_index: usize,
    ) -> Self {
        let (path_class, len) = match &m.path {
            PathMatch::Exact(p) => (0, p.chars().count()),
            PathMatch::RegularExpression(p) => (1, p.chars().count()),
            PathMatch::PathPrefix(p) => (2, p.chars().count()),
        };
        Self {
            path_class,
            path_len: Reverse(len),
            no_method: m.method.is_none(),
            headers: Reverse(m.headers.len()),
            query_params: Reverse(m.query_params.len()),
            created: (created.is_none(), created),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            rule_index,
            match_index,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(path: PathMatch) -> RouteMatch {
        RouteMatch {
            path,
            method: None,
            headers: vec![],
            query_params: vec![],
        }
    }

    #[test]
    fn exact_then_regex_then_prefix() {
        let e = Precedence::new(&m(PathMatch::Exact("/a".into())), None, "n", "r", 0, 0);
        let r = Precedence::new(
            &m(PathMatch::RegularExpression("/a.*".into())),
            None,
            "n",
            "r",
            0,
            1,
        );
        let p = Precedence::new(
            &m(PathMatch::PathPrefix("/a/long/prefix".into())),
            None,
            "n",
            "r",
            0,
            2,
        );
        assert!(e < r && r < p);
    }

    #[test]
    fn route_without_timestamp_is_last() {
        let t = Timestamp::UNIX_EPOCH;
        let a = Precedence::new(&m(PathMatch::Exact("/".into())), Some(t), "z", "z", 0, 0);
        let b = Precedence::new(&m(PathMatch::Exact("/".into())), None, "a", "a", 0, 0);
        assert!(a < b);
    }
}
