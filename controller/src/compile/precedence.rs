//! Gateway API route precedence, encoded as an `Ord`.
//!
//! In: one route-table entry (a match of a rule of a route) summarized as a [`Specificity`],
//! plus the route's creation time and key. Out: a [`Precedence`] key; sorting ascending puts the
//! entry that must win first. The criteria, in order (GEP-1294 / HTTPRouteRule docs):
//!
//! 1. Path: Exact before RegularExpression before PathPrefix; within Exact and PathPrefix, more
//!    characters first. The spec leaves regex precedence to the implementation: we put regexes
//!    after every Exact match and before every PathPrefix (a regex is written to single out
//!    paths a prefix cannot), longer patterns first.
//! 2. A method match before none.
//! 3. More header matches first.
//! 4. More query-parameter matches first.
//! 5. The oldest route (by creationTimestamp; routes without one last).
//! 6. Route `namespace/name` alphabetically.
//! 7. Rule index, then match index, within the route.
//!
//! GRPCRoute matches replace 1-4 with the GRPCRouteRule criteria: more characters in the
//! matching service, then in the matching method, then more header matches; 5-7 are the same.
//! Every match that names a service and matches a call matched that call's service (an Exact
//! one literally, a RegularExpression one in full), so for one call the character counts of
//! the candidates differ only between naming a service and not: we rank a service before none,
//! then a method before none, then more headers, then (the spec leaves RegularExpression
//! precedence to implementations) Exact before RegularExpression. The spec forbids merging
//! GRPCRoutes and HTTPRoutes (a listener serves a hostname with one kind or the other, see
//! [`super::crossserve`]), so the two kinds never compete in one virtual host; an HTTPRoute
//! entry sorts before a GRPCRoute one only to keep the order total.

use std::cmp::Reverse;

use k8s_openapi::jiff::Timestamp;
use tollgate_api::{PathMatch, RouteMatch};

/// How specific one match is, by the criteria of its route kind. Ascending = more specific.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Specificity {
    /// An HTTPRoute match.
    Http {
        /// Exact 0, RegularExpression 1, PathPrefix 2.
        path_class: u8,
        /// Characters in the path or pattern.
        path_len: Reverse<usize>,
        /// No method match.
        no_method: bool,
        /// Header matches.
        headers: Reverse<usize>,
        /// Query-parameter matches.
        query_params: Reverse<usize>,
    },
    /// A GRPCRoute match.
    Grpc {
        /// No service named (any service).
        no_service: bool,
        /// No method named (any method).
        no_method: bool,
        /// Header matches.
        headers: Reverse<usize>,
        /// A RegularExpression method match.
        regex: bool,
    },
}

impl Specificity {
    /// The specificity of an HTTPRoute match.
    pub fn http(m: &RouteMatch) -> Self {
        let (path_class, len) = match &m.path {
            PathMatch::Exact(p) => (0, p.chars().count()),
            PathMatch::RegularExpression(p) => (1, p.chars().count()),
            PathMatch::PathPrefix(p) => (2, p.chars().count()),
        };
        Self::Http {
            path_class,
            path_len: Reverse(len),
            no_method: m.method.is_none(),
            headers: Reverse(m.headers.len()),
            query_params: Reverse(m.query_params.len()),
        }
    }

    /// The specificity of a GRPCRoute match: whether it names a service and a method, its
    /// header matches, whether its method match is a RegularExpression.
    pub fn grpc(service: bool, method: bool, headers: usize, regex: bool) -> Self {
        Self::Grpc {
            no_service: !service,
            no_method: !method,
            headers: Reverse(headers),
            regex,
        }
    }
}

/// Sort key: ascending = higher precedence.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Precedence {
    specificity: Specificity,
    created: (bool, Option<Timestamp>),
    namespace: String,
    name: String,
    rule_index: u32,
    match_index: usize,
}

impl Precedence {
    /// Key of match `match_index` of rule `rule_index` of the route `namespace/name`.
    pub fn new(
        specificity: Specificity,
        created: Option<Timestamp>,
        namespace: &str,
        name: &str,
        rule_index: u32,
        match_index: usize,
    ) -> Self {
        Self {
            specificity,
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

    fn m(path: PathMatch) -> Specificity {
        Specificity::http(&RouteMatch {
            path,
            method: None,
            headers: vec![],
            query_params: vec![],
        })
    }

    #[test]
    fn exact_then_regex_then_prefix() {
        let e = Precedence::new(m(PathMatch::Exact("/a".into())), None, "n", "r", 0, 0);
        let r = Precedence::new(
            m(PathMatch::RegularExpression("/a.*".into())),
            None,
            "n",
            "r",
            0,
            1,
        );
        let p = Precedence::new(
            m(PathMatch::PathPrefix("/a/long/prefix".into())),
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
        let a = Precedence::new(m(PathMatch::Exact("/".into())), Some(t), "z", "z", 0, 0);
        let b = Precedence::new(m(PathMatch::Exact("/".into())), None, "a", "a", 0, 0);
        assert!(a < b);
    }

    #[test]
    fn grpc_service_then_method_then_headers_then_exact() {
        let exact = Specificity::grpc(true, true, 0, false);
        let regex = Specificity::grpc(true, true, 0, true);
        let service_only = Specificity::grpc(true, false, 0, false);
        let method_only = Specificity::grpc(false, true, 0, false);
        let headers_only = Specificity::grpc(false, false, 1, false);
        let any = Specificity::grpc(false, false, 0, false);
        assert!(exact < regex);
        assert!(regex < service_only);
        assert!(service_only < method_only);
        assert!(method_only < headers_only);
        assert!(headers_only < any);
        let more_headers = Specificity::grpc(true, true, 1, true);
        assert!(more_headers < exact);
    }
}
