//! One route's request predicates, compiled. In: a [`RouteMatch`] from the table. Out: a
//! [`Matcher`] that answers "does this request match" without allocating (except to join
//! a header that appears several times).
//!
//! Semantics, chosen where Gateway API leaves room:
//! - Paths are compared raw, as the client sent them: no percent-decoding, no dot-segment
//!   or slash merging. `/a%2Fb` is not `/a/b`. Decoding belongs to a normalisation step
//!   before routing, applied the same way to every route, if we ever want one.
//! - `PathPrefix` is segment-wise: `/api` matches `/api`, `/api/` and `/api/x`, never
//!   `/apix`. A trailing slash on the prefix is ignored (`/api/` behaves as `/api`); `/`
//!   matches every path.
//! - Regular expressions are anchored (`^(?:pat)$`): the whole path (without query), the
//!   whole header value or the whole query value must match.
//! - Methods compare exactly (the table holds them upper-case).
//! - Header names are case-insensitive. A header sent several times is matched against its
//!   values joined with `,` (RFC 7230 §3.2.2), so `x: a` + `x: b` is `a,b`.
//! - Query parameters: names exact and case-sensitive; only the first occurrence of a name
//!   counts (Gateway API: "only the first entry with an equivalent name MUST be
//!   considered"); values are compared raw (no percent or `+` decoding); `?flag` has the
//!   value `""`.

use std::borrow::Cow;

use http::{HeaderMap, HeaderName, Method};
use regex::Regex;
use regex::bytes::Regex as BytesRegex;
use tollgate_api::{HeaderMatch, PathMatch, RouteMatch, StringMatch};

use super::RouterError;

/// The path predicate of a route.
#[derive(Debug)]
pub(crate) enum PathMatcher {
    /// Whole path equals.
    Exact(Box<str>),
    /// Segment-wise prefix, normalised: no trailing slash, except the root `/`.
    Prefix(Box<str>),
    /// Anchored regular expression.
    Regex(Regex),
}

/// A compiled [`RouteMatch`].
#[derive(Debug)]
pub(crate) struct Matcher {
    pub(crate) path: PathMatcher,
    method: Option<Box<str>>,
    headers: Vec<HeaderPredicate>,
    query: Vec<QueryPredicate>,
}

#[derive(Debug)]
enum ValueMatcher {
    Exact(Box<[u8]>),
    Regex(BytesRegex),
}

#[derive(Debug)]
struct HeaderPredicate {
    /// `None` when the table's name is not a valid header name: no request can carry it,
    /// so the predicate never holds (rather than failing the whole table).
    name: Option<HeaderName>,
    value: ValueMatcher,
}

#[derive(Debug)]
struct QueryPredicate {
    name: Box<str>,
    value: ValueMatcher,
}

/// Normalises a PathPrefix value: trailing slashes dropped, `""` becomes `/`.
pub(crate) fn normalize_prefix(prefix: &str) -> &str {
    let p = prefix.trim_end_matches('/');
    if p.is_empty() { "/" } else { p }
}

/// True when `prefix` (normalised) matches `path` segment-wise.
pub(crate) fn prefix_matches(prefix: &str, path: &str) -> bool {
    prefix == "/"
        || (path.starts_with(prefix)
            && (path.len() == prefix.len() || path.as_bytes()[prefix.len()] == b'/'))
}

/// Splits a request target into path and query (without `?`).
pub fn split_path_and_query(path_and_query: &str) -> (&str, Option<&str>) {
    // By byte: `split_once('?')` cost ~160 instructions per call on a short target
    // (callgrind), twice per request. A `?` is ASCII, so `i` is a char boundary.
    match path_and_query.bytes().position(|b| b == b'?') {
        Some(i) => (&path_and_query[..i], Some(&path_and_query[i + 1..])),
        None => (path_and_query, None),
    }
}

fn anchored(pattern: &str) -> String {
    format!("^(?:{pattern})$")
}

fn regex_error(route: &str, pattern: &str, e: regex::Error) -> RouterError {
    RouterError::Regex {
        route: route.to_owned(),
        pattern: pattern.to_owned(),
        message: e.to_string(),
    }
}

impl ValueMatcher {
    fn compile(m: &StringMatch, route: &str) -> Result<Self, RouterError> {
        Ok(match m {
            StringMatch::Exact(v) => Self::Exact(v.as_bytes().into()),
            StringMatch::RegularExpression(p) => {
                Self::Regex(BytesRegex::new(&anchored(p)).map_err(|e| regex_error(route, p, e))?)
            }
        })
    }

    fn matches(&self, value: &[u8]) -> bool {
        match self {
            Self::Exact(v) => **v == *value,
            Self::Regex(r) => r.is_match(value),
        }
    }
}

