//! HTTPRoute rules to route-table entries.
//!
//! In: one HTTPRoute and a backend [`Resolver`]. Out: a [`CompiledRoute`]: per rule its
//! matches (defaulted to PathPrefix `/`), filters, weighted backends and timeouts, or the
//! `UnsupportedValue` [`Problem`] that rejects the whole route; plus the ResolvedRefs problems
//! of backends that did not resolve (those keep the route, with their share answered 500).
//! [`super::grpc`] compiles GRPCRoute matches itself and hands the rest of each rule (filters,
//! backendRefs) to [`compile_actions`], so both kinds share one definition of those.
//!
//! Rejected here: a path that does not start with `/` (or holds `//`, `/./`, `/../`, `%2f`,
//! `#`), a RegularExpression the `regex` crate refuses, a blank header or query name, a
//! timeout that does not parse or a backendRequest timeout above the request timeout, and
//! everything [`super::filters`] rejects. Header and query matches with a repeated name keep
//! the first, as the spec says.

use std::collections::BTreeSet;

use gateway_api::Duration;
use gateway_types::experimental::httproutes::{
    HttpRoute, HttpRouteRules, HttpRouteRulesMatches, HttpRouteRulesMatchesHeadersType,
    HttpRouteRulesMatchesMethod, HttpRouteRulesMatchesPathType,
    HttpRouteRulesMatchesQueryParamsType, HttpRouteRulesRetry, HttpRouteRulesTimeouts,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tollgate_api::{
    HeaderMatch, PathMatch, Retry, RouteMatch, StringMatch, Timeouts, WeightedBackend,
};

use super::backends::{RefSpec, Resolver};
use super::conditions::{Problem, reason};
use super::filters::{self, FilterCtx};
use super::index::ns_of;
use super::kinds::RouteKind;
use super::precedence::Specificity;

/// One compiled rule.
#[derive(Debug, Clone)]
pub struct CompiledRule {
    /// Index in `spec.rules`.
    pub index: u32,
    /// `rules[].name`.
    pub name: Option<String>,
    /// Matches (at least one).
    pub matches: Vec<RouteMatch>,
    /// How specific each match is, for precedence (parallel to `matches`).
    pub specificity: Vec<Specificity>,
    /// Rule filters.
    pub filters: Vec<tollgate_api::Filter>,
    /// Weighted backends.
    pub backends: Vec<WeightedBackend>,
    /// Timeouts.
    pub timeouts: Timeouts,
    /// Retries (`rules[].retry`).
    pub retry: Option<Retry>,
    /// Session persistence (`rules[].sessionPersistence`).
    pub session: Option<tollgate_api::backend::Session>,
}

/// One compiled route.
#[derive(Debug, Clone)]
pub struct CompiledRoute {
    /// Rules, or the problem that rejects the route.
    pub rules: Result<Vec<CompiledRule>, Problem>,
    /// Backends that did not resolve (ResolvedRefs=False).
    pub unresolved: Vec<Problem>,
    /// The route's request trailers go upstream ([`REQUEST_TRAILERS_ANNOTATION`]).
    pub request_trailers: bool,
}

/// HTTPRoute and GRPCRoute annotation: `forward` sends request trailers upstream (filtered:
/// module `forward` of the proxy); `drop`, or no annotation, drops them; any other value
/// rejects the route (`UnsupportedValue`), as any other value the route cannot have does.
pub const REQUEST_TRAILERS_ANNOTATION: &str = "tollgate.dev/request-trailers";

/// How much of a refused annotation value a message quotes.
const SHOWN_CHARS: usize = 64;

/// Reads [`REQUEST_TRAILERS_ANNOTATION`] into `compiled`; a value it cannot have rejects the
/// route, unless a problem in its spec rejected it already.
pub fn read_request_trailers(meta: &ObjectMeta, compiled: &mut CompiledRoute) {
    let value = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(REQUEST_TRAILERS_ANNOTATION));
    match value.map(String::as_str) {
        None | Some("drop") => {}
        Some("forward") => compiled.request_trailers = true,
        Some(other) => {
            if compiled.rules.is_ok() {
                // An annotation value may be up to 256 KiB and a condition message at most
                // 32 KiB: the message quotes the value's start only.
                let shown: String = other.chars().take(SHOWN_CHARS).collect();
                let cut = if shown.len() < other.len() { "..." } else { "" };
                compiled.rules = Err(unsupported(
                    &format!("metadata.annotations[{REQUEST_TRAILERS_ANNOTATION}]"),
                    format!("{shown:?}{cut} is neither \"forward\" nor \"drop\""),
                ));
            }
        }
    }
}