impl Matcher {
    /// Compiles the predicates of one route; `route` names it in errors.
    pub(crate) fn compile(m: &RouteMatch, route: &str) -> Result<Self, RouterError> {
        let path = match &m.path {
            PathMatch::Exact(p) => PathMatcher::Exact(p.as_str().into()),
            PathMatch::PathPrefix(p) => PathMatcher::Prefix(normalize_prefix(p).into()),
            PathMatch::RegularExpression(p) => {
                PathMatcher::Regex(Regex::new(&anchored(p)).map_err(|e| regex_error(route, p, e))?)
            }
        };
        let headers = m
            .headers
            .iter()
            .map(|h: &HeaderMatch| {
                Ok(HeaderPredicate {
                    name: HeaderName::from_bytes(h.name.as_bytes()).ok(),
                    value: ValueMatcher::compile(&h.value, route)?,
                })
            })
            .collect::<Result<_, RouterError>>()?;
        let query = m
            .query_params
            .iter()
            .map(|q| {
                Ok(QueryPredicate {
                    name: q.name.as_str().into(),
                    value: ValueMatcher::compile(&q.value, route)?,
                })
            })
            .collect::<Result<_, RouterError>>()?;
        Ok(Self {
            path,
            method: m.method.as_deref().map(Into::into),
            headers,
            query,
        })
    }

    /// The normalised prefix when the path predicate is a PathPrefix.
    pub(crate) fn prefix(&self) -> Option<&str> {
        match &self.path {
            PathMatcher::Prefix(p) => Some(p),
            _ => None,
        }
    }

    /// True when the path predicate holds.
    pub(crate) fn path_matches(&self, path: &str) -> bool {
        match &self.path {
            PathMatcher::Exact(p) => **p == *path,
            PathMatcher::Prefix(p) => prefix_matches(p, path),
            PathMatcher::Regex(r) => r.is_match(path),
        }
    }

    /// True when every predicate other than the path holds.
    pub(crate) fn rest_matches(
        &self,
        method: &Method,
        query: Option<&str>,
        headers: &HeaderMap,
    ) -> bool {
        if let Some(m) = &self.method
            && **m != *method.as_str()
        {
            return false;
        }
        let headers_ok = self.headers.iter().all(|h| {
            let Some(name) = &h.name else { return false };
            header_value(headers, name).is_some_and(|v| h.value.matches(&v))
        });
        headers_ok
            && self.query.iter().all(|q| {
                query
                    .and_then(|qs| query_value(qs, &q.name))
                    .is_some_and(|v| q.value.matches(v.as_bytes()))
            })
    }

    /// True when the whole match holds.
    pub(crate) fn matches(
        &self,
        path: &str,
        query: Option<&str>,
        method: &Method,
        headers: &HeaderMap,
    ) -> bool {
        self.path_matches(path) && self.rest_matches(method, query, headers)
    }
}

impl Matcher {
    /// Why the request does not match, one reason per predicate that fails (empty when it
    /// matches): for `tollgate explain`, never on the request path.
    pub(crate) fn mismatches(
        &self,
        path: &str,
        query: Option<&str>,
        method: &Method,
        headers: &HeaderMap,
    ) -> Vec<String> {
        let mut out = Vec::new();
        if !self.path_matches(path) {
            out.push(match &self.path {
                PathMatcher::Exact(p) => format!("path {path} is not Exact {p}"),
                PathMatcher::Prefix(p) => format!("path {path} is not under PathPrefix {p}"),
                PathMatcher::Regex(r) => {
                    format!(
                        "path {path} does not match RegularExpression {}",
                        unanchored(r.as_str())
                    )
                }
            });
        }
        if let Some(m) = &self.method
            && **m != *method.as_str()
        {
            out.push(format!("method {method} is not {m}"));
        }
        for h in &self.headers {
            let value = h.name.as_ref().and_then(|n| header_value(headers, n));
            let name = h.name.as_ref().map_or("(invalid name)", HeaderName::as_str);
            match value {
                None => out.push(format!("header {name} is missing ({})", h.value.describe())),
                Some(v) if !h.value.matches(&v) => out.push(format!(
                    "header {name}: {:?} is not {}",
                    String::from_utf8_lossy(&v),
                    h.value.describe()
                )),
                Some(_) => {}
            }
        }
        for q in &self.query {
            match query.and_then(|qs| query_value(qs, &q.name)) {
                None => out.push(format!(
                    "query parameter {} is missing ({})",
                    q.name,
                    q.value.describe()
                )),
                Some(v) if !q.value.matches(v.as_bytes()) => out.push(format!(
                    "query parameter {}: {v:?} is not {}",
                    q.name,
                    q.value.describe()
                )),
                Some(_) => {}
            }
        }
        out
    }
}

impl ValueMatcher {
    /// How the table wrote the predicate: `Exact "v"` or `RegularExpression "p"`.
    fn describe(&self) -> String {
        match self {
            Self::Exact(v) => format!("Exact {:?}", String::from_utf8_lossy(v)),
            Self::Regex(r) => format!("RegularExpression {:?}", unanchored(r.as_str())),
        }
    }
}

/// The pattern as the route wrote it, without the anchors [`anchored`] added.
fn unanchored(p: &str) -> &str {
    p.strip_prefix("^(?:")
        .and_then(|p| p.strip_suffix(")$"))
        .unwrap_or(p)
}

/// The value of a header, repeated values joined with `,` (allocates only then).
fn header_value<'h>(headers: &'h HeaderMap, name: &HeaderName) -> Option<Cow<'h, [u8]>> {
    let mut values = headers.get_all(name).iter();
    let first = values.next()?;
    let Some(second) = values.next() else {
        return Some(Cow::Borrowed(first.as_bytes()));
    };
    let mut joined = first.as_bytes().to_vec();
    for v in std::iter::once(second).chain(values) {
        joined.push(b',');
        joined.extend_from_slice(v.as_bytes());
    }
    Some(Cow::Owned(joined))
}

/// The raw value of the first query parameter called `name`.
fn query_value<'q>(query: &'q str, name: &str) -> Option<&'q str> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then_some(v)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn hm(name: &str, value: StringMatch) -> HeaderMatch {
        HeaderMatch {
            name: name.into(),
            value,
        }
    }

    fn mk_match(path: PathMatch) -> RouteMatch {
        RouteMatch {
            path,
            method: None,
            headers: vec![],
            query_params: vec![],
        }
    }

    fn compile(m: &RouteMatch) -> Matcher {
        Matcher::compile(m, "ns/r").unwrap()
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn get(m: &Matcher, target: &str, hs: &HeaderMap) -> bool {
        let (p, q) = split_path_and_query(target);
        m.matches(p, q, &Method::GET, hs)
    }

    #[test]
    fn a_target_splits_at_its_first_question_mark() {
        assert_eq!(split_path_and_query("/a/b"), ("/a/b", None));
        assert_eq!(split_path_and_query("/a?x=1"), ("/a", Some("x=1")));
        assert_eq!(split_path_and_query("/a?"), ("/a", Some("")));
        assert_eq!(split_path_and_query("/a?x=?&y"), ("/a", Some("x=?&y")));
        assert_eq!(split_path_and_query("/é?ü"), ("/é", Some("ü")));
        assert_eq!(split_path_and_query(""), ("", None));
    }

    #[test]
    fn prefix_is_segment_wise() {
        let m = compile(&mk_match(PathMatch::PathPrefix("/api/v1".into())));
        let none = HeaderMap::new();
        assert!(get(&m, "/api/v1", &none));
        assert!(get(&m, "/api/v1/", &none));
        assert!(get(&m, "/api/v1/x?y=1", &none));
        assert!(!get(&m, "/api/v10", &none));
        assert!(!get(&m, "/api", &none));
    }

    #[test]
    fn root_prefix_matches_everything() {
        let m = compile(&mk_match(PathMatch::PathPrefix("/".into())));
        assert!(get(&m, "/", &HeaderMap::new()));
        assert!(get(&m, "/anything/at/all", &HeaderMap::new()));
    }

    #[test]
    fn prefix_trailing_slash_is_ignored() {
        let m = compile(&mk_match(PathMatch::PathPrefix("/api/".into())));
        assert_eq!(m.prefix(), Some("/api"));
        assert!(get(&m, "/api", &HeaderMap::new()));
        assert!(get(&m, "/api/x", &HeaderMap::new()));
        assert!(!get(&m, "/apix", &HeaderMap::new()));
    }

    #[test]
    fn exact_path_ignores_query_only() {
        let m = compile(&mk_match(PathMatch::Exact("/a".into())));
        assert!(get(&m, "/a?x=1", &HeaderMap::new()));
        assert!(!get(&m, "/a/", &HeaderMap::new()));
        assert!(!get(&m, "/A", &HeaderMap::new()));
    }

    #[test]
    fn path_is_not_percent_decoded() {
        let m = compile(&mk_match(PathMatch::Exact("/a/b".into())));
        assert!(!get(&m, "/a%2Fb", &HeaderMap::new()));
    }

    #[test]
    fn path_regex_is_anchored_and_excludes_query() {
        let m = compile(&mk_match(PathMatch::RegularExpression("/v[0-9]+".into())));
        assert!(get(&m, "/v12?x=1", &HeaderMap::new()));
        assert!(!get(&m, "/v12/x", &HeaderMap::new()));
        assert!(!get(&m, "/x/v12", &HeaderMap::new()));
    }

    #[test]
    fn alternation_is_anchored_as_a_whole() {
        let m = compile(&mk_match(PathMatch::RegularExpression("/a|/b".into())));
        assert!(get(&m, "/b", &HeaderMap::new()));
        assert!(!get(&m, "/bx", &HeaderMap::new()));
        assert!(!get(&m, "x/a", &HeaderMap::new()));
    }

    #[test]
    fn invalid_regex_is_a_build_error() {
        let m = mk_match(PathMatch::RegularExpression("(".into()));
        let err = Matcher::compile(&m, "ns/r").unwrap_err();
        assert!(err.to_string().contains("ns/r"), "{err}");
    }

    #[test]
    fn method_is_exact() {
        let mut rm = mk_match(PathMatch::PathPrefix("/".into()));
        rm.method = Some("POST".into());
        let m = compile(&rm);
        assert!(m.matches("/", None, &Method::POST, &HeaderMap::new()));
        assert!(!m.matches("/", None, &Method::GET, &HeaderMap::new()));
    }

    #[test]
    fn header_name_is_case_insensitive_value_is_not() {
        let mut rm = mk_match(PathMatch::PathPrefix("/".into()));
        rm.headers = vec![hm("x-env", StringMatch::Exact("canary".into()))];
        let m = compile(&rm);
        assert!(get(&m, "/", &headers(&[("X-Env", "canary")])));
        assert!(!get(&m, "/", &headers(&[("x-env", "Canary")])));
        assert!(!get(&m, "/", &HeaderMap::new()));
    }

    #[test]
    fn repeated_header_values_are_joined_with_comma() {
        let mut rm = mk_match(PathMatch::PathPrefix("/".into()));
        rm.headers = vec![hm("x", StringMatch::Exact("a,b".into()))];
        let m = compile(&rm);
        assert!(get(&m, "/", &headers(&[("x", "a"), ("x", "b")])));
        assert!(!get(&m, "/", &headers(&[("x", "a")])));
    }

    #[test]
    fn header_regex_is_anchored() {
        let mut rm = mk_match(PathMatch::PathPrefix("/".into()));
        rm.headers = vec![hm("x", StringMatch::RegularExpression("v[0-9]".into()))];
        let m = compile(&rm);
        assert!(get(&m, "/", &headers(&[("x", "v1")])));
        assert!(!get(&m, "/", &headers(&[("x", "v12")])));
    }

    #[test]
    fn invalid_header_name_never_matches() {
        let mut rm = mk_match(PathMatch::PathPrefix("/".into()));
        rm.headers = vec![hm("bad name", StringMatch::Exact("v".into()))];
        let m = compile(&rm);
        assert!(!get(&m, "/", &headers(&[("x", "v")])));
    }

    #[test]
    fn first_query_param_wins() {
        let mut rm = mk_match(PathMatch::PathPrefix("/".into()));
        rm.query_params = vec![hm("a", StringMatch::Exact("1".into()))];
        let m = compile(&rm);
        assert!(get(&m, "/?a=1&a=2", &HeaderMap::new()));
        assert!(!get(&m, "/?a=2&a=1", &HeaderMap::new()));
        assert!(!get(&m, "/", &HeaderMap::new()));
    }

    #[test]
    fn query_name_is_case_sensitive_and_value_raw() {
        let mut rm = mk_match(PathMatch::PathPrefix("/".into()));
        rm.query_params = vec![hm("q", StringMatch::Exact("a b".into()))];
        let m = compile(&rm);
        assert!(!get(&m, "/?Q=a%20b", &HeaderMap::new()));
        assert!(!get(&m, "/?q=a%20b", &HeaderMap::new()));
        assert!(!get(&m, "/?q=a+b", &HeaderMap::new()));
        rm.query_params = vec![hm("q", StringMatch::Exact("a%20b".into()))];
        assert!(get(&compile(&rm), "/?x&q=a%20b", &HeaderMap::new()));
    }

    #[test]
    fn query_flag_without_value_is_empty() {
        let mut rm = mk_match(PathMatch::PathPrefix("/".into()));
        rm.query_params = vec![hm("debug", StringMatch::Exact(String::new()))];
        let m = compile(&rm);
        assert!(get(&m, "/?debug", &HeaderMap::new()));
        assert!(get(&m, "/?x=1&debug=", &HeaderMap::new()));
    }

    #[test]
    fn query_regex_is_anchored() {
        let mut rm = mk_match(PathMatch::PathPrefix("/".into()));
        rm.query_params = vec![hm("v", StringMatch::RegularExpression("[0-9]+".into()))];
        let m = compile(&rm);
        assert!(get(&m, "/?v=42", &HeaderMap::new()));
        assert!(!get(&m, "/?v=42a", &HeaderMap::new()));
    }
}