/// An `UnsupportedValue` problem naming `field`.
pub fn unsupported(field: &str, what: impl std::fmt::Display) -> Problem {
    Problem::new(reason::UNSUPPORTED_VALUE, format!("{field}: {what}"))
}

/// Compiles the rules of `route`.
pub fn compile_route(route: &HttpRoute, resolver: &mut Resolver<'_, '_>) -> CompiledRoute {
    let ns = ns_of(&route.metadata);
    // The CRD defaults an absent `rules` to one rule matching every path (no backends: 500);
    // files read by `tollgate run` never went through that defaulting, so apply it here.
    let default_rules = [HttpRouteRules::default()];
    let rules_spec = route.spec.rules.as_deref().unwrap_or(&default_rules);
    let mut compiled = collect_rules(
        route.spec.hostnames.as_deref().unwrap_or_default(),
        rules_spec,
        |i, rule, unresolved| compile_rule(i, rule, ns, resolver, unresolved),
    );
    read_request_trailers(&route.metadata, &mut compiled);
    compiled
}

/// Checks a route's hostnames and compiles each rule with `each` (index, rule, where to record
/// unresolved backends); the first problem rejects the route.
pub fn collect_rules<R>(
    hostnames: &[String],
    rules_spec: &[R],
    mut each: impl FnMut(usize, &R, &mut Vec<Problem>) -> Result<CompiledRule, Problem>,
) -> CompiledRoute {
    let mut unresolved = Vec::new();
    let mut rules = Vec::new();
    let mut first_err = check_hostnames(hostnames).err();
    for (i, rule) in rules_spec.iter().enumerate() {
        match each(i, rule, &mut unresolved) {
            Ok(r) => rules.push(r),
            Err(p) => {
                first_err.get_or_insert(p);
            }
        }
    }
    CompiledRoute {
        rules: match first_err {
            Some(p) => Err(p),
            None => Ok(rules),
        },
        unresolved,
        request_trailers: false,
    }
}

/// Route hostnames: RFC 1123 names, optionally with a leading `*.` label; no IPs.
fn check_hostnames(hostnames: &[String]) -> Result<(), Problem> {
    for (i, h) in hostnames.iter().enumerate() {
        let name = h.strip_prefix("*.").unwrap_or(h);
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        let is_ip = name.parse::<std::net::IpAddr>().is_ok();
        if h.len() > 253 || is_ip || !name.split('.').all(label_ok) {
            return Err(unsupported(
                &format!("spec.hostnames[{i}]"),
                format!("{h:?} is not a valid hostname"),
            ));
        }
    }
    Ok(())
}

fn compile_rule(
    i: usize,
    rule: &HttpRouteRules,
    ns: &str,
    resolver: &mut Resolver<'_, '_>,
    unresolved: &mut Vec<Problem>,
) -> Result<CompiledRule, Problem> {
    let field = format!("spec.rules[{i}]");
    let matches: Vec<RouteMatch> = match rule.matches.as_deref() {
        None | Some([]) => vec![default_match()],
        Some(ms) => ms
            .iter()
            .enumerate()
            .map(|(j, m)| convert_match(m, &format!("{field}.matches[{j}]")))
            .collect::<Result<_, _>>()?,
    };
    let specificity = matches.iter().map(Specificity::http).collect();
    let input = RuleInput {
        index: i,
        rule,
        matches,
        specificity,
        kind: RouteKind::Http,
        ns,
    };
    compile_actions(input, resolver, unresolved)
}

/// A rule whose matches are compiled, ready for [`compile_actions`].
#[derive(Debug)]
pub struct RuleInput<'r> {
    /// Index in `spec.rules`.
    pub index: usize,
    /// The rule in HTTPRoute form: its `matches` are ignored (given compiled below).
    pub rule: &'r HttpRouteRules,
    /// Compiled matches (at least one).
    pub matches: Vec<RouteMatch>,
    /// Their specificity, parallel to `matches`.
    pub specificity: Vec<Specificity>,
    /// Kind of the route holding the rule (backend protocol, ReferenceGrant `from`).
    pub kind: RouteKind,
    /// Namespace of the route.
    pub ns: &'r str,
}

/// Compiles what a rule does once matched: timeouts, filters and weighted backends.
pub fn compile_actions(
    input: RuleInput<'_>,
    resolver: &mut Resolver<'_, '_>,
    unresolved: &mut Vec<Problem>,
) -> Result<CompiledRule, Problem> {
    let RuleInput {
        index: i,
        rule,
        matches,
        specificity,
        kind,
        ns,
    } = input;
    let field = format!("spec.rules[{i}]");
    let all_prefix = matches
        .iter()
        .all(|m| matches!(m.path, PathMatch::PathPrefix(_)));
    let timeouts = timeouts(rule.timeouts.as_ref(), &format!("{field}.timeouts"))?;
    let retry = retry(rule.retry.as_ref(), &format!("{field}.retry"))?;
    let session = super::session::compile(
        rule.session_persistence.as_ref(),
        &format!("{field}.sessionPersistence"),
    )?;
    let mut ctx = FilterCtx {
        resolver,
        route_ns: ns,
        kind,
        all_prefix,
        unresolved,
    };
    let filters = filters::convert_all(
        rule.filters.as_deref().unwrap_or_default(),
        &format!("{field}.filters"),
        &mut ctx,
    )?;
    let mut backends = Vec::new();
    for (j, b) in rule.backend_refs.iter().flatten().enumerate() {
        let bfield = format!("{field}.backendRefs[{j}]");
        let weight = u32::try_from(b.weight.unwrap_or(1))
            .map_err(|_| unsupported(&bfield, "weight must not be negative"))?;
        let bfilters = filters::convert_backend_filters(
            b.filters.as_deref().unwrap_or_default(),
            &format!("{bfield}.filters"),
            &mut ctx,
        )?;
        let spec = RefSpec {
            group: b.group.as_deref(),
            kind: b.kind.as_deref(),
            name: &b.name,
            namespace: b.namespace.as_deref(),
            port: b.port,
        };
        let backend = ctx.resolve_backend(&spec, &bfield);
        backends.push(WeightedBackend {
            backend,
            weight,
            filters: bfilters,
        });
    }
    Ok(CompiledRule {
        index: u32::try_from(i).unwrap_or(u32::MAX),
        name: rule.name.clone(),
        matches,
        specificity,
        filters,
        backends,
        timeouts,
        retry,
        session,
    })
}

/// The match of a rule that lists none: every path.
fn default_match() -> RouteMatch {
    RouteMatch {
        path: PathMatch::PathPrefix("/".to_owned()),
        method: None,
        headers: Vec::new(),
        query_params: Vec::new(),
    }
}

/// Checks an anchored regular expression.
pub fn check_regex(pattern: &str, field: &str) -> Result<(), Problem> {
    regex::Regex::new(&format!("^(?:{pattern})$"))
        .map(|_| ())
        .map_err(|e| {
            unsupported(
                field,
                format!("invalid regular expression {pattern:?}: {e}"),
            )
        })
}

/// Checks a path for an Exact or PathPrefix match.
pub fn check_path(value: &str, field: &str) -> Result<(), Problem> {
    if !value.starts_with('/') {
        return Err(unsupported(
            field,
            format!("path {value:?} must start with '/'"),
        ));
    }
    for bad in ["//", "/./", "/../", "%2f", "%2F", "#"] {
        if value.contains(bad) {
            return Err(unsupported(
                field,
                format!("path {value:?} must not contain {bad:?}"),
            ));
        }
    }
    if value.ends_with("/..") || value.ends_with("/.") {
        return Err(unsupported(
            field,
            format!("path {value:?} must not end in a dot segment"),
        ));
    }
    Ok(())
}

fn convert_match(m: &HttpRouteRulesMatches, field: &str) -> Result<RouteMatch, Problem> {
    let pfield = format!("{field}.path");
    let (ty, value) = match &m.path {
        None => (HttpRouteRulesMatchesPathType::PathPrefix, "/"),
        Some(p) => (
            p.r#type
                .clone()
                .unwrap_or(HttpRouteRulesMatchesPathType::PathPrefix),
            p.value.as_deref().unwrap_or("/"),
        ),
    };
    let path = match ty {
        HttpRouteRulesMatchesPathType::Exact => {
            check_path(value, &pfield)?;
            PathMatch::Exact(value.to_owned())
        }
        HttpRouteRulesMatchesPathType::PathPrefix => {
            check_path(value, &pfield)?;
            let trimmed = value.trim_end_matches('/');
            PathMatch::PathPrefix(if trimmed.is_empty() { "/" } else { trimmed }.to_owned())
        }
        HttpRouteRulesMatchesPathType::RegularExpression => {
            check_regex(value, &pfield)?;
            PathMatch::RegularExpression(value.to_owned())
        }
    };
    let headers = header_matches(
        m.headers.iter().flatten().map(|h| {
            let regex = h.r#type == Some(HttpRouteRulesMatchesHeadersType::RegularExpression);
            (h.name.as_str(), regex, h.value.as_str())
        }),
        field,
    )?;
    let mut query_params = Vec::new();
    let mut seen = BTreeSet::new();
    for (k, q) in m.query_params.iter().flatten().enumerate() {
        let qfield = format!("{field}.queryParams[{k}]");
        if q.name.is_empty() {
            return Err(unsupported(&qfield, "name is empty"));
        }
        let value = match q.r#type {
            Some(HttpRouteRulesMatchesQueryParamsType::RegularExpression) => {
                check_regex(&q.value, &qfield)?;
                StringMatch::RegularExpression(q.value.clone())
            }
            _ => StringMatch::Exact(q.value.clone()),
        };
        if seen.insert(q.name.clone()) {
            query_params.push(HeaderMatch {
                name: q.name.clone(),
                value,
            });
        }
    }
    Ok(RouteMatch {
        path,
        method: m.method.as_ref().map(|x| method(x).to_owned()),
        headers,
        query_params,
    })
}

/// Header matches from `(name, is_regex, value)`: names lower-cased and checked, regexes
/// checked, a repeated name keeps the first (both route kinds' specs say so).
pub fn header_matches<'h>(
    headers: impl Iterator<Item = (&'h str, bool, &'h str)>,
    field: &str,
) -> Result<Vec<HeaderMatch>, Problem> {
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for (k, (name, regex, value)) in headers.enumerate() {
        let hfield = format!("{field}.headers[{k}]");
        let name = name.trim().to_ascii_lowercase();
        if !filters::is_header_name(&name) {
            return Err(unsupported(
                &hfield,
                format!("{name:?} is not a valid header name"),
            ));
        }
        let value = if regex {
            check_regex(value, &hfield)?;
            StringMatch::RegularExpression(value.to_owned())
        } else {
            StringMatch::Exact(value.to_owned())
        };
        if seen.insert(name.clone()) {
            out.push(HeaderMatch { name, value });
        }
    }
    Ok(out)
}

fn method(m: &HttpRouteRulesMatchesMethod) -> &'static str {
    use HttpRouteRulesMatchesMethod as M;
    match m {
        M::Get => "GET",
        M::Head => "HEAD",
        M::Post => "POST",
        M::Put => "PUT",
        M::Delete => "DELETE",
        M::Connect => "CONNECT",
        M::Options => "OPTIONS",
        M::Trace => "TRACE",
        M::Patch => "PATCH",
    }
}

/// Parses a Gateway API duration (`10s`, `500ms`, `1h2m`) to milliseconds; `0s` = none.
pub fn parse_duration_ms(s: &str) -> Result<Option<u64>, String> {
    let d: Duration = s.parse()?;
    let ms = u64::try_from(d.as_millis()).map_err(|e| e.to_string())?;
    Ok((ms != 0).then_some(ms))
}

fn timeouts(t: Option<&HttpRouteRulesTimeouts>, field: &str) -> Result<Timeouts, Problem> {
    let Some(t) = t else {
        return Ok(Timeouts::default());
    };
    let parse = |v: Option<&String>, name: &str| -> Result<Option<u64>, Problem> {
        match v {
            None => Ok(None),
            Some(s) => parse_duration_ms(s)
                .map_err(|e| unsupported(&format!("{field}.{name}"), format!("{s:?}: {e}"))),
        }
    };
    let request_ms = parse(t.request.as_ref(), "request")?;
    let backend_request_ms = parse(t.backend_request.as_ref(), "backendRequest")?;
    if let (Some(req), Some(be)) = (request_ms, backend_request_ms)
        && be > req
    {
        return Err(unsupported(
            field,
            format!("backendRequest ({be}ms) must not exceed request ({req}ms)"),
        ));
    }
    Ok(Timeouts {
        request_ms,
        backend_request_ms,
    })
}

/// Most retries a rule may ask for. The spec sets no maximum and the upstream conformance
/// suite asks for 100 (v1.7's HTTPRouteRetryConnectionError); what keeps a failing backend
/// from a storm is the request timeout, the retry budget and the circuit breaker's
/// `maxRetries`, and that a retry goes to an untried endpoint first.
pub const MAX_RETRY_ATTEMPTS: i64 = 100;
/// Retries when `retry` gives no `attempts` (implementation-specific in the spec).
pub const DEFAULT_RETRY_ATTEMPTS: u32 = 1;
/// Least wait before a retry when `retry` gives no `backoff`.
pub const DEFAULT_RETRY_BACKOFF_MS: u64 = 25;

/// Compiles `rules[].retry`: `attempts` 0 means no retry.
fn retry(r: Option<&HttpRouteRulesRetry>, field: &str) -> Result<Option<Retry>, Problem> {
    let Some(r) = r else {
        return Ok(None);
    };
    let attempts = match r.attempts {
        None => DEFAULT_RETRY_ATTEMPTS,
        Some(n @ 0..=MAX_RETRY_ATTEMPTS) => u32::try_from(n).unwrap_or(DEFAULT_RETRY_ATTEMPTS),
        Some(n) => {
            return Err(unsupported(
                &format!("{field}.attempts"),
                format!("{n}: must be between 0 and {MAX_RETRY_ATTEMPTS}"),
            ));
        }
    };
    let backoff_ms = match r.backoff.as_deref() {
        None => DEFAULT_RETRY_BACKOFF_MS,
        Some(s) => parse_duration_ms(s)
            .map_err(|e| unsupported(&format!("{field}.backoff"), format!("{s:?}: {e}")))?
            .unwrap_or(0),
    };
    let mut codes = Vec::new();
    for (i, &c) in r.codes.iter().flatten().enumerate() {
        match u16::try_from(c) {
            Ok(c @ 400..=599) => codes.push(c),
            _ => {
                return Err(unsupported(
                    &format!("{field}.codes[{i}]"),
                    format!("{c}: must be between 400 and 599"),
                ));
            }
        }
    }
    codes.sort_unstable();
    codes.dedup();
    Ok((attempts > 0).then_some(Retry {
        attempts,
        backoff_ms,
        codes,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ms("10s"), Ok(Some(10_000)));
        assert_eq!(parse_duration_ms("500ms"), Ok(Some(500)));
        assert_eq!(parse_duration_ms("1h2m"), Ok(Some(3_720_000)));
        assert_eq!(parse_duration_ms("0s"), Ok(None));
        assert!(parse_duration_ms("10").is_err());
        assert!(parse_duration_ms("1d").is_err());
    }

    #[test]
    fn paths() {
        assert!(check_path("/a/b", "f").is_ok());
        assert!(check_path("a", "f").is_err());
        assert!(check_path("/a//b", "f").is_err());
        assert!(check_path("/a/..", "f").is_err());
    }
}
